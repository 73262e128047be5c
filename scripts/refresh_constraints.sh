#!/usr/bin/env bash
# Rewrite requirements/constraints.txt from the project venv: the exact version of every installed
# package (mrtpo itself left out). Run it after the test suite passes on a changed environment, and
# commit the file with the change; scripts/setup.sh installs under these constraints.
# Usage: bash scripts/refresh_constraints.sh        (MRTPO_VENV overrides the venv folder, default .venv)
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${MRTPO_VENV:-.venv}/bin/python"
OUT=requirements/constraints.txt
{
    echo "# The exact versions the test suite passed on (pip constraints: they pin a package only if it is"
    echo "# installed at all). Written by scripts/refresh_constraints.sh from '$("$PY" --version 2>&1)' on $(uname -m);"
    echo "# used by scripts/setup.sh. Do not edit by hand: refresh it."
    "$PY" -m pip freeze --exclude-editable --disable-pip-version-check 2>/dev/null \
        | grep -Ev '^(#|-e |mrtpo([= @]|$))' | LC_ALL=C sort -f
} > "$OUT.tmp"
mv "$OUT.tmp" "$OUT"
echo "[constraints] wrote $OUT ($(grep -cv '^#' "$OUT") packages)"
