"""Benchmarks (commands that print and write figures; never timed tests): ``mrtpo bench <name>``."""

from __future__ import annotations

import importlib
import json
import sys
import time
from pathlib import Path
from typing import Any

from mrtpo.machine import machine_info

BENCHMARKS: dict[str, str] = {"relevance": "mrtpo.bench.relevance", "cost": "mrtpo.bench.cost",
                              "learn": "mrtpo.bench.learn", "lift": "mrtpo.bench.lift", "gym": "mrtpo.bench.gym"}


def add_sampling_arguments(parser, *, prompts: int, max_new_tokens: int | None, methods: str, dtype: str) -> None:
    """The options of a benchmark that samples groups from one policy (``bench cost``, ``bench lift``):
    ``--model --prompts --group-size --max-new-tokens --methods --dtype --seed``."""
    parser.add_argument("--model", default="qwen2.5-coder-0.5b", help="preset, local dir, .gguf or hub id")
    parser.add_argument("--prompts", type=int, default=prompts, help="prompts, one group of completions each")
    parser.add_argument("--group-size", type=int, default=4, help="completions per prompt")
    parser.add_argument("--max-new-tokens", type=int, default=max_new_tokens,
                        help="completion length cap" + ("" if max_new_tokens else " (default: per task)"))
    parser.add_argument("--methods", default=methods, help="comma-separated credit methods")
    parser.add_argument("--dtype", default=dtype, choices=["float32", "bfloat16"], help="policy dtype")
    parser.add_argument("--seed", type=int, default=0, help="sampling seed")


def write_record(out: Path, benchmark: str, command: str, rows: list[dict], **extra: Any) -> dict:
    """Write a benchmark's JSON record (what, when, where, the command, the rows) and say where."""
    record = {"benchmark": benchmark, "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "machine": machine_info(),
              "command": command, **extra, "rows": rows}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=2))
    print(f"\nwrote {out}")
    return record


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in BENCHMARKS:
        print(f"usage: mrtpo bench {{{','.join(BENCHMARKS)}}} [options]", file=sys.stderr)
        return 2
    return int(importlib.import_module(BENCHMARKS[argv[0]]).main(argv[1:]) or 0)
