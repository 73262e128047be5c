"""Training curves from ``metrics.jsonl`` (matplotlib, PNG).

:func:`plot_run` draws one run: a panel per reward (its mean per step with a 95 % band: Wilson's
interval for a ``{0,1}`` reward, :mod:`mrtpo.report.stats`), the total reward, completion length,
loss, the time each step spent in generation / scoring / replay / update, (when logged) each
reward's credit concentration and mean relevance, the held-out rewards and the diagnostics.
:func:`plot_runs` overlays several runs (methods, seeds) on the same panels (``mrtpo report
--compare``). Both
read the keys TRL and :class:`~mrtpo.trainer.MRTPOTrainer` log: ``rewards/<name>/mean|std``,
``reward``, ``reward_std``, ``completions/mean_length``, ``loss``, ``time/<phase>``.
"""

from __future__ import annotations

import math
import os
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mrtpo.report.records import Records, load_metrics, reward_names, series, step_records
from mrtpo.report.stats import binary_count, config_count, is_binary, reward_bands

TIME_PHASES = ("generation", "scoring", "replay", "update")

__all__ = [
    "TIME_PHASES",
    "BandRule",
    "band_rule",
    "draw_mean",
    "empty",
    "load_metrics",
    "plot_run",
    "plot_runs",
    "Records",
    "reward_names",
    "series",
    "step_records",
]


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


@dataclass(frozen=True)
class BandRule:
    """How a run's reward bands are drawn: the ``{0,1}`` rewards (a proportion with Wilson intervals)
    and ``n_hint``, the completions behind a step's mean where the logs do not give it."""

    binary: frozenset[str] = frozenset()
    n_hint: int | None = None


def band_rule(
    records: Records, config: Mapping[str, Any] | None = None, samples: Sequence[Mapping[str, Any]] = ()
) -> BandRule:
    """Which rewards are ``{0,1}`` (:func:`mrtpo.report.stats.is_binary` over the logged steps and the
    credit samples' values) and the run's ``n`` per step: the most common ``n`` those rewards' steps
    imply (it counts every process), else :func:`mrtpo.report.stats.config_count`."""
    binary, counts = set(), Counter()
    steps = step_records(records)
    for name in reward_names(records):
        pairs = [
            (float(r[f"rewards/{name}/mean"]), float(r[f"rewards/{name}/std"]))
            for r in steps
            if _finite(r.get(f"rewards/{name}/mean")) and _finite(r.get(f"rewards/{name}/std"))
        ]
        values = [s.get("rewards", {}).get(name) for s in samples]
        if pairs and is_binary(pairs, values):
            binary.add(name)
            counts.update(n for n in (binary_count(m, s) for m, s in pairs) if n)
    n_hint = counts.most_common(1)[0][0] if counts else config_count(config or {})
    return BandRule(frozenset(binary), n_hint)


def _finite(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _paired(records: Records, mean_key: str, std_key: str | None) -> tuple[list[int], list[float], list[float] | None]:
    """Steps and means of ``mean_key`` with the std of each (None if any step lacks it)."""
    steps, means = series(records, mean_key)
    if std_key is None:
        return steps, means, None
    sd = dict(zip(*series(records, std_key)))
    return steps, means, ([sd[s] for s in steps] if all(s in sd for s in steps) else None)


def draw_mean(
    ax,
    records: Records,
    mean_key: str,
    std_key: str | None = None,
    *,
    binary: bool = False,
    n_hint: int | None = None,
    label: str | None = None,
    colour=None,
) -> str | None:
    """Plot ``mean_key`` per step with its 95 % band (:func:`mrtpo.report.stats.reward_bands`);
    return the band's description, or None when the key was never logged."""
    steps, means, stds = _paired(records, mean_key, std_key)
    if not steps:
        return None
    line = ax.plot(steps, means, marker="o" if len(steps) < 30 else None, ms=3, label=label, color=colour)[0]
    lows, highs, what = reward_bands(means, stds, binary, n_hint)
    if std_key is not None and stds is not None:
        ax.fill_between(steps, lows, highs, alpha=0.2, color=line.get_color())
    return what


def _grid(plt, count: int, title: str | None):
    cols = min(3, count)
    rows = math.ceil(count / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.6 * cols, 3.3 * rows), squeeze=False)
    if title:
        fig.suptitle(title)
    flat = [ax for row in axes for ax in row]
    for ax in flat[count:]:
        ax.axis("off")
    return fig, flat


