"""Two `mrtpo bench learn` outputs compared run by run: B − A per (method, seed), with a 95 % t-interval.

For a change that must not change learning (e.g. a faster step): run the same benchmark before
(A) and after (B) it, then

    .venv/bin/python scripts/paired_runs.py runs/before runs/after [--out docs/results/x.json]

prints, per method, the paired difference of the final training reward (the benchmark's tail mean),
the held-out total reward at the end and the training seconds.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from mrtpo.bench.learn.stats import paired_comparison

MEASURES = {
    "final reward": lambda run: run["final"].get("reward"),
    "held-out reward": lambda run: run["heldout"].get("reward_total", {}).get("end"),
    "train seconds": lambda run: run.get("train_s"),
}


def _runs(folder: Path) -> dict[tuple[str, int], dict]:
    data = json.loads((folder / "comparison.json").read_text())
    return {(run["method"], run["seed"]): run for run in data["runs"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("a", type=Path, help="bench learn output folder A (reference)")
    parser.add_argument("b", type=Path, help="bench learn output folder B")
    parser.add_argument("--out", type=Path, help="also write the table as JSON")
    args = parser.parse_args()
    a, b = _runs(args.a), _runs(args.b)
    rows = []
    for method in sorted({m for m, _ in a} & {m for m, _ in b}):
        for name, read in MEASURES.items():
            va = {s: read(run) for (m, s), run in a.items() if m == method}
            vb = {s: read(run) for (m, s), run in b.items() if m == method}
            stats = paired_comparison(vb, va)
            mean_a = sum(va[s] for s in va if s in vb) / max(stats["n"], 1)
            rows.append({"method": method, "measure": name, "a_mean": mean_a, **stats})
            lo, hi = stats["ci95"] if stats["ci95"] else (float("nan"), float("nan"))
            print(
                f"{method:<8} {name:<16} A {mean_a:7.3f}  "
                f"B - A {stats['mean_difference']:+.3f} [{lo:+.3f}, {hi:+.3f}]"
                f"  n={stats['n']}  p={stats['p_value'] if stats['p_value'] is None else round(stats['p_value'], 3)}"
            )
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"a": str(args.a), "b": str(args.b), "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
