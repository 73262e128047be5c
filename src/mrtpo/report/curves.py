"""Training curves from ``metrics.jsonl`` (matplotlib, PNG).

:func:`plot_run` draws one run: a panel per reward (its mean per step with a ±std band), the
total reward, completion length, loss, the time each step spent in generation / scoring /
replay / update, and (when logged) each reward's credit concentration and mean relevance.
:func:`plot_runs` overlays several runs (methods, seeds) on the same panels for benchmarks. Both
read the keys TRL and :class:`~mrtpo.trainer.MRTPOTrainer` log: ``rewards/<name>/mean|std``,
``reward``, ``reward_std``, ``completions/mean_length``, ``loss``, ``time/<phase>``.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

TIME_PHASES = ("generation", "scoring", "replay", "update")

__all__ = ["TIME_PHASES", "json_lines", "load_metrics", "plot_run", "plot_runs", "reward_names", "series",
           "step_records", "torn_last_line"]

Records = Sequence[Mapping[str, Any]]


def load_metrics(path: str | os.PathLike) -> list[dict[str, Any]]:
    """All JSON lines of a ``metrics.jsonl`` (a run folder is accepted too)."""
    path = Path(path)
    if path.is_dir():
        path = path / "metrics.jsonl"
    if not path.is_file():
        raise FileNotFoundError(f"no metrics file at {path} (a run writes <output_dir>/metrics.jsonl)")
    return json_lines(path)


def json_lines(path: Path) -> list[dict[str, Any]]:
    """The JSON lines of ``path``, leaving out a torn last one (no newline, not JSON: a write cut short by a
    crash, which ``--resume`` drops too; :func:`torn_last_line` tells); a bad line elsewhere is a ValueError."""
    text = path.read_text()
    lines = text.splitlines()
    if torn_last_line(text):
        lines = lines[:-1]
    out = []
    for number, line in enumerate(lines, 1):
        if line.strip():
            try:
                out.append(json.loads(line))
            except ValueError:
                raise ValueError(f"{path.name} line {number} is not JSON: {line[:60]!r}") from None
    return out


def torn_last_line(text: str) -> bool:
    """Whether ``text`` ends in a line cut short: no newline after it, and not JSON."""
    if not text or text.endswith("\n"):
        return False
    try:
        json.loads(text.rsplit("\n", 1)[-1])
    except ValueError:
        return True
    return False


def step_records(records: Records) -> list[Mapping[str, Any]]:
    """The per-step training lines: those with a loss or rewards, not the end-of-training summary
    nor evaluation lines; the last line wins if a step was logged twice."""
    by_step: dict[int, Mapping[str, Any]] = {}
    for r in records:
        if "train_runtime" in r or any(k.startswith("eval_") for k in r):
            continue
        if "loss" in r or "reward" in r:
            by_step[int(r.get("step", 0))] = r
    return [by_step[s] for s in sorted(by_step)]


def reward_names(records: Records) -> list[str]:
    """Reward names in the order they first appear (``rewards/<name>/mean`` keys)."""
    names: list[str] = []
    for r in records:
        for key in r:
            if key.startswith("rewards/") and key.endswith("/mean"):
                name = key[len("rewards/"):-len("/mean")]
                if name not in names:
                    names.append(name)
    return names


def series(records: Records, key: str) -> tuple[list[int], list[float]]:
    """``(steps, values)`` of ``key`` over the step records where it is a finite number."""
    steps, values = [], []
    for r in step_records(records):
        v = r.get(key)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
            steps.append(int(r["step"]))
            values.append(float(v))
    return steps, values


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _band(ax, records: Records, mean_key: str, std_key: str | None, label: str | None = None, colour=None):
    steps, mean = series(records, mean_key)
    if not steps:
        return False
    line = ax.plot(steps, mean, marker="o" if len(steps) < 30 else None, ms=3, label=label, color=colour)[0]
    if std_key is not None:
        s_steps, std = series(records, std_key)
        sd = dict(zip(s_steps, std))
        if all(s in sd for s in steps):
            lo = [m - sd[s] for s, m in zip(steps, mean)]
            hi = [m + sd[s] for s, m in zip(steps, mean)]
            ax.fill_between(steps, lo, hi, alpha=0.2, color=line.get_color())
    return True


def _panels(names: list[str]) -> list[tuple[str, str, str | None]]:
    """(title, mean key, std key) for each curve panel, in display order."""
    out = [(f"reward: {n}", f"rewards/{n}/mean", f"rewards/{n}/std") for n in names]
    out += [("total reward", "reward", "reward_std"), ("completion length (tokens)", "completions/mean_length", None),
            ("loss", "loss", None)]
    return out


def _grid(plt, count: int, title: str | None):
    cols = min(3, count)
    rows = math.ceil(count / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.6 * cols, 3.2 * rows), squeeze=False)
    if title:
        fig.suptitle(title)
    flat = [ax for row in axes for ax in row]
    for ax in flat[count:]:
        ax.axis("off")
    return fig, flat


def _steps_axis(ax):
    from matplotlib.ticker import MaxNLocator

    ax.set_xlabel("step")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def _empty(ax, text="not logged"):
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, color="#888")


def plot_run(metrics: str | os.PathLike | Records, out: str | os.PathLike, title: str | None = None) -> Path:
    """One run's curves as a PNG at ``out``; ``metrics`` is a metrics.jsonl, run folder or records."""
    records = load_metrics(metrics) if isinstance(metrics, (str, os.PathLike)) else list(metrics)
    plt = _pyplot()
    names = reward_names(records)
    panels = _panels(names)
    credit = [(title, suffix) for title, suffix in (("credit share of the top 10% tokens", "top10_share"),
                                                    ("mean relevance (replay distance)", "relevance_mean"))
              if any(series(records, f"credit/{n}/{suffix}")[0] for n in names)]
    from mrtpo.report.held_out import draw_held_out, eval_records

    held_out = bool(eval_records(records))
    fig, axes = _grid(plt, len(panels) + 1 + len(credit) + held_out, title)
    for ax, (name, mean_key, std_key) in zip(axes, panels):
        ax.set_title(name, fontsize=10)
        _steps_axis(ax)
        if not _band(ax, records, mean_key, std_key):
            _empty(ax)
        ax.grid(alpha=0.3)
    for ax, (name, suffix) in zip(axes[len(panels) + 1:], credit):
        ax.set_title(name, fontsize=10)
        _steps_axis(ax)
        for n in names:
            _band(ax, records, f"credit/{n}/{suffix}", None, label=n)
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
    if held_out:
        ax = axes[len(panels) + 1 + len(credit)]
        ax.set_title("held-out reward (eval)", fontsize=10)
        _steps_axis(ax)
        draw_held_out(ax, records)
        ax.grid(alpha=0.3)
    ax = axes[len(panels)]
    ax.set_title("time per step (s)", fontsize=10)
    _steps_axis(ax)
    bottom: dict[int, float] = {}
    drawn = False
    for phase in TIME_PHASES:
        steps, values = series(records, f"time/{phase}")
        if not steps:
            continue
        ax.bar(steps, values, bottom=[bottom.get(s, 0.0) for s in steps], label=phase, width=0.8)
        for s, v in zip(steps, values):
            bottom[s] = bottom.get(s, 0.0) + v
        drawn = True
    if drawn:
        ax.set_ylim(0, max(bottom.values()) * 1.45 or 1.0)  # headroom for the legend
        ax.legend(fontsize=8, ncol=2, loc="upper center")
    else:
        _empty(ax)
    fig.tight_layout()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def plot_runs(runs: Mapping[str, str | os.PathLike | Records], out: str | os.PathLike,
              title: str | None = None) -> Path:
    """Several runs overlaid (one colour per label): each reward, total reward, length, loss, and
    the mean time per step of each phase as grouped bars. ``runs``: label → metrics source."""
    loaded = {label: load_metrics(src) if isinstance(src, (str, os.PathLike)) else list(src)
              for label, src in runs.items()}
    if not loaded:
        raise ValueError("plot_runs needs at least one run")
    names: list[str] = []
    for records in loaded.values():
        names += [n for n in reward_names(records) if n not in names]
    plt = _pyplot()
    panels = _panels(names)
    fig, axes = _grid(plt, len(panels) + 1, title)
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, (name, mean_key, std_key) in zip(axes, panels):
        ax.set_title(name, fontsize=10)
        _steps_axis(ax)
        drawn = [_band(ax, rec, mean_key, std_key, label, colours[i % len(colours)])
                 for i, (label, rec) in enumerate(loaded.items())]
        if any(drawn):
            ax.legend(fontsize=7)
        else:
            _empty(ax)
        ax.grid(alpha=0.3)
    ax = axes[len(panels)]
    ax.set_title("mean time per step (s)", fontsize=10)
    width = 0.8 / len(loaded)
    for i, (label, rec) in enumerate(loaded.items()):
        means = []
        for phase in TIME_PHASES:
            _, values = series(rec, f"time/{phase}")
            means.append(sum(values) / len(values) if values else 0.0)
        ax.bar([p + i * width for p in range(len(TIME_PHASES))], means, width=width, label=label,
               color=colours[i % len(colours)])
    ax.set_xticks([p + width * (len(loaded) - 1) / 2 for p in range(len(TIME_PHASES))], TIME_PHASES, fontsize=8)
    ax.legend(fontsize=7)
    fig.tight_layout()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
