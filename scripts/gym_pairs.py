"""Any two methods of `mrtpo bench learn --policies` outputs compared pair by pair, with both levels' intervals.

`bench learn` pairs every method with its reference (gdpo). This pairs any two methods of the same
output folder per (policy, seed) and gives the two-level interval of their difference
(:func:`mrtpo.bench.learn.stats.two_level_interval`: Student-t over the policy means, two-stage bootstrap):

    .venv/bin/python scripts/gym_pairs.py runs/tune300/constraints runs/tune300/tradeoff \\
        --pairs contrastive:bounded,bounded:shuffled [--measure final|heldout|equal_time] [--json out.json]

One Markdown row per (folder, pair): mean [t interval]; [bootstrap interval], pairs > 0 of pairs.
`--diagnostics` prints instead, per (folder, method), what the runs logged at every step: the median
gradient norm before clipping, the share of steps whose norm exceeded `max_grad_norm` (clipped), and
the credit weights' mean Gini and share of tokens carrying half the weight (over rewards).
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import yaml

from mrtpo.bench.learn.stats import finite, two_level_interval

MEASURES = {
    "final": lambda run: run["final"].get("reward"),
    "heldout": lambda run: run["heldout"].get("reward_total", {}).get("end"),
    "equal_time": lambda run: (run.get("equal_time") or {}).get("value"),
}


def differences(folder: Path, a: str, b: str, measure: str) -> dict[int, list[float]]:
    """``{policy: [a − b per seed]}`` over the (policy, seed) pairs both methods finished."""
    runs = json.loads((folder / "comparison.json").read_text())["runs"]
    value = {(r["method"], r["policy"], r["seed"]): MEASURES[measure](r) for r in runs}
    out: dict[int, list[float]] = {}
    for (method, policy, seed), x in sorted(value.items(), key=lambda kv: (kv[0][1], kv[0][2])):
        y = value.get((b, policy, seed))
        if method == a and finite(x) and finite(y):
            out.setdefault(policy, []).append(float(x) - float(y))
    return out


def diagnostics(folder: Path) -> dict[str, dict[str, float | None]]:
    """Per method: median grad norm, share of steps clipped, mean Gini and half-weight share."""
    runs = json.loads((folder / "comparison.json").read_text())["runs"]
    steps: dict[str, list[dict]] = {}
    clip: dict[str, float] = {}
    for run in runs:
        run_folder = Path(run["folder"]) if Path(run["folder"]).is_absolute() else folder / Path(run["folder"]).name
        lines = (run_folder / "metrics.jsonl").read_text().splitlines()
        steps.setdefault(run["method"], []).extend(r for r in map(json.loads, lines) if "grad_norm" in r)
        clip[run["method"]] = float(yaml.safe_load((run_folder / "config.yaml").read_text()).get("max_grad_norm", 1.0))

    def mean_of(records: list[dict], suffix: str) -> float | None:
        values = [v for r in records for k, v in r.items() if k.startswith("credit/") and k.endswith(suffix)]
        return sum(values) / len(values) if values else None

    return {
        method: {
            "grad_norm_median": statistics.median(r["grad_norm"] for r in records),
            "clipped": sum(r["grad_norm"] > clip[method] for r in records) / len(records),
            "gini": mean_of(records, "/gini"),
            "half_weight_share": mean_of(records, "/half_weight_share"),
        }
        for method, records in steps.items()
    }


def _interval(pair: list[float] | None) -> str:
    return "n/a" if pair is None else f"[{pair[0]:+.3f}, {pair[1]:+.3f}]"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folders", nargs="+", type=Path, help="bench learn output folders")
    parser.add_argument(
        "--pairs", default="", help="comma-separated A:B method pairs (labels as in --methods; a label may hold '-')"
    )
    parser.add_argument("--measure", choices=sorted(MEASURES), default="final")
    parser.add_argument("--json", type=Path, help="also write every interval as JSON")
    parser.add_argument("--diagnostics", action="store_true", help="per method: grad norm, clipping, concentration")
    args = parser.parse_args()
    if args.diagnostics:
        print("| folder | method | grad norm, median | steps clipped | weight Gini | tokens carrying half the weight |")
        print("|---|---|---:|---:|---:|---:|")
        for folder in args.folders:
            for method, d in diagnostics(folder).items():
                gini, half = (f"{d[k]:.2f}" if d[k] is not None else "n/a" for k in ("gini", "half_weight_share"))
                print(
                    f"| {folder.name} | {method} | {d['grad_norm_median']:.2f} | {d['clipped']:.0%} | {gini} | {half} |"
                )
        return
    pairs = [tuple(p.split(":")) for p in args.pairs.split(",")]
    if not args.pairs or any(len(p) != 2 for p in pairs):
        parser.error("--pairs takes A:B entries, e.g. contrastive:bounded")
    rows = []
    print(f"| folder | pair | {args.measure}: mean [t over policies]; [bootstrap] | pairs > 0 |")
    print("|---|---|---:|---:|")
    for folder in args.folders:
        for a, b in pairs:
            diffs = differences(folder, a, b, args.measure)
            if not diffs:
                print(f"| {folder.name} | {a} − {b} | not run | |")
                continue
            result = two_level_interval(diffs)
            rows.append({"folder": str(folder), "a": a, "b": b, "measure": args.measure, **result})
            print(
                f"| {folder.name} | {a} − {b} | {result['mean']:+.3f} {_interval(result['ci95_t'])}; "
                f"{_interval(result['ci95_bootstrap'])} | {result['positive']} / {result['n_pairs']} |"
            )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
