"""The comparison as figures and Markdown: ``rewards.png``, ``length.png``, ``heldout.png`` (per
method the mean over seeds, a min-max band and thin single-seed lines) and ``comparison.md``
(tables of :func:`~.compare.build_comparison`'s result, with 95% CIs, the paired tests and, over
policies, the two-level intervals).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from mrtpo.bench.learn.stats import EQUAL_TIME, finite

EQUAL_TIME_NOTE = (
    "reward_at_equal_time: each run's total reward (mean of its last steps) at the last step within "
    "the training seconds of {ref}'s run with the same seed (the sum of its per-step step_time, "
    "evaluation not included) against {ref}'s final; a run that ended sooner counts at its last step."
)

__all__ = ["fmt_ci", "fmt_mean_std", "markdown", "training_panels", "write_report"]


def training_panels(reward_names: Sequence[str], with_length: bool = False) -> list[tuple[str, str]]:
    """``(metrics.jsonl key, label)`` of each reward's mean, the total and (optionally) the length."""
    panels = [(f"rewards/{n}/mean", n) for n in reward_names] + [("reward", "total reward")]
    return panels + [("completions/mean_length", "completion length")] if with_length else panels


def fmt_mean_std(stats: Mapping[str, Any] | None, spec: str = "{:.3f}") -> str:
    """``mean ± std`` (just the mean for one value; ``n/a`` for none)."""
    if not stats or stats.get("mean") is None:
        return "n/a"
    text = spec.format(stats["mean"])
    if stats.get("std") is not None:
        text += " ± " + spec.format(stats["std"])
    return text


def fmt_ci(mean: float | None, ci: Sequence[float] | None, spec: str = "{:.3f}") -> str:
    """``mean [low, high]`` (just the mean without an interval; ``n/a`` without a mean)."""
    if mean is None:
        return "n/a"
    text = spec.format(mean)
    return text + (f" [{spec.format(ci[0])}, {spec.format(ci[1])}]" if ci else "")


def _p(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3g}"