def _steps_axis(ax, title: str | None = None):
    from matplotlib.ticker import MaxNLocator

    if title:
        ax.set_title(title, fontsize=9)
    ax.set_xlabel("step")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(alpha=0.3)


def empty(ax, text="not in metrics.jsonl"):
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, color="#a33", fontsize=8)


def _save(plt, fig, out: str | os.PathLike) -> Path:
    # fixed margins in inches (tight_layout measures every label: seconds on a busy CPU)
    height = fig.get_figheight()
    fig.subplots_adjust(
        left=0.06,
        right=0.98,
        bottom=0.5 / height,
        top=1 - (1.0 if fig.get_suptitle() else 0.6) / height,
        hspace=0.6,
        wspace=0.25,
    )
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with plt.rc_context({"svg.fonttype": "none"}):  # an SVG keeps its labels as text
        fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def _time_bars(ax, records: Records) -> None:
    bottom: dict[int, float] = {}
    for phase in TIME_PHASES:
        steps, values = series(records, f"time/{phase}")
        if steps:
            ax.bar(steps, values, bottom=[bottom.get(s, 0.0) for s in steps], label=phase, width=0.8)
            for s, v in zip(steps, values):
                bottom[s] = bottom.get(s, 0.0) + v
    if bottom:
        ax.set_ylim(0, max(bottom.values()) * 1.45 or 1.0)  # headroom for the legend
        ax.legend(fontsize=8, ncol=2, loc="upper center")
    else:
        empty(ax)


def plot_run(
    metrics: str | os.PathLike | Records,
    out: str | os.PathLike,
    title: str | None = None,
    rule: BandRule | None = None,
    config: Mapping[str, Any] | None = None,
) -> Path:
    """One run's curves as a PNG at ``out``; ``metrics`` is a metrics.jsonl, run folder or records.

    Panels: each reward (``{0,1}`` rewards as proportions with Wilson intervals, others with the 95 %
    interval of the mean; ``rule`` from :func:`band_rule`), total reward, length, loss, time split,
    credit concentration and relevance (when logged), held-out rewards, and the diagnostics
    (:mod:`mrtpo.report.diagnostics`; a metric the run did not log is named as missing)."""
    from mrtpo.report.diagnostics import diagnostics, draw_diagnostic
    from mrtpo.report.held_out import draw_held_out

    records = load_metrics(metrics) if isinstance(metrics, (str, os.PathLike)) else list(metrics)
    rule = rule or band_rule(records, config)
    plt = _pyplot()
    names = reward_names(records)
    credit = [
        (t, suffix)
        for t, suffix in (
            ("credit share of the top 10% tokens", "top10_share"),
            ("mean relevance (replay distance)", "relevance_mean"),
        )
        if any(series(records, f"credit/{n}/{suffix}")[0] for n in names)
    ]
    panels = diagnostics(records, config)
    fig, axes = _grid(plt, len(names) + 5 + len(credit) + len(panels), title)
    it = iter(axes)
    for n in names:
        ax = next(it)
        what = draw_mean(
            ax, records, f"rewards/{n}/mean", f"rewards/{n}/std", binary=n in rule.binary, n_hint=rule.n_hint
        )
        _steps_axis(ax, f"reward: {n}\n{what or ''}")
        if what is None:
            empty(ax)
        flat = series(records, f"skip/zero_spread/{n}")[1]
        if flat and all(v == 1.0 for v in flat):
            ax.text(
                0.5,
                0.2,
                "no spread in any group at any step:\nskipped, it moved no token",
                ha="center",
                transform=ax.transAxes,
                color="#a33",
                fontsize=8,
            )
    for t, key, std_key in (
        ("total reward", "reward", "reward_std"),
        ("completion length (tokens)", "completions/mean_length", None),
        ("loss", "loss", None),
    ):
        ax = next(it)
        what = draw_mean(ax, records, key, std_key, n_hint=rule.n_hint)
        _steps_axis(ax, t + (f"\n{what}" if std_key and what else ""))
        if what is None:
            empty(ax)
    ax = next(it)
    _steps_axis(ax, "time per step (s)")
    _time_bars(ax, records)
    for t, suffix in credit:
        ax = next(it)
        _steps_axis(ax, t)
        for n in names:
            draw_mean(ax, records, f"credit/{n}/{suffix}", label=n)
        ax.legend(fontsize=7)
    ax = next(it)
    _steps_axis(ax, "held-out reward (eval)")
    if not draw_held_out(ax, records):
        empty(ax, "no held-out evaluation in metrics.jsonl\n(eval_strategy: no, or eval_size: 0)")
    for panel in panels:
        ax = next(it)
        _steps_axis(ax)
        draw_diagnostic(ax, records, panel)
    return _save(plt, fig, out)


