#!/usr/bin/env bash
# GPU check: per-phase step time and peak memory of gdpo and mrtpo on random-initialised models of
# the presets' shapes (q05 = the default model, q15 = Qwen2.5-1.5B) with the real tokenizer; no
# weights, no hub. About 5-8 minutes on one H200. See docs/scaling.md.
#
#   bash scripts/gpu_check.sh                              # both shapes, 4 steps each, 4 prompts x 8 x 128 tokens
#   bash scripts/gpu_check.sh --shapes q05 --steps 3       # any `mrtpo bench gpu` option
#   bash scripts/gpu_check.sh --shapes tiny use_cpu=true bf16=false   # CPU dry run of the same path
#   bash scripts/gpu_check.sh --verdict --commit            # the real-model verdict's runs on this GPU
#                                                           # (scripts/real_verdict.py run --machine gpu ...)
#
# PYTHON (default: .venv/bin/python if present, else python3) runs mrtpo; MRTPO_TOKENIZER or
# --tokenizer DIR points at the tokenizer files when the default model is not cached here.
# On a machine with torch but without this project's packages, `bash scripts/gpu_kit.sh` run
# beforehand (where the package index is) packs them into .gpu/: this script then installs the
# kit's wheels into a private folder (MRTPO_GPU_SITE, default /tmp/mrtpo-site) when the Python here
# lacks transformers 5.25 / TRL 1.16 (MRTPO_GPU_INSTALL=1: always), and reads the tokenizer from
# .gpu/tok and Spider from .gpu/spider unless MRTPO_TOKENIZER / MRTPO_SPIDER_DIR say otherwise.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# transformers 5.25 turns hub kernels on for CUDA and fails to load a model without the `kernels`
# package (and would fetch kernels from the hub with it): load plainly, and never reach the hub.
export USE_HUB_KERNELS=NO HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
if [ -z "${PYTHON:-}" ]; then
  if [ -x .venv/bin/python ]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
fi
KIT=$PWD/.gpu
if [ -z "${MRTPO_TOKENIZER:-}" ] && [ -f "$KIT/tok/tokenizer.json" ]; then export MRTPO_TOKENIZER=$KIT/tok; fi
if [ -z "${MRTPO_SPIDER_DIR:-}" ] && [ ! -d ../shared/data/spider ] && [ -d "$KIT/spider" ]; then
  export MRTPO_SPIDER_DIR=$KIT/spider
fi
pinned='import sys, transformers, trl; sys.exit(not (transformers.__version__.startswith("5.25.") and trl.__version__.startswith("1.16.")))'
if [ -f "$KIT/whl/requirements.txt" ] && { [ "${MRTPO_GPU_INSTALL:-0}" = 1 ] || ! "$PYTHON" -c "$pinned" 2>/dev/null; }; then
  SITE=${MRTPO_GPU_SITE:-/tmp/mrtpo-site}
  echo "gpu_check: installing the kit's wheels into $SITE" >&2
  "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --upgrade --target "$SITE" --find-links "$KIT/whl" \
    -r "$KIT/whl/requirements.txt"
  export PYTHONPATH=$SITE${PYTHONPATH:+:$PYTHONPATH}
fi
if [ "${1:-}" = "--verdict" ]; then  # configs/real-verdict-gpu.yaml, every run not yet in docs/results/real-verdict/gpu
  shift
  PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" exec "$PYTHON" scripts/real_verdict.py run --machine gpu "$@"
fi
PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" exec "$PYTHON" -m mrtpo.cli bench gpu "$@"
