"""``mrtpo eval``'s result files: ``results.json`` (run metadata and the task's metrics),
``results.md`` (the headline metrics and one table per breakdown) and ``outputs.jsonl``.
:mod:`mrtpo.evaluate` re-exports :func:`render_markdown`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

__all__ = ["render_markdown", "write_results"]


def _fmt(value: Any) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.4f}"
    if value is None:
        return "–"
    return str(value).replace("|", "\\|").replace("\n", " ")


def _is_table(value: Any) -> bool:
    """A dict of dicts of scalars: rendered as one table (rows = keys)."""
    return (
        isinstance(value, dict)
        and bool(value)
        and all(
            isinstance(row, dict) and all(not isinstance(v, (dict, list)) for v in row.values())
            for row in value.values()
        )
    )


def render_markdown(metrics: dict[str, Any], run: dict[str, Any]) -> str:
    """Readable report: run header, the scalar metrics, then one table per breakdown
    (per category / database / instruction); per-item lists stay in results.json."""
    gen = run.get("generation", {})
    model = run.get("model", {})
    lines = [
        f"# mrtpo eval: {run.get('task')} / {run.get('split')}",
        "",
        f"- model: `{model.get('spec')}` ({model.get('kind')}, {model.get('dtype')}, {model.get('device')})",
        f"- examples: {run.get('n_examples')} (limit {run.get('limit')})",
        (
            f"- generation: greedy, batch {gen.get('batch_size')}, max_new_tokens "
            f"{gen.get('max_new_tokens')}, {gen.get('new_tokens')} new tokens, "
            f"{_fmt(gen.get('tokens_per_s'))} tok/s, {gen.get('truncated')} cut at max_new_tokens"
        ),
        f"- elapsed: {_fmt(run.get('elapsed_s'))} s (generation {_fmt(gen.get('seconds'))} s)",
        f"- date: {run.get('date')}",
        f"- machine: {run.get('machine', {}).get('summary')}",
        f"- command: `{run.get('command')}`",
        "",
        "## Metrics",
        "",
        "| metric | value |",
        "|---|---|",
    ]
    for key, value in metrics.items():
        if not isinstance(value, (dict, list)):
            lines.append(f"| {key} | {_fmt(value)} |")
    for key, value in metrics.items():
        if isinstance(value, dict) and value and all(not isinstance(v, (dict, list)) for v in value.values()):
            lines += ["", f"## {key}", "", "| key | value |", "|---|---|"]
            lines += [f"| {k} | {_fmt(v)} |" for k, v in value.items()]
        elif _is_table(value):
            columns = list(dict.fromkeys(c for row in value.values() for c in row))
            lines += ["", f"## {key}", "", "| " + " | ".join([key, *columns]) + " |"]
            lines.append("|" + "---|" * (len(columns) + 1))
            for name, row in value.items():
                lines.append("| " + " | ".join([_fmt(name), *(_fmt(row.get(c)) for c in columns)]) + " |")
    return "\n".join(lines) + "\n"


def write_results(out: Path, metrics: dict[str, Any], run: dict[str, Any], gens: Iterable[Any]) -> None:
    """Write results.json, results.md and outputs.jsonl into ``out`` (created if needed); ``gens``
    are :class:`mrtpo.evaluate.Generation` s (one ``record()`` line each in outputs.jsonl)."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps({"run": run, "metrics": metrics}, indent=2, default=str) + "\n")
    (out / "results.md").write_text(render_markdown(metrics, run))
    with open(out / "outputs.jsonl", "w") as f:
        f.writelines(json.dumps(g.record(), ensure_ascii=False) + "\n" for g in gens)