def plot_runs(
    runs: Mapping[str, str | os.PathLike | Records],
    out: str | os.PathLike,
    title: str | None = None,
    rules: Mapping[str, BandRule] | None = None,
) -> Path:
    """Several runs overlaid (one colour per label, the legend naming each): each reward (with the
    bands of :func:`draw_mean`), total reward, held-out total reward, length, loss, grad norm, and
    the mean time per step of each phase as grouped bars. ``runs``: label → metrics source;
    ``rules``: label → :class:`BandRule` (default: :func:`band_rule` of that run's metrics)."""
    from mrtpo.report.held_out import eval_series

    loaded = {
        label: load_metrics(src) if isinstance(src, (str, os.PathLike)) else list(src) for label, src in runs.items()
    }
    if not loaded:
        raise ValueError("plot_runs needs at least one run")
    rules = {label: (rules or {}).get(label) or band_rule(rec) for label, rec in loaded.items()}
    names: list[str] = []
    for records in loaded.values():
        names += [n for n in reward_names(records) if n not in names]
    plt = _pyplot()
    fig, axes = _grid(plt, len(names) + 6, title)
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    keys = [(f"reward: {n}", f"rewards/{n}/mean", f"rewards/{n}/std", n) for n in names]
    keys += [
        ("total reward (95% interval of the mean)", "reward", "reward_std", None),
        ("completion length (tokens)", "completions/mean_length", None, None),
        ("loss", "loss", None, None),
        ("grad norm", "grad_norm", None, None),
    ]
    for ax, (t, mean_key, std_key, name) in zip(axes, keys):
        drawn = [
            draw_mean(
                ax,
                rec,
                mean_key,
                std_key,
                binary=name in rules[label].binary,
                n_hint=rules[label].n_hint,
                label=label,
                colour=colours[i % len(colours)],
            )
            for i, (label, rec) in enumerate(loaded.items())
        ]
        kinds = sorted({d for d in drawn if d})
        _steps_axis(ax, t + ("\n" + "; ".join(kinds) if name and kinds else ""))
        missing = [label for label, d in zip(loaded, drawn) if d is None]
        if len(missing) < len(loaded):
            ax.legend(fontsize=7)
        if missing:
            empty(ax, "not in metrics.jsonl of: " + ", ".join(missing))
    ax = axes[len(keys)]
    _steps_axis(ax, "held-out total reward (eval)")
    held = False
    for i, (label, rec) in enumerate(loaded.items()):
        steps, values = eval_series(rec, "eval_reward")
        if steps:
            ax.plot(steps, values, marker="o", label=label, color=colours[i % len(colours)])
            held = True
    if held:
        ax.legend(fontsize=7)
    else:
        empty(ax, "no run evaluated (no eval_reward in metrics.jsonl)")
    ax = axes[len(keys) + 1]
    ax.set_title("mean time per step (s)", fontsize=9)
    width = 0.8 / len(loaded)
    for i, (label, rec) in enumerate(loaded.items()):
        means = []
        for phase in TIME_PHASES:
            _, values = series(rec, f"time/{phase}")
            means.append(sum(values) / len(values) if values else 0.0)
        ax.bar(
            [p + i * width for p in range(len(TIME_PHASES))],
            means,
            width=width,
            label=label,
            color=colours[i % len(colours)],
        )
    ax.set_xticks([p + width * (len(loaded) - 1) / 2 for p in range(len(TIME_PHASES))], TIME_PHASES, fontsize=8)
    ax.legend(fontsize=7)
    return _save(plt, fig, out)
