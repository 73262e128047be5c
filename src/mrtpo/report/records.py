"""The lines of a run's ``metrics.jsonl`` and the per-step series the report draws from them.

Kept apart from the figures so the panels' modules (:mod:`mrtpo.report.diagnostics`, the samples)
read the logs without importing the plotting code that draws them.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = ["Records", "json_lines", "load_metrics", "reward_names", "series", "step_records", "torn_last_line"]

Records = Sequence[Mapping[str, Any]]


def load_metrics(path: str | os.PathLike) -> list[dict[str, Any]]:
    """All JSON lines of a ``metrics.jsonl`` (a run folder is accepted too)."""
    path = Path(path)
    if path.is_dir():
        path = path / "metrics.jsonl"
    if not path.is_file():
        raise FileNotFoundError(f"no metrics file at {path} (a run writes <output_dir>/metrics.jsonl)")
    return json_lines(path)


def json_lines(path: Path) -> list[dict[str, Any]]:
    """The JSON lines of ``path``, leaving out a torn last one (no newline, not JSON: a write cut short by a
    crash, which ``--resume`` drops too; :func:`torn_last_line` tells); a bad line elsewhere is a ValueError."""
    text = path.read_text()
    lines = text.splitlines()
    if torn_last_line(text):
        lines = lines[:-1]
    out = []
    for number, line in enumerate(lines, 1):
        if line.strip():
            try:
                out.append(json.loads(line))
            except ValueError:
                raise ValueError(f"{path.name} line {number} is not JSON: {line[:60]!r}") from None
    return out


def torn_last_line(text: str) -> bool:
    """Whether ``text`` ends in a line cut short: no newline after it, and not JSON."""
    if not text or text.endswith("\n"):
        return False
    try:
        json.loads(text.rsplit("\n", 1)[-1])
    except ValueError:
        return True
    return False


def step_records(records: Records) -> list[Mapping[str, Any]]:
    """The per-step training lines: those with a loss or rewards, not the end-of-training summary
    nor evaluation lines; the last line wins if a step was logged twice."""
    by_step: dict[int, Mapping[str, Any]] = {}
    for r in records:
        if "train_runtime" in r or any(k.startswith("eval_") for k in r):
            continue
        if "loss" in r or "reward" in r:
            by_step[int(r.get("step", 0))] = r
    return [by_step[s] for s in sorted(by_step)]


def reward_names(records: Records) -> list[str]:
    """Reward names in the order they first appear (``rewards/<name>/mean`` keys)."""
    names: list[str] = []
    for r in records:
        for key in r:
            if key.startswith("rewards/") and key.endswith("/mean"):
                name = key[len("rewards/") : -len("/mean")]
                if name not in names:
                    names.append(name)
    return names


def series(records: Records, key: str) -> tuple[list[int], list[float]]:
    """``(steps, values)`` of ``key`` over the step records where it is a finite number."""
    steps, values = [], []
    for r in step_records(records):
        v = r.get(key)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
            steps.append(int(r["step"]))
            values.append(float(v))
    return steps, values
