"""Benchmarks (commands that print and write figures; never timed tests): ``mrtpo bench <name>``."""

from __future__ import annotations

import importlib
import sys

BENCHMARKS: dict[str, str] = {"relevance": "mrtpo.bench.relevance", "cost": "mrtpo.bench.cost",
                              "learn": "mrtpo.bench.learn"}


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in BENCHMARKS:
        print(f"usage: mrtpo bench {{{','.join(BENCHMARKS)}}} [options]", file=sys.stderr)
        return 2
    return int(importlib.import_module(BENCHMARKS[argv[0]]).main(argv[1:]) or 0)
