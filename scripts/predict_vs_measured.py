"""Step-0 G_eff from `mrtpo bench signal` against the measured per-step gains, over (family, method) cells.

The plan, fixed before the correlation was computed: docs/results/2026-12-07-prediction-plan.md.
Predictor: ``g_eff_excess`` (G_eff, noise taken out) of each cell's method label in the bench signal
JSON records. Outcome: the final total-reward difference to gdpo per step (the two-level mean: gym
families from the tuning pages' "over policies and seeds" table, `gym-long` from its per-run
digests), and on `gym-long` the speed-up in steps to GDPO's final reward (scripts/gym_speedup.py).
Statistics: Spearman's rho with a bootstrap over cells and a one-sided permutation p; the exact
permutation p on the `gym-long` cells; Kendall's tau pooled over the method pairs within a family.

    .venv/bin/python scripts/predict_vs_measured.py [--json out.json] [--plot out.png]
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import re
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
from gym_speedup import speedups  # noqa: E402

RESULTS = ROOT / "docs" / "results"
GYM_LONG = "gym-long"
# (family, method label) in the plan's order; the tuning pages call the paper's weights `mrtpo`.
CELLS = (
    ("gym-call", "paper"),
    ("gym-call", "bounded"),
    ("gym-answer", "paper"),
    ("gym-answer", "bounded"),
    ("gym-answer", "shuffled"),
    ("gym-overlap", "paper"),
    ("gym-overlap", "bounded"),
    ("gym-constraints", "paper"),
    ("gym-constraints", "bounded"),
    ("gym-constraints", "shuffled"),
    ("gym-tradeoff", "paper"),
    ("gym-tradeoff", "bounded"),
    ("gym-tradeoff", "shuffled"),
    (GYM_LONG, "oracle"),
    (GYM_LONG, "paper"),
    (GYM_LONG, "bounded"),
    (GYM_LONG, "shuffled"),
    (GYM_LONG, "moderate"),
)
SHUFFLED_BOUNDED = "shuffled-bounded"
PAGE_LABEL = {"paper": "mrtpo", "bounded": "bounded", "shuffled": "shuffled"}


def average_ranks(values: list[float]) -> list[float]:
    """1-based ranks, ties sharing the mean of the ranks they span."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def spearman(x: list[float], y: list[float]) -> float:
    """Spearman's rho: Pearson's correlation of the average ranks (nan when either side is constant)."""
    rx, ry = np.array(average_ranks(x)), np.array(average_ranks(y))
    dx, dy = rx - rx.mean(), ry - ry.mean()
    denom = math.sqrt(float((dx * dx).sum() * (dy * dy).sum()))
    return float((dx * dy).sum()) / denom if denom else float("nan")


def bootstrap_interval(x: list[float], y: list[float], resamples: int = 10_000, seed: int = 0) -> list[float]:
    """95 % percentile interval of rho over cells drawn with replacement (constant draws skipped)."""
    rng = np.random.default_rng(seed)
    n, draws = len(x), []
    for _ in range(resamples):
        idx = rng.integers(0, n, n)
        rho = spearman([x[i] for i in idx], [y[i] for i in idx])
        if not math.isnan(rho):
            draws.append(rho)
    return [float(v) for v in np.percentile(draws, [2.5, 97.5])]


def permutation_p(x: list[float], y: list[float], permutations: int = 10_000, seed: int = 0) -> float:
    """One-sided p for rho > 0: share of random orderings of ``y`` with rho at least the observed."""
    rng = np.random.default_rng(seed)
    observed = spearman(x, y)
    hits = sum(spearman(x, list(rng.permutation(y))) >= observed - 1e-12 for _ in range(permutations))
    return (hits + 1) / (permutations + 1)


def exact_permutation_p(x: list[float], y: list[float]) -> float:
    """One-sided p for rho > 0 over every ordering of ``y`` (small n only)."""
    observed = spearman(x, y)
    counts = [spearman(x, list(p)) >= observed - 1e-12 for p in itertools.permutations(y)]
    return sum(counts) / len(counts)


