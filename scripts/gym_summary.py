"""Tables and plots of the credit gym comparison (scripts/gym_compare.sh writes the runs it reads).

    python scripts/gym_summary.py pick-lr runs/gym 1e-4 3e-4 1e-3   # each method's best rate -> lr.json
    python scripts/gym_summary.py summary runs/gym                   # summary.md, gap-*.png
    python scripts/gym_summary.py equal-steps runs/gym 150           # gdpo steps as long as 150 of mrtpo
    python scripts/gym_summary.py retarget runs/gym/main-gym-constraints 1.3   # add steps to a target

The learning-rate choice uses the sweep's own seeds (never the comparison's): a method's best rate is
the one with the highest final total reward (mean of the last steps, over the sweep's seeds).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from mrtpo.bench.learn.stats import paired_comparison


def _load(path: Path) -> dict | None:
    return json.loads(path.read_text()) if path.is_file() else None


def _final(comparison: dict, method: str, key: str = "reward") -> dict | None:
    summary = comparison["summary"].get(method)
    return summary["final"].get(key) if summary and summary.get("seeds") else None


def _per_seed_final(comparison: dict, method: str, key: str = "reward") -> dict:
    return {
        r["seed"]: r["final"][key]
        for r in comparison["runs"]
        if r["method"] == method and r.get("final", {}).get(key) is not None
    }


def _per_seed_heldout(comparison: dict, method: str, key: str = "reward_total") -> dict:
    return {
        r["seed"]: r["heldout"][key]["end"]
        for r in comparison["runs"]
        if r["method"] == method and r.get("heldout", {}).get(key, {}).get("end") is not None
    }


def pick_lr(out: Path, rates: list[str]) -> dict:
    table: dict[str, dict[str, float]] = {}
    for rate in rates:
        comparison = _load(out / f"lr-{rate}" / "comparison.json")
        if comparison is None:
            continue
        for method in comparison["methods"]:
            final = _final(comparison, method)
            if final is not None:
                table.setdefault(method, {})[rate] = final["mean"]
    best = {m: float(max(values, key=values.get)) for m, values in table.items()}
    record = {"rule": "highest final total reward on the sweep's seeds", "table": table, "best": best}
    (out / "lr.json").write_text(json.dumps(record, indent=1) + "\n")
    print(json.dumps(record, indent=1))
    return record


def _fmt(stats: dict | None) -> str:
    if not stats or stats.get("mean") is None:
        return "—"
    ci = stats.get("ci95")
    return f"{stats['mean']:.3f} [{ci[0]:.3f}, {ci[1]:.3f}]" if ci and None not in ci else f"{stats['mean']:.3f}"


def _gap(comparison: dict, method: str = "mrtpo", reference: str = "gdpo", key: str = "reward") -> dict:
    return paired_comparison(_per_seed_final(comparison, method, key), _per_seed_final(comparison, reference, key))


def _gap_text(gap: dict) -> str:
    if gap.get("mean_difference") is None:
        return "—"
    ci = gap.get("ci95") or [None, None]
    p = gap.get("p_value")
    ci_text = f" [{ci[0]:+.3f}, {ci[1]:+.3f}]" if None not in ci else ""
    if p is None:
        return f"{gap['mean_difference']:+.3f}{ci_text}"
    p_text = f"p = {p:.2g}" if p >= 0.001 else "p < 0.001"
    return f"{gap['mean_difference']:+.3f}{ci_text}, {p_text}"


def _learning_table(comparison: dict, title: str) -> list[str]:
    methods = comparison["methods"]
    rewards = comparison.get("rewards", [])
    lines = [
        f"### {title}",
        "",
        comparison["header"].get("settings", ""),
        "",
        "| method | seeds | final total reward [95% CI] | "
        + " | ".join(rewards)
        + " | held-out reward_total (end) | held-out all_correct (end) | − gdpo, paired over seeds [95% CI], p |",
        "|---|---:|---:|" + "---:|" * len(rewards) + "---:|---:|---:|",
    ]
    for m in methods:
        s = comparison["summary"].get(m) or {}
        if not s.get("seeds"):
            continue
        per_reward = [_fmt(s["final"].get(f"rewards/{r}/mean")) for r in rewards]
        held = s.get("heldout", {})
        end_total = _fmt((held.get("reward_total") or {}).get("end"))
        end_all = _fmt((held.get("all_correct") or {}).get("end"))
        gap = _gap_text(_gap(comparison, m)) if m != "gdpo" else "(reference)"
        lines.append(
            f"| {m} | {len(s['seeds'])} | {_fmt(s['final']['reward'])} | "
            + " | ".join(per_reward)
            + f" | {end_total} | {end_all} | {gap} |"
        )
    return lines + [""]


def step_times(folder: Path, method: str) -> dict[str, float]:
    """Median seconds per step of a method's runs (TRL's step_time and the trainer's phase times)."""
    import statistics

    values: dict[str, list[float]] = {}
    for metrics in folder.glob(f"{method}-seed*/metrics.jsonl"):
        for line in metrics.read_text().splitlines():
            record = json.loads(line)
            for key in ("step_time", "time/generation", "time/replay", "time/update"):
                if isinstance(record.get(key), (int, float)):
                    values.setdefault(key, []).append(record[key])
    return {k: statistics.median(v) for k, v in values.items()}


