"""Steps (and seconds) each method of a `mrtpo bench learn --policies` folder needs to reach GDPO's final reward.

Per (policy, seed): the target is GDPO's final training reward in that pair (the mean of its last
``--tail`` logged steps); each run's steps to it are the first step whose trailing ``--window`` mean
reaches it, over a full window (:func:`steps_to`); the speed-up is GDPO's steps over the
method's (> 1: fewer steps). A run that never reaches the target counts at ``max_steps + 1`` (its
speed-up is then an upper bound). The same in training seconds (the runs' own ``step_time``). The
log speed-ups get the two-level interval of ``bench learn`` (Student-t over policy means and the
two-stage bootstrap), reported back as geometric means; the final total reward and each reward's
final value, as differences against GDPO with the same interval.

The folder is a ``bench learn`` folder (run folders with ``finished.json``) or a folder of per-run
digests (``<method>-policy<p>-seed<s>.json``, written by ``scripts/gym_digest.py``).

    .venv/bin/python scripts/gym_speedup.py runs/gym-long [--reference gdpo] [--json out.json]
    .venv/bin/python scripts/gym_speedup.py docs/results/gym-long-runs
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from mrtpo.bench.learn.stats import tail_mean, training_seconds, two_level_interval


def _records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _series(records: list[dict], key: str) -> list[float]:
    return [r[key] for r in records if key in r and "step" in r and "train_runtime" not in r]


def digest_records(digest: dict) -> list[dict]:
    """A digest's per-step columns (``scripts/gym_digest.py``) as metrics records, one per step."""
    columns = digest["per_step"]
    return [{key: values[i] for key, values in columns.items()} for i in range(len(columns["step"]))]


def runs(folder: Path) -> dict[tuple[str, int, int], list[dict]]:
    """``{(method, policy, seed): metrics records}`` of the finished runs (``<method>-policy<p>-seed<s>``),
    from run folders or from digests."""
    out = {}
    for run in sorted(folder.iterdir()):
        if run.is_dir() and (run / "finished.json").exists():
            name, records = run.name, _records(run / "metrics.jsonl")
        elif run.is_file() and run.suffix == ".json" and "-policy" in run.stem:
            name, records = run.stem, digest_records(json.loads(run.read_text()))
        else:
            continue
        method, rest = name.rsplit("-policy", 1)
        policy, seed = rest.split("-seed")
        out[(method, int(policy), int(seed))] = records
    return out


def steps_to(records: list[dict], target: float, window: int) -> int | None:
    """The first step (1-based) whose trailing mean over a full ``window`` of steps reaches ``target``
    (a full window: the first steps' single noisy batches do not count as reaching it)."""
    values = _series(records, "reward")
    for i in range(window - 1, len(values)):
        if sum(values[i - window + 1 : i + 1]) / window >= target:
            return i + 1
    return None


def seconds_to(records: list[dict], target: float, window: int) -> float | None:
    """Training seconds (cumulative ``step_time``) at :func:`steps_to`."""
    step = steps_to(records, target, window)
    timed = training_seconds(records)
    return None if step is None or timed is None else timed[1][step - 1]


def speedups(folder: Path, reference: str, tail: int, window: int) -> dict:
    found = runs(folder)
    methods = sorted({m for m, _, _ in found} - {reference})
    result = {}
    for method in methods:
        steps: dict[int, list[float]] = {}
        secs: dict[int, list[float]] = {}
        final: dict[int, list[float]] = {}
        per_reward: dict[str, dict[int, list[float]]] = {}
        rows = []
        for (m, policy, seed), records in sorted(found.items()):
            ref = found.get((reference, policy, seed))
            if m != method or ref is None:
                continue
            target = tail_mean(_series(ref, "reward"), tail)
            max_steps = len(_series(records, "reward"))
            final.setdefault(policy, []).append(tail_mean(_series(records, "reward"), tail) - target)
            mine, theirs = steps_to(records, target, window), steps_to(ref, target, window)
            theirs = theirs or max_steps
            ratio = theirs / (mine or max_steps + 1)
            steps.setdefault(policy, []).append(math.log(ratio))
            s_mine, s_theirs = seconds_to(records, target, window), seconds_to(ref, target, window)
            total = training_seconds(records)
            if s_theirs is not None and total is not None:
                secs.setdefault(policy, []).append(math.log(s_theirs / (s_mine or total[1][-1] * (1 + 1 / max_steps))))
            for key in {k for r in records for k in r if k.startswith("rewards/") and k.endswith("/mean")}:
                diff = tail_mean(_series(records, key), tail) - tail_mean(_series(ref, key), tail)
                per_reward.setdefault(key.split("/")[1], {}).setdefault(policy, []).append(diff)
            rows.append(
                {
                    "policy": policy,
                    "seed": seed,
                    "target": target,
                    "steps": mine,
                    "gdpo_steps": theirs,
                    "speedup": ratio,
                }
            )
        if not rows:
            continue
        result[method] = {
            "pairs": rows,
            "steps": _geometric(two_level_interval(steps)),
            "seconds": _geometric(two_level_interval(secs)) if secs else None,
            "reward": two_level_interval(final),
            "per_reward": {k: two_level_interval(v) for k, v in sorted(per_reward.items())},
        }
    return result


def _geometric(interval: dict) -> dict:
    """A two-level interval of log ratios, as ratios (geometric means)."""
    exp = lambda v: None if v is None else math.exp(v)  # noqa: E731
    t = interval["ci95_t"]
    return {
        "mean": exp(interval["mean"]),
        "ci95_t": [exp(v) for v in t] if t else None,
        "ci95_bootstrap": [exp(v) for v in interval["ci95_bootstrap"]] if interval["ci95_bootstrap"] else None,
        "pairs": interval["n_pairs"],
        "policies": interval["n_policies"],
        "faster": interval["positive"],
    }


def _fmt(g: dict | None) -> str:
    if not g or g["mean"] is None:
        return "—"
    boot = g["ci95_bootstrap"]
    return (
        f"{g['mean']:.2f}×"
        + (f" [{boot[0]:.2f}, {boot[1]:.2f}]" if boot else "")
        + f" ({g['faster']} of {g['pairs']} pairs faster)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--reference", default="gdpo")
    parser.add_argument("--tail", type=int, default=10, help="steps averaged for the final reward")
    parser.add_argument("--window", type=int, default=10, help="trailing mean for steps to target")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    result = speedups(args.folder, args.reference, args.tail, args.window)
    print(
        f"| method | fewer steps to {args.reference}'s final reward | less training time to it | "
        "worst reward − gdpo (final) |\n|---|---:|---:|---:|"
    )
    for method, r in result.items():
        worst = min(r["per_reward"].items(), key=lambda kv: kv[1]["mean"], default=None)
        lost = f"{worst[0]} {worst[1]['mean']:+.3f}" if worst else "—"
        print(f"| {method} | {_fmt(r['steps'])} | {_fmt(r['seconds'])} | {lost} |")
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