def within_kendall(x: list[float], y: list[float], strata: list[str]) -> float:
    """Kendall's tau over the pairs of cells in the same stratum: (concordant - discordant) / pairs."""
    score, pairs = 0, 0
    for i, j in itertools.combinations(range(len(x)), 2):
        if strata[i] != strata[j]:
            continue
        pairs += 1
        score += int(np.sign(x[i] - x[j]) * np.sign(y[i] - y[j]))
    return score / pairs if pairs else float("nan")


def within_permutation_p(
    x: list[float], y: list[float], strata: list[str], permutations: int = 10_000, seed: int = 0
) -> float:
    """One-sided p for :func:`within_kendall` > 0, ``y`` permuted inside each stratum."""
    rng = np.random.default_rng(seed)
    observed = within_kendall(x, y, strata)
    groups = {s: [i for i, t in enumerate(strata) if t == s] for s in dict.fromkeys(strata)}
    hits = 0
    for _ in range(permutations):
        shuffled = list(y)
        for idx in groups.values():
            for i, v in zip(idx, rng.permutation([y[i] for i in idx])):
                shuffled[i] = float(v)
        hits += within_kendall(x, shuffled, strata) >= observed - 1e-12
    return (hits + 1) / (permutations + 1)


def page_means(text: str) -> dict[str, float]:
    """``{method: mean}`` of the reward rows of a bench learn page's "over policies and seeds" table."""
    pattern = re.compile(r"^\| (\S+) \| reward \| \d+ × \d+ \| ([-+\d.]+) \[", re.M)
    return {m: float(v) for m, v in pattern.findall(text)}


def predictors(signal_dir: Path, key: str = "g_eff_excess") -> dict[tuple[str, str], float]:
    """``{(family, label): G_eff}`` (``key``: noise out, or plain ``g_eff``) from ``<family>.json``; a gym
    family's ``shuffled`` from ``<family>-shuffled-bounded.json`` (the control in the tuning runs' shape)."""
    out = {}
    for path in sorted(signal_dir.glob("gym-*.json")):
        rows = {row["method"]: row[key] for row in json.loads(path.read_text())["rows"]}
        if path.stem.endswith(SHUFFLED_BOUNDED):
            if SHUFFLED_BOUNDED in rows:
                out[(path.stem.removesuffix("-" + SHUFFLED_BOUNDED), "shuffled")] = rows[SHUFFLED_BOUNDED]
            continue
        for label, value in rows.items():
            if label != "shuffled" or path.stem == GYM_LONG:  # gym families: the paper's shape, not run there
                out[(path.stem, label)] = value
    return out


def outcomes(tune_dir: Path, long_runs: Path) -> dict[tuple[str, str], dict[str, float]]:
    """``{(family, label): {"reward": final reward - gdpo[, "speedup": steps ratio]}}``."""
    out = {}
    for family, label in CELLS:
        if family == GYM_LONG:
            continue
        means = page_means((tune_dir / f"{family.removeprefix('gym-')}.md").read_text())
        if PAGE_LABEL[label] in means:
            out[(family, label)] = {"reward": means[PAGE_LABEL[label]]}
    for label, r in speedups(long_runs, "gdpo", 10, 10).items():
        if r["steps"]["policies"] >= 2:
            out[(GYM_LONG, label)] = {"reward": r["reward"]["mean"], "speedup": r["steps"]["mean"]}
    return out