def retarget(folder: Path, target: float, window: int = 10) -> None:
    """Rebuild a finished benchmark's comparison with a steps-to-target row: its saved command plus
    ``--compare-only --target-reward target --target-window window`` (nothing is trained again)."""
    import shlex
    import subprocess

    command = shlex.split(json.loads((folder / "bench.json").read_text())["command"])
    mrtpo = str(Path(sys.executable).with_name("mrtpo"))
    subprocess.run(
        [mrtpo, *command[1:], "--compare-only", "--target-reward", str(target), "--target-window", str(window)],
        check=True,
        stdout=subprocess.DEVNULL,
    )


def equal_time_steps(out: Path, steps: int) -> int:
    """GDPO steps that take as long as ``steps`` MRTPO steps (median step times of the main comparison)."""
    main = out / "main-gym-constraints"
    return round(steps * step_times(main, "mrtpo")["step_time"] / step_times(main, "gdpo")["step_time"])


def _time_table(out: Path) -> list[str]:
    main = out / "main-gym-constraints"
    comparison = _load(main / "comparison.json")
    if comparison is None:
        return []
    lines = [
        "### Step time (median seconds per step, one core each, two runs at a time)",
        "",
        "| method | step | generation | replay | update | × gdpo |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    reference = step_times(main, "gdpo").get("step_time")
    for m in comparison["methods"]:
        t = step_times(main, m)
        ratio = f"{t['step_time'] / reference:.2f}" if reference else "—"
        lines.append(
            f"| {m} | {t.get('step_time', 0):.3f} | {t.get('time/generation', 0):.3f} | "
            f"{t.get('time/replay', 0):.3f} | {t.get('time/update', 0):.3f} | {ratio} |"
        )
    equal = _load(out / "equal-time-gdpo" / "comparison.json")
    if equal is not None:
        steps = equal["runs"][0]["steps"] if equal["runs"] else "?"
        gap = paired_comparison(_per_seed_final(comparison, "mrtpo"), _per_seed_final(equal, "gdpo"))
        lines += [
            "",
            f"Equal wall-clock: gdpo trained for {steps} steps (as long as mrtpo's 150 at the median step "
            f"times) reaches a final total reward of {_fmt(_final(equal, 'gdpo'))}; mrtpo after 150 steps: "
            f"{_fmt(_final(comparison, 'mrtpo'))}; mrtpo − gdpo (paired by seed): {_gap_text(gap)}.",
        ]
    return lines + [""]


def _ablation_table(out: Path) -> list[str]:
    """MRTPO variants (other λ, relevance kind) on a comparison's seeds and settings, paired with that
    comparison's gdpo and default mrtpo (main-gym-constraints, or family-<task> for another task)."""
    rows = []
    for folder in sorted(out.glob("ablation-*")):
        c = _load(folder / "comparison.json")
        if c is None:
            continue
        reference_folder = out / ("main-gym-constraints" if c["task"] == "gym-constraints" else f"family-{c['task']}")
        reference = _load(reference_folder / "comparison.json")
        if reference is None:
            continue
        mine = _per_seed_final(c, "mrtpo")
        vs_gdpo = paired_comparison(mine, _per_seed_final(reference, "gdpo"))
        vs_mrtpo = paired_comparison(mine, _per_seed_final(reference, "mrtpo"))
        variant = {
            k: v
            for k, v in json.loads((folder / "bench.json").read_text()).get("overrides", {}).items()
            if k != "max_steps"
        }
        rows.append(
            f"| {c['task']} | mrtpo {', '.join(f'{k}={v}' for k, v in variant.items()) or folder.name} | "
            f"{_fmt(_final(c, 'mrtpo'))} | {_gap_text(vs_gdpo)} | {_gap_text(vs_mrtpo)} |"
        )
    if not rows:
        return []
    return [
        "### MRTPO ablations (the reference comparison's seeds and settings)",
        "",
        "| task | variant | final total reward [95% CI] | − gdpo (paired) | − mrtpo λ = 1, js (paired) |",
        "|---|---|---:|---:|---:|",
        *rows,
        "",
    ]


def _precision_table(out: Path) -> list[str]:
    lines = [
        "### Credit precision against ground truth (warm-started policy, before learning)",
        "",
        "Lift = share of a reward's weight on its ground-truth relevant tokens ÷ their share of tokens "
        "(1 = uniform = GRPO/GDPO); ρ = Spearman correlation of the weights with the relevance indicator. "
        "Conditioning: reward rate sampled with / without the evidence.",
        "",
        "| task | reward | n | relevant share | mrtpo lift [ρ] | contrast lift [ρ] | entropy lift [ρ] | "
        "with / without evidence | groups with spread |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for path in sorted(out.glob("precision-*.json")):
        record = json.loads(path.read_text())
        task = path.stem.removeprefix("precision-")
        by_kind = record.get("by_kind", [])
        if [s["reward"] for s in by_kind] == [s["reward"] for s in record["summary"]]:
            by_kind = []  # the kinds are the rewards themselves
        for s in record["summary"] + [{**s, "reward": f"kind: {s['reward']}"} for s in by_kind]:
            cells = []
            for m in ("mrtpo", "contrast", "entropy"):
                lift, rho = s["lift"].get(m, {}), s["rho"].get(m, {}).get("mean")
                cells.append(
                    "—" if not lift.get("n") else f"{lift['mean']:.2f} [{'—' if rho is None else f'{rho:+.2f}'}]"
                )
            c = record.get("conditioning", {}).get(s["reward"], {})
            cond = "—" if c.get("with") is None else f"{c['with']:.2f} / {c['without']:.2f}"
            spread = "—" if c.get("spread") is None else f"{c['spread']:.2f}"
            lines.append(
                f"| {task} | {s['reward']} | {s['n']} | {s['relevant_share']:.2f} | "
                + " | ".join(cells)
                + f" | {cond} | {spread} |"
            )
    return lines + [""]


def _sweep(out: Path, kind: str, values: list[int], prefix: str = "sweep") -> tuple[list[str], dict]:
    """The gdpo/mrtpo gap at each swept value (folders ``<prefix>-<kind>-<value>``; with prefix
    ``sweep150`` the 3-reward point is the main comparison, which has the same settings)."""
    points = []
    for v in values:
        folder = out / f"{prefix}-{kind}-{v}"
        if prefix == "sweep150" and kind == "rewards" and v == 3:
            folder = out / "main-gym-constraints"
        comparison = _load(folder / "comparison.json")
        if comparison is not None:
            points.append((v, comparison))
    label = {"rewards": "rewards (clauses per prompt)", "length": "typical response length (words)"}[kind]
    label += ", 150 steps, 5 seeds" if prefix == "sweep150" else ", 100 steps, 3 seeds"
    lines = [
        f"### Sweep: {label}",
        "",
        f"| {kind} | gdpo final reward | mrtpo final reward | mrtpo − gdpo (paired) | "
        "per reward: mrtpo − gdpo | held-out total: mrtpo − gdpo (paired) |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    gaps, held_gaps = [], []
    for v, c in points:
        gap = _gap(c)
        gaps.append((v, gap))
        # per reward-slot mean reward difference (normalised by the number of rewards)
        rewards = c.get("rewards", [])
        per = gap.get("mean_difference")
        per_text = "—" if per is None or not rewards else f"{per / len(rewards):+.3f}"
        held = paired_comparison(_per_seed_heldout(c, "mrtpo"), _per_seed_heldout(c, "gdpo"))
        held_gaps.append((v, held))
        lines.append(
            f"| {v} | {_fmt(_final(c, 'gdpo'))} | {_fmt(_final(c, 'mrtpo'))} | {_gap_text(gap)} | "
            f"{per_text} | {_gap_text(held)} |"
        )
    return lines + [""], {"final training reward": gaps, "held-out total reward": held_gaps}


def _plot_gap(path: Path, series: dict[str, list[tuple[int, dict]]], xlabel: str) -> None:
    """MRTPO − GDPO paired gaps (mean and 95 % CI over seeds) against a swept setting, one line per measure."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.2, 3.4))
    for i, (label, gaps) in enumerate(series.items()):
        points = [(v, g) for v, g in gaps if g.get("mean_difference") is not None]
        if not points:
            continue
        xs = [v + (i - 0.5) * 0.08 * v for v, _ in points]  # side by side, not on top of each other
        ys = [g["mean_difference"] for _, g in points]
        cis = [g["ci95"] if g.get("ci95") and None not in g["ci95"] else [g["mean_difference"]] * 2 for _, g in points]
        ax.errorbar(
            xs,
            ys,
            yerr=[[y - c[0] for y, c in zip(ys, cis)], [c[1] - y for y, c in zip(ys, cis)]],
            marker="o",
            capsize=4,
            label=label,
        )
    ax.axhline(0, color="gray", lw=0.8)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("mrtpo − gdpo")
    ax.set_xscale("log", base=2)
    ax.set_xticks([v for v, _ in next(iter(series.values()))])
    ax.get_xaxis().set_major_formatter(matplotlib.ticker.ScalarFormatter())
    ax.set_title("paired gap over seeds, 95% CI")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _smoothed_runs(folder: Path, method: str, key: str, window: int) -> list[list[float]]:
    """Each seed's ``key`` per step, as a trailing mean over ``window`` steps."""
    runs = []
    for run in sorted(folder.glob(f"{method}-seed*")):
        values = [json.loads(line).get(key) for line in (run / "metrics.jsonl").read_text().splitlines()]
        values = [v for v in values if isinstance(v, (int, float))]
        runs.append(
            [
                sum(values[max(0, i - window + 1) : i + 1]) / len(values[max(0, i - window + 1) : i + 1])
                for i in range(len(values))
            ]
        )
    return runs


def plot_curves(folder: Path, path: Path, window: int = 10) -> None:
    """Total training reward (trailing mean over ``window`` steps) and held-out total reward per method:
    mean over seeds with a Student-t 95 % band."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from mrtpo.bench.learn.stats import describe

    comparison = _load(folder / "comparison.json")
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
    for method in comparison["methods"]:
        runs = _smoothed_runs(folder, method, "reward", window)
        if not runs:
            continue
        steps = range(1, min(len(r) for r in runs) + 1)
        stats = [describe([r[i - 1] for r in runs]) for i in steps]
        (line,) = axes[0].plot(steps, [s["mean"] for s in stats], label=f"{method} (n={len(runs)})")
        if len(runs) > 1:
            axes[0].fill_between(
                steps, [s["ci95"][0] for s in stats], [s["ci95"][1] for s in stats], color=line.get_color(), alpha=0.15
            )
        held = {}
        for run in sorted(folder.glob(f"{method}-seed*")):
            for line_text in (run / "eval.jsonl").read_text().splitlines():
                record = json.loads(line_text)
                held.setdefault(record["step"], []).append(record["metrics"]["reward_total"])
        xs = sorted(held)
        hs = [describe(held[x]) for x in xs]
        axes[1].plot(xs, [h["mean"] for h in hs], marker="o", color=line.get_color(), label=method)
        if len(runs) > 1:
            axes[1].fill_between(
                xs, [h["ci95"][0] for h in hs], [h["ci95"][1] for h in hs], color=line.get_color(), alpha=0.15
            )
    axes[0].set_title(f"training total reward ({window}-step trailing mean)")
    axes[1].set_title("held-out total reward (greedy)")
    for ax in axes:
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle(f"{comparison['task']}: mean over seeds, band = 95% CI")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def summary(out: Path) -> None:
    lines = ["# Credit gym comparison", ""]
    lr = _load(out / "lr.json")
    if lr:
        rates = sorted({r for v in lr["table"].values() for r in v}, key=float)
        lines += [
            "### Learning-rate sweep (separate seeds; the best rate per method is used below)",
            "",
            "| method | " + " | ".join(f"lr {r}" for r in rates) + " | best |",
            "|---|" + "---:|" * (len(rates) + 1),
        ]
        for m, values in lr["table"].items():
            lines.append(
                f"| {m} | "
                + " | ".join(f"{values[r]:.3f}" if r in values else "—" for r in rates)
                + f" | {lr['best'][m]:g} |"
            )
        lines.append("")
    lines += _precision_table(out)
    for folder in sorted(out.glob("main-*")) + sorted(out.glob("family-*")):
        comparison = _load(folder / "comparison.json")
        if comparison:
            lines += _learning_table(comparison, folder.name)
            plot_curves(folder, out / f"curves-{folder.name}.png")
            lines += [f"![{folder.name}](curves-{folder.name}.png)", ""]
    lines += _ablation_table(out)
    lines += _time_table(out)
    for prefix, kind, values, xlabel in (
        ("sweep150", "rewards", [2, 3, 6], "rewards per prompt (150 steps)"),
        ("sweep", "rewards", [2, 4, 6], "rewards per prompt (100 steps)"),
        ("sweep", "length", [8, 16, 32], "typical response length (words)"),
    ):
        table, gaps = _sweep(out, kind, values, prefix)
        if len(gaps["final training reward"]) > 1:
            name = f"gap-{kind}" + ("-150" if prefix == "sweep150" else "")
            lines += table + [f"![gap vs {kind}]({name}.png)", ""]
            _plot_gap(out / f"{name}.png", gaps, xlabel)
    (out / "summary.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    command, folder = sys.argv[1], Path(sys.argv[2])
    if command == "pick-lr":
        pick_lr(folder, sys.argv[3:])
    elif command == "retarget":
        retarget(folder, float(sys.argv[3]))
    elif command == "equal-steps":
        print(equal_time_steps(folder, int(sys.argv[3])))
    elif command == "summary":
        summary(folder)
    else:
        sys.exit(f"unknown command {command!r}: pick-lr or summary")
