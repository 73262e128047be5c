"""Held-out scoring: Spider execution accuracy per database and overall, plus executable rate.

``execution_accuracy`` is the share of questions whose extracted SQL gives the gold result
(:mod:`.compare`); ``executable_rate`` the share whose SQL runs without error; ``format_rate``
the share with exactly one closed ```sql block. Questions whose gold query fails (none on the
972 usable Spider dev questions) are counted under ``gold_failures`` and left out of the rates.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import Any

from mrtpo.tasks.sql.parse import extract_sql, format_ok
from mrtpo.tasks.sql.verifiers import ExecutionCache, ResultVerifier
from mrtpo.verifiers import Example


def _rate(num: int, den: int) -> float:
    return num / den if den else 0.0


def evaluate(
    outputs: list[str],
    examples: list[Example],
    cache: ExecutionCache | None = None,
    include_examples: bool = True,
) -> dict[str, Any]:
    """Score ``outputs[i]`` against ``examples[i]``; returns a JSON-serialisable dict."""
    if len(outputs) != len(examples):
        raise ValueError(f"got {len(outputs)} outputs for {len(examples)} examples; they must pair up one to one")
    cache = cache or ExecutionCache()
    result_v = ResultVerifier(cache)
    per_db: dict[str, Counter[str]] = defaultdict(Counter)
    errors: Counter[str] = Counter()
    rows: list[dict[str, Any]] = []
    total: Counter[str] = Counter()
    for out, ex in zip(outputs, examples):
        db = ex.gold["db_id"]
        text = out if isinstance(out, str) else ""
        sql = extract_sql(text)
        pred = None if sql is None else cache.run(ex.gold["db_path"], sql)
        score = result_v.score(pred, ex)
        fmt = format_ok(text)
        if score is None:
            total["gold_failures"] += 1
            per_db[db]["gold_failures"] += 1
            continue
        executes = pred is not None and pred.ok
        error = "no_sql" if pred is None else (pred.error.kind.value if pred.error else None)
        if error:
            errors[error] += 1
        for c in (total, per_db[db]):
            c["n"] += 1
            c["correct"] += int(score == 1.0)
            c["executable"] += int(executes)
            c["format"] += int(fmt)
        if include_examples:
            rows.append(
                {
                    "id": ex.id,
                    "db_id": db,
                    "correct": score == 1.0,
                    "executes": executes,
                    "format": fmt,
                    "error": error,
                    "sql": sql,
                }
            )
    report: dict[str, Any] = {
        "n": total["n"],
        "execution_accuracy": _rate(total["correct"], total["n"]),
        "executable_rate": _rate(total["executable"], total["n"]),
        "format_rate": _rate(total["format"], total["n"]),
        "correct": total["correct"],
        "gold_failures": total["gold_failures"],
        "errors": dict(sorted(errors.items())),
        "per_db": {
            db: {
                "n": c["n"],
                "correct": c["correct"],
                "execution_accuracy": _rate(c["correct"], c["n"]),
                "executable_rate": _rate(c["executable"], c["n"]),
            }
            for db, c in sorted(per_db.items())
        },
    }
    if include_examples:
        report["examples"] = rows
    return report


__all__ = ["evaluate"]