def analyse(pred: dict, measured: dict, plain: dict | None = None) -> dict:
    cells = [c for c in CELLS if c in pred and c in measured]
    x = [pred[c] for c in cells]
    y = [measured[c]["reward"] for c in cells]
    families = [f for f, _ in cells]
    rx, ry = average_ranks(x), average_ranks(y)
    long_cells = [c for c in cells if "speedup" in measured[c]]
    lx, ly = [pred[c] for c in long_cells], [measured[c]["speedup"] for c in long_cells]
    return {
        "cells": [
            {"family": f, "method": m, "g_eff": pred[(f, m)], **measured[(f, m)], "rank_gap": rx[i] - ry[i]}
            for i, (f, m) in enumerate(cells)
        ],
        "missing": [f"{f}/{m}" for f, m in CELLS if (f, m) not in cells],
        "primary": {
            "n": len(cells),
            "rho": spearman(x, y),
            "ci95_bootstrap": bootstrap_interval(x, y),
            "p_one_sided": permutation_p(x, y),
        },
        "plain_g_eff_rho": spearman([plain[c] for c in cells], y) if plain else None,
        "gym_long_speedup": {"n": len(long_cells), "rho": spearman(lx, ly), "p_exact": exact_permutation_p(lx, ly)},
        "within_family": {
            "pairs": sum(a == b for a, b in itertools.combinations(families, 2)),
            "tau": within_kendall(x, y, families),
            "p_one_sided": within_permutation_p(x, y, families),
        },
    }


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.6), gridspec_kw={"width_ratios": [3, 2]})
    families = list(dict.fromkeys(c["family"] for c in result["cells"]))
    style = {f: (m, plt.cm.tab10(i)) for i, (f, m) in enumerate(zip(families, "osD^vP*"))}
    for c in result["cells"]:
        marker, color = style[c["family"]]
        left.scatter(c["g_eff"], c["reward"], marker=marker, color=color, s=46, label=c["family"])
        left.annotate(c["method"], (c["g_eff"], c["reward"]), fontsize=7, xytext=(4, 3), textcoords="offset points")
        if "speedup" in c:
            right.scatter(c["g_eff"], c["speedup"], marker=marker, color=color, s=46)
            right.annotate(
                c["method"], (c["g_eff"], c["speedup"]), fontsize=8, xytext=(4, 3), textcoords="offset points"
            )
    handles, labels = left.get_legend_handles_labels()
    left.legend(dict(zip(labels, handles)).values(), dict(zip(labels, handles)).keys(), fontsize=7, loc="best")
    p, s = result["primary"], result["gym_long_speedup"]
    low, high = p["ci95_bootstrap"]
    left.set_title(f"all cells: Spearman {p['rho']:+.2f} [{low:+.2f}, {high:+.2f}], n {p['n']}", fontsize=9)
    left.set_ylabel("final total reward − gdpo (per step)")
    right.set_title(f"gym-long: Spearman {s['rho']:+.2f} (exact p {s['p_exact']:.2f}), n {s['n']}", fontsize=9)
    right.set_ylabel("fewer steps to GDPO's final reward (×)")
    for ax, ref in ((left, 0.0), (right, 1.0)):
        ax.set_xscale("log")
        ax.set_xlabel("step-0 G_eff, noise out (bench signal)")
        ax.axhline(ref, color="k", lw=0.6)
        ax.axvline(1.0, color="k", lw=0.6, ls=":")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--signal", type=Path, default=RESULTS / "bench-signal")
    parser.add_argument("--tune", type=Path, default=RESULTS / "gym-tune300")
    parser.add_argument("--long-runs", type=Path, default=RESULTS / "gym-long-runs")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--plot", type=Path)
    args = parser.parse_args()
    result = analyse(predictors(args.signal), outcomes(args.tune, args.long_runs), predictors(args.signal, "g_eff"))
    print("| family | method | G_eff (noise out) | final reward − gdpo | steps speed-up | rank gap |")
    print("|---|---|---:|---:|---:|---:|")
    for c in result["cells"]:
        speed = f"{c['speedup']:.2f}×" if "speedup" in c else "—"
        gap = c["rank_gap"]
        print(f"| {c['family']} | {c['method']} | {c['g_eff']:.2f} | {c['reward']:+.3f} | {speed} | {gap:+.1f} |")
    p, s, w = result["primary"], result["gym_long_speedup"], result["within_family"]
    low, high = p["ci95_bootstrap"]
    print(
        f"\nSpearman over {p['n']} cells: {p['rho']:+.3f} [{low:+.3f}, {high:+.3f}], "
        f"one-sided permutation p {p['p_one_sided']:.3f} (plain G_eff: {result['plain_g_eff_rho']:+.3f})\n"
        f"gym-long speed-ups ({s['n']} cells): Spearman {s['rho']:+.3f}, exact one-sided p {s['p_exact']:.3f}\n"
        f"within family ({w['pairs']} pairs): Kendall {w['tau']:+.3f}, one-sided permutation p {w['p_one_sided']:.3f}"
    )
    if result["missing"]:
        print("missing cells:", ", ".join(result["missing"]))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    if args.plot:
        plot(result, args.plot)


if __name__ == "__main__":
    main()
