"""The run's health, from what ``metrics.jsonl`` holds: gradient norm, clip rate, KL to the reference,
and the share of groups where each reward had no spread (so it moved nothing that step).

Each panel names the keys it reads; a key the run did not log is said to be missing (with the
reason where the settings give it, e.g. TRL computes no KL at ``beta: 0``), never drawn as zero.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from mrtpo.report.records import Records, reward_names, series

__all__ = ["Diagnostic", "diagnostic_rows", "diagnostics", "draw_diagnostic"]


@dataclass(frozen=True)
class Diagnostic:
    """One panel: its title, ``(label, key)`` curves, and why a missing key is missing (or "")."""

    title: str
    curves: tuple[tuple[str, str], ...]
    why_missing: str = ""


def diagnostics(records: Records, config: Mapping[str, Any] | None = None) -> list[Diagnostic]:
    """The diagnostics panels of a run, in display order."""
    config = config or {}
    beta = config.get("beta")
    no_kl = "beta = 0: TRL computes no KL" if isinstance(beta, (int, float)) and beta == 0 else ""
    spread = tuple((n, f"skip/zero_spread/{n}") for n in reward_names(records)) + (
        ("total (TRL)", "frac_reward_zero_std"),
    )
    return [
        Diagnostic("grad norm (before clipping)", (("grad_norm", "grad_norm"),)),
        Diagnostic(
            "clip rate (share of tokens clipped)",
            (("region", "clip_ratio/region_mean"), ("low", "clip_ratio/low_mean"), ("high", "clip_ratio/high_mean")),
        ),
        Diagnostic("KL to the reference model", (("kl", "kl"),), no_kl),
        Diagnostic("share of groups with zero spread", spread),
    ]


def _missing(records: Records, panel: Diagnostic) -> list[str]:
    return [key for _, key in panel.curves if not series(records, key)[0]]


def draw_diagnostic(ax, records: Records, panel: Diagnostic) -> None:
    """Draw ``panel``'s logged curves on ``ax``; say in the panel which keys are not in metrics.jsonl."""
    ax.set_title(panel.title, fontsize=10)
    drawn = 0
    for label, key in panel.curves:
        steps, values = series(records, key)
        if steps:
            ax.plot(steps, values, marker="o" if len(steps) < 30 else None, ms=3, label=label)
            drawn += 1
    missing = _missing(records, panel)
    if missing:
        note = "not in metrics.jsonl: " + ", ".join(missing)
        if panel.why_missing:
            note += f"\n({panel.why_missing})"
        y = 0.5 if not drawn else 0.04
        ax.text(
            0.5,
            y,
            note,
            ha="center",
            va="center" if not drawn else "bottom",
            transform=ax.transAxes,
            color="#a33",
            fontsize=7,
            wrap=True,
        )
    if drawn > 1:
        ax.legend(fontsize=7)


def diagnostic_rows(records: Records, config: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
    """``{panel, label, key, first, last, mean, missing}`` per diagnostics curve, for the report's table."""
    rows = []
    for panel in diagnostics(records, config):
        for label, key in panel.curves:
            steps, values = series(records, key)
            row: dict[str, Any] = {"panel": panel.title, "label": label, "key": key, "missing": not steps}
            if steps:
                row.update(first=values[0], last=values[-1], mean=sum(values) / len(values))
            elif panel.why_missing:
                row["why"] = panel.why_missing
            rows.append(row)
    return rows


def missing_keys(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """The keys of :func:`diagnostic_rows` that the run did not log."""
    return [r["key"] for r in rows if r["missing"]]