def _plot(
    path: Path,
    methods: Sequence[str],
    curves: Mapping[str, Any],
    runs: Sequence[Any],
    series_of: Callable[[Any, str], tuple[list, list]],
    panels: Sequence[tuple[str, str]],
    title: str,
    hlines: Mapping[str, tuple[float, str]] | None = None,
    ylim: tuple[float, float] | None = None,
) -> Path:
    """One PNG: a panel per (key, title); per method its seed-mean line, min-max band and one thin
    line per run (``series_of(run, key)``); ``hlines``: key -> (value, label), a dashed line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    cols = min(3, max(1, len(panels)))
    rows = math.ceil(max(1, len(panels)) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.8 * cols, 3.4 * rows), squeeze=False)
    fig.suptitle(title, fontsize=11)
    flat = [ax for row in axes for ax in row]
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax in flat[len(panels) :]:
        ax.axis("off")
    for ax, (key, name) in zip(flat, panels):
        ax.set_title(name, fontsize=10)
        ax.set_xlabel("step")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        drawn = False
        for i, method in enumerate(methods):
            agg = curves.get(method, {}).get(key)
            if not agg or not agg["steps"]:
                continue
            colour = colours[i % len(colours)]
            for run in runs:
                if run.method == method:
                    ax.plot(*series_of(run, key), color=colour, alpha=0.3, lw=0.8)
            ax.plot(
                agg["steps"],
                agg["mean"],
                color=colour,
                lw=2,
                marker="o" if len(agg["steps"]) < 30 else None,
                ms=3,
                label=f"{method} (n={max(agg['n'])})",
            )
            ax.fill_between(agg["steps"], agg["min"], agg["max"], color=colour, alpha=0.15)
            drawn = True
        if drawn and key in (hlines or {}):
            value, label = hlines[key]
            ax.axhline(value, color="#555", ls="--", lw=1, label=label)
        if drawn:
            ax.legend(fontsize=7)
        else:
            ax.text(0.5, 0.5, "not logged", ha="center", va="center", transform=ax.transAxes, color="#888")
        if ylim is not None:
            ax.set_ylim(*ylim)
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_report(out: Path, result: Mapping[str, Any], runs: Sequence[Any], plots: bool = True) -> dict[str, Path]:
    """Write the PNGs (when ``plots`` and any run finished) and ``comparison.md``; return the PNGs."""
    from mrtpo.report.curves import series

    task, methods, curves, target = result["task"], result["methods"], result["curves"], result["target"]
    pngs: dict[str, Path] = {}
    if plots and runs:
        pngs["rewards"] = _plot(
            out / "rewards.png",
            methods,
            curves,
            runs,
            lambda r, k: series(r.records, k),
            training_panels(result["rewards"]),
            f"{task}: training rewards (mean over seeds; band = min-max over seeds)",
            hlines={target["key"]: (target["value"], f"target {target['value']:g}")}
            if target["value"] is not None
            else None,
        )
        pngs["length"] = _plot(
            out / "length.png",
            methods,
            curves,
            runs,
            lambda r, k: series(r.records, k),
            [("completions/mean_length", "completion length (tokens)")],
            f"{task}: completion length",
        )
        pngs["heldout"] = _plot(
            out / "heldout.png",
            methods,
            curves,
            runs,
            lambda r, k: r.heldout_series(k.split("/", 1)[1]),
            [(f"heldout/{m}", f"held-out {m}") for m in result["heldout_metrics"]],
            f"{task}: held-out metrics (greedy; mean over seeds, band = min-max)",
            ylim=(-0.03, 1.03),
        )  # rates: a full axis, so small changes look small
    (out / "comparison.md").write_text(markdown(result, pngs))
    return pngs


def _header(result: Mapping[str, Any]) -> list[str]:
    h, methods, summary = result["header"], result["methods"], result["summary"]
    md = [f"# mrtpo bench learn: {result['task']}", ""]
    for k in ("command", "date", "machine", "model", "preset", "settings"):
        if h.get(k):
            md.append(f"- **{k}**: {'`' + h[k] + '`' if k == 'command' else h[k]}")
    policies = result.get("policies")
    over = f" × policies {', '.join(map(str, policies))}" if policies is not None else ""
    planned = len(methods) * len(result["seeds"]) * len(policies or [0])
    md.append(
        f"- **runs**: {len(result['runs'])} finished of {planned} "
        f"({', '.join(methods)}{over} × seeds {', '.join(map(str, result['seeds']))})"
    )
    if result["missing"]:
        md.append(
            "- **not finished (left out)**: "
            + ", ".join(
                f"{m[0]} seed {m[1]}" if len(m) == 2 else f"{m[0]} policy {m[1]} seed {m[2]}" for m in result["missing"]
            )
        )
    steps = max((r["steps"] for r in result["runs"]), default=0)
    seeds = min((len(s["seeds"]) for s in summary.values()), default=0)
    note = (
        f"Values are mean ± sample std over seeds; a run's training value is the mean of its last "
        f"{result['tail']} logged steps."
    )
    if steps < 50 or seeds < 3:
        note += (
            f" Small scale ({steps} steps, {seeds} seed(s) per method): differences within the spread "
            "are noise; read these numbers as a check of the pipeline, not as a ranking of the methods."
        )
    return [*md, "", note, ""]


def _tables(result: Mapping[str, Any]) -> list[str]:
    """Training values, held-out start/end, and the 95% confidence intervals."""
    methods, summary = result["methods"], result["summary"]
    panels = training_panels(result["rewards"], with_length=True)
    md = [
        "## Training rewards and completion length",
        "",
        f"| method | {'runs' if result.get('policies') is not None else 'seeds'} | "
        + " | ".join(label for _, label in panels)
        + " |",
        "|---|---:|" + "---:|" * len(panels),
    ]
    done = [m for m in methods if summary.get(m, {}).get("seeds")]
    for m in done:
        s = summary[m]
        md.append(f"| {m} | {len(s['seeds'])} | " + " | ".join(fmt_mean_std(s["final"][k]) for k, _ in panels) + " |")
    heldout = result["heldout_metrics"]
    if heldout:
        md += [
            "",
            "## Held-out metrics (greedy, first and last evaluation)",
            "",
            "| method | " + " | ".join(f"{x} start | {x} end" for x in heldout) + " |",
            "|---|" + "---:|---:|" * len(heldout),
        ]
        for m in done:
            cells = [fmt_mean_std(summary[m]["heldout"][x][edge]) for x in heldout for edge in ("start", "end")]
            md.append(f"| {m} | " + " | ".join(cells) + " |")
    with_target = result["target"]["value"] is not None
    md += [
        "",
        "## Means with 95% confidence intervals over seeds",
        "",
        "Student-t interval of the mean over seeds (none with a single seed). Steps to target: over the "
        "seeds that reached it.",
        "",
        "| method | total reward | "
        + (f"held-out {heldout[0]} (end) | " if heldout else "")
        + ("steps to target |" if with_target else ""),
        "|---|---:|" + ("---:|" if heldout else "") + ("---:|" if with_target else ""),
    ]
    for m in done:
        s = summary[m]
        cells = [fmt_ci(s["final"]["reward"]["mean"], s["final"]["reward"]["ci95"])]
        if heldout:
            end = s["heldout"][heldout[0]]["end"]
            cells.append(fmt_ci(end["mean"], end["ci95"]))
        if with_target:
            cells.append(fmt_ci(s["steps_to_target"]["mean"], s["steps_to_target"]["ci95"], "{:.1f}"))
        md.append(f"| {m} | " + " | ".join(cells) + " |")
    return md


def _paired_table(result: Mapping[str, Any]) -> list[str]:
    paired = result.get("paired")
    if not paired or not paired["by_method"]:
        return []
    ref = paired["reference"]
    md = [
        "",
        f"## Paired against {ref}, seed by seed",
        "",
        (
            f"Difference method − {ref} over the seeds both finished (same seed: same initial weights, prompts "
            "and first samples). Paired t-test: 95% CI of the mean difference and its two-sided p-value; "
            "sign-flip: the exact permutation p-value (no normality assumed; with n seeds it cannot go below "
            "2/2^n). Steps to target: over the seeds where both reached it."
            + (
                f" {EQUAL_TIME_NOTE.format(ref=ref)}"
                if any(EQUAL_TIME in m for m in paired["by_method"].values())
                else ""
            )
            + (
                " Over policies every (policy, seed) is one pair here, as if independent: the next table's "
                "intervals account for the policy."
                if result.get("policies") is not None
                else ""
            )
        ),
        "",
        "| method | measure | seeds | mean difference [95% CI] | t-test p | sign-flip p |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for method, measures in paired["by_method"].items():
        for name, c in measures.items():
            md.append(
                f"| {method} | {name} | {c['n']} | {fmt_ci(c['mean_difference'], c['ci95'])} | "
                f"{_p(c['p_value'])} | {_p(c['p_sign_flip'])} |"
            )
    return md


def _two_level_table(result: Mapping[str, Any]) -> list[str]:
    """Over policies: per method and measure the mean over policies with its t and bootstrap
    intervals and the two standard deviations, then each policy's own seed-paired row."""
    two = result.get("two_level")
    if not two or not two["by_method"]:
        return []
    ref = two["reference"]
    md = [
        "",
        f"## Paired against {ref} over policies and seeds",
        "",
        (
            f"Per (policy, seed) the difference method − {ref}; each policy's mean over its seeds, then the mean "
            "over policies (each policy weighs the same). t: Student-t interval over the policy means (df = "
            "policies − 1; a policy's mean carries its seeds' noise, so this covers both levels). Bootstrap: "
            "two-stage percentile interval (policies drawn with replacement, then each one's seeds; "
            "fixed RNG seed). Between: sample std of the policy means; within: pooled std of seeds around "
            "their policy's mean."
        ),
        "",
        "| method | measure | policies × pairs | mean [t 95% CI] | bootstrap 95% CI | t-test p | between sd | "
        "within sd | pairs > 0 |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    per_policy = [
        "",
        "Each policy alone, paired seed by seed (as the table above without policies):",
        "",
        "| method | measure | policy | seeds | mean difference [95% CI] | t-test p | sign-flip p |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for method, measures in two["by_method"].items():
        for name, c in measures.items():
            boot = "[{:.3f}, {:.3f}]".format(*c["ci95_bootstrap"]) if c["ci95_bootstrap"] else "n/a"
            md.append(
                f"| {method} | {name} | {c['n_policies']} × {c['n_pairs']} | {fmt_ci(c['mean'], c['ci95_t'])} | "
                f"{boot} | {_p(c['p_value'])} | {_num(c['between_policy_std'])} | "
                f"{_num(c['within_policy_std'])} | {c['positive']} of {c['n_pairs']} |"
            )
            for policy, p in c["per_policy"].items():
                per_policy.append(
                    f"| {method} | {name} | {policy} | {p['n']} | "
                    f"{fmt_ci(p['mean_difference'], p['ci95'])} | {_p(p['p_value'])} | "
                    f"{_p(p['p_sign_flip'])} |"
                )
    return md + per_policy


def _num(v: Any) -> str:
    return f"{v:.3f}" if finite(v) else "n/a"


def _steps_to_target_table(result: Mapping[str, Any]) -> list[str]:
    t, summary = result["target"], result["summary"]
    md = ["", "## Steps to reach the target reward", ""]
    if t["value"] is None:
        return [*md, "No target given (`--target-reward R`, optionally `--target-key rewards/<name>/mean`)."]
    window = f", trailing mean over {t['window']} steps" if t["window"] > 1 else ""
    md += [
        (f"First step at which `{t['key']}` ≥ {t['value']:g}{window}; the mean is over the seeds that reached it."),
        "",
        "| method | steps to target | per seed |",
        "|---|---|---|",
    ]
    for m in result["methods"]:
        if summary.get(m, {}).get("seeds"):
            st = summary[m]["steps_to_target"]
            per = ", ".join(f"{seed}: {'not reached' if v is None else v}" for seed, v in st["per_seed"].items())
            md.append(f"| {m} | {st['text']} | {per} |")
    return md


def _shared_table(result: Mapping[str, Any]) -> list[str]:
    summary = result["summary"]
    shared = {m: summary[m]["shared_samples"] for m in result["methods"] if "shared_samples" in summary.get(m, {})}
    if not shared:
        return []
    reference = next(iter(shared.values()))["reference"]
    md = [
        "",
        f"## Sampled completions shared with {reference}",
        "",
        (
            f"Share of each run's training completions that are token for token the same as {reference}'s "
            "with the same seed (same prompts, same sampling RNG). The methods' updates differ from the "
            "first step, but until they change a sampled token the runs see the same completions and "
            "rewards: a share near 1 means this comparison had little room to separate the methods."
        ),
        "",
        "| method | shared | per seed: share (first step with a different completion) |",
        "|---|---:|---|",
    ]
    for m, sh in shared.items():
        per = ", ".join(
            f"{seed}: {v['share']:.2f} ({'none' if v['first_different_step'] is None else v['first_different_step']})"
            for seed, v in sh["per_seed"].items()
        )
        md.append(f"| {m} | {fmt_mean_std(sh['share'], '{:.2f}')} | {per} |")
    return md


def _runs_table(result: Mapping[str, Any]) -> list[str]:
    headline = result["heldout_metrics"][0] if result["heldout_metrics"] else None
    over = result.get("policies") is not None
    md = [
        "",
        "## Runs",
        "",
        "| method | " + ("policy | " if over else "") + "seed | steps | total reward (last) | "
        "length (last) | " + (f"held-out {headline} (end) | " if headline else "") + "train s | eval s |",
        "|---|" + ("---:|" if over else "") + "---:|---:|---:|---:|" + ("---:|" if headline else "") + "---:|---:|",
    ]
    for r in result["runs"]:
        held = _num(r["heldout"].get(headline, {}).get("end")) + " | " if headline else ""
        policy = f"{r.get('policy')} | " if over else ""
        md.append(
            f"| {r['method']} | {policy}{r['seed']} | {r['steps']} | {_num(r['final'].get('reward'))} | "
            f"{_num(r['final'].get('completions/mean_length'))} | {held}{r.get('train_s')} | {r.get('eval_s')} |"
        )
    return md


def markdown(result: Mapping[str, Any], pngs: Mapping[str, Path]) -> str:
    """``comparison.md``: header, tables (training, held-out, 95% CIs, paired tests, over policies
    the two-level intervals, steps to target, shared samples, runs) and the figures."""
    md = [
        *_header(result),
        *_tables(result),
        *_paired_table(result),
        *_two_level_table(result),
        *_steps_to_target_table(result),
        *_shared_table(result),
        *_runs_table(result),
    ]
    if pngs:
        md += ["", "## Curves", "", *(f"![{name}]({p.name})" for name, p in pngs.items())]
    return "\n".join([*md, ""])
