#!/usr/bin/env bash
# The test suite against the previous TRL minor (issue 40): installs trl==$TRL_PREVIOUS (default 1.15.0)
# without its dependencies into .trl-previous/ (the same transformers, peft and accelerate as the pinned
# setup), puts it ahead of the venv's TRL on PYTHONPATH, checks that it is the TRL imported, and runs
# pytest on the given test files (default: the whole default suite).
#   bash scripts/trl_minor_check.sh                       # every test
#   bash scripts/trl_minor_check.sh tests/test_trainer.py # some
set -euo pipefail
cd "$(dirname "$0")/.."
TRL_PREVIOUS="${TRL_PREVIOUS:-1.15.0}"
TARGET=".trl-previous"
if ! PYTHONPATH="$TARGET" .venv/bin/python -c "import trl, sys; sys.exit(trl.__version__ != '$TRL_PREVIOUS')" 2>/dev/null; then
    rm -rf "$TARGET"
    .venv/bin/python -m pip install --quiet --no-deps --target "$TARGET" "trl==$TRL_PREVIOUS"
fi
found=$(PYTHONPATH="$TARGET" .venv/bin/python -c "import trl; print(trl.__version__)")
[ "$found" = "$TRL_PREVIOUS" ] || { echo "[trl-minor] expected trl $TRL_PREVIOUS on the path, found $found"; exit 1; }
echo "[trl-minor] running the tests against trl $found ($TARGET)"
PYTHONPATH="$TARGET" MRTPO_EXPECT_TRL="$TRL_PREVIOUS" .venv/bin/python -m pytest -q -p no:cacheprovider "$@"
