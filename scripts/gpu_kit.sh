#!/usr/bin/env bash
# Pack what `scripts/gpu_check.sh` needs on a GPU machine that has torch (CUDA) but no hub, no
# package index and no model: the ignored folder .gpu/ (about 35 MB), carried along with the tree.
#
#   bash scripts/gpu_kit.sh          # here, with the package index and the default model cached
#
#   .gpu/whl/     the pure-Python wheels of the versions the suite runs on (transformers, TRL, ...),
#                 installed there by gpu_check.sh into a private folder when the machine's own differ
#   .gpu/tok/     the real tokenizer (tokenizer.json, tokenizer_config.json, chat_template.jinja)
#   .gpu/spider/  Spider (the sql task's data, 5 MB) when ../shared/data/spider is here
#
# Then, on the GPU machine:  bash scripts/gpu_check.sh --out "$OUT" --models /tmp/mrtpo-models
# (with the device tool: carry [".gpu"]). See docs/scaling.md.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PIP=${PIP:-.venv/bin/pip}
KIT=.gpu
# The versions the suite runs on (pyproject pins transformers and TRL minors) and the small pure-Python
# packages a bare torch image lacks for them; multiprocess ships one wheel per Python minor.
WHEELS="transformers==5.25.0 trl==1.16.0 accelerate==1.16.0 peft==0.21.2 datasets==5.2.0 dill==0.4.1 gguf==0.19.0
huggingface_hub==2.4.0 httpx2==2.16.2 httpcore2==2.16.2 truststore==0.10.5"
mkdir -p "$KIT/whl" "$KIT/tok"
# shellcheck disable=SC2086
"$PIP" download -q -d "$KIT/whl" --no-deps --only-binary=:all: $WHEELS
for py in 3.10 3.11 3.12 3.13; do
  "$PIP" download -q -d "$KIT/whl" --no-deps --only-binary=:all: --python-version "$py" multiprocess==0.70.19
done
echo "$WHEELS multiprocess==0.70.19" | tr ' ' '\n' > "$KIT/whl/requirements.txt"  # what gpu_check.sh installs
TOKENIZER=${MRTPO_TOKENIZER:-$(ls -d "$HOME"/.cache/mrtpo/models/qwen2.5-coder-0.5b-*/ 2>/dev/null | head -1)}
for f in tokenizer.json tokenizer_config.json chat_template.jinja; do
  [ -f "$TOKENIZER/$f" ] || { echo "no $f in '$TOKENIZER': run 'mrtpo demo' once (it caches the default model) or set MRTPO_TOKENIZER" >&2; exit 2; }
  cp "$TOKENIZER/$f" "$KIT/tok/"
done
SPIDER=${MRTPO_SPIDER_DIR:-../shared/data/spider}
if [ -d "$SPIDER" ]; then
  rm -rf "$KIT/spider" && cp -r "$SPIDER" "$KIT/spider"
else
  echo "note: no Spider folder at $SPIDER: gpu_check.sh will need MRTPO_SPIDER_DIR on the GPU machine" >&2
fi
du -sh "$KIT"/*; du -sh "$KIT"
