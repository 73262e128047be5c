"""A task file's local data files checked before ``datasets`` reads them, so a file it would reject (empty,
a malformed line, another format under a ``.jsonl`` name) is one line naming the file and the line, not
a traceback of the ``datasets`` builder. The check reads a file one line at a time (a large file is
streamed, not held in memory); ``datasets`` itself still reads what passes.
"""

from __future__ import annotations

import json
from pathlib import Path


class DataFileError(ValueError):
    """A data file ``datasets`` would reject; the message names the file and, where it can, the line."""


def _json_lines_problem(path: Path) -> str | None:
    """The first line of a JSON-lines file that is not a JSON object, or None."""
    with path.open("rb") as f:
        for number, raw in enumerate(f, 1):
            line = raw.strip()
            if not line:
                continue
            try:
                value = json.loads(line)
            except ValueError as exc:
                shown = line[:60].decode(errors="replace")
                return f"line {number} is not JSON ({exc.args[0].split(':')[0]}): {shown!r}"
            if not isinstance(value, dict):
                return (
                    f"line {number} is not a JSON object (one row per line, {{column: value}}), but a "
                    f"{type(value).__name__}"
                )
    return None


def _json_problem(path: Path) -> str | None:
    """A ``.json`` file is one document (a list of rows, or a mapping of columns) or JSON lines."""
    try:
        with path.open("rb") as f:
            json.load(f)
        return None
    except ValueError as whole:
        lines = _json_lines_problem(path)
        if lines is None:
            return None
        return f"is neither one JSON document nor JSON lines ({lines}; as one document: {whole.args[0][:80]})"


def check_data_file(path: Path) -> None:
    """A :class:`DataFileError` for a file ``datasets`` would reject; parquet files are left to it."""
    path = Path(path)
    if _blank(path):
        raise DataFileError(f"dataset file {path} is empty: give it one row per line")
    suffix = path.suffix.lower()
    problem = _json_lines_problem(path) if suffix == ".jsonl" else _json_problem(path) if suffix == ".json" else None
    if problem:
        raise DataFileError(f"dataset file {path} {problem}")


def _blank(path: Path) -> bool:
    """Whether ``path`` holds nothing but whitespace (read in blocks, up to the first that is not)."""
    with path.open("rb") as f:
        return all(not block.strip() for block in iter(lambda: f.read(1 << 20), b""))


__all__ = ["DataFileError", "check_data_file"]
