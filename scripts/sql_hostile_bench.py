#!/usr/bin/env python
"""Time the SQL sandbox on hostile single-call statements and on Spider's gold queries.

Hostile: each statement the tests assert on (``HOSTILE_SINGLE_CALLS`` in
``tests/test_sql_sandbox.py``), run once on world_1 with the default limits (2 s deadline)
through ``sandbox.execute``; prints its time and error kind, then the slowest. Normal: the 972
gold queries (train + eval) through ``execute`` (a pooled worker process) and through
``run_statement`` in this process (layers 2-4 alone, as ``execute`` ran before the worker),
mean milliseconds per query. Not a test: the figures depend on the machine.

    OMP_NUM_THREADS=1 .venv/bin/python scripts/sql_hostile_bench.py
"""

from __future__ import annotations

import importlib.util
import os
import platform
import time
from pathlib import Path

from mrtpo.tasks.sql.loader import db_path, find_spider_dir, load_items
from mrtpo.tasks.sql.sandbox import DEFAULT_LIMITS, execute, run_statement

ROOT = Path(__file__).resolve().parents[1]


def hostile_statements() -> list[tuple[str, object]]:
    """The tests' list of hostile single-call statements and their expected error kinds."""
    spec = importlib.util.spec_from_file_location("test_sql_sandbox", ROOT / "tests" / "test_sql_sandbox.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.HOSTILE_SINGLE_CALLS


def cpu_name() -> str:
    """The CPU's model name from /proc/cpuinfo (what ``lscpu`` shows), else the platform's."""
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def time_hostile(world: Path) -> list[tuple[float, str, str]]:
    """``(seconds, error kind, sql)`` for each hostile statement, slowest first."""
    rows = []
    for sql, _ in hostile_statements():
        t0 = time.monotonic()
        r = execute(world, sql)
        rows.append((time.monotonic() - t0, r.error.kind.value if r.error else "ok", sql))
    return sorted(rows, reverse=True)


def time_gold() -> dict[str, float]:
    """Mean milliseconds per gold query: pooled ``execute`` and in-process ``run_statement``."""
    items = load_items("train") + load_items("eval")
    execute(items[0].db_path, "SELECT 1")  # start a worker outside the timing
    out = {}
    for name, run in (
        ("in-process", lambda it: run_statement(os.path.abspath(it.db_path), it.query, DEFAULT_LIMITS, 2.0)),
        ("pooled", lambda it: execute(it.db_path, it.query)),
    ):
        t0 = time.perf_counter()
        for item in items:
            assert run(item).ok, item.index
        out[name] = (time.perf_counter() - t0) / len(items) * 1e3
    return out


def main() -> None:
    print(f"CPU: {cpu_name()} ({os.cpu_count()} cores visible), Python {platform.python_version()}")
    rows = time_hostile(db_path(find_spider_dir(), "world_1"))
    for seconds, kind, sql in rows:
        print(f"{seconds:7.3f} s  {kind:10s} {sql[:100]}")
    print(f"slowest hostile statement: {rows[0][0]:.3f} s ({len(rows)} statements, 2 s deadline)")
    gold = time_gold()
    print(", ".join(f"{k}: {v:.3f} ms/query" for k, v in gold.items()) + " (972 gold queries)")


if __name__ == "__main__":
    main()
