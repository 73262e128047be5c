"""The held-out side of a run: the ``eval_*`` lines TRL logs when ``eval_strategy`` is set, as a
table (first and last evaluation) and a curve panel.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

Records = Sequence[Mapping[str, Any]]

#: Evaluation keys that measure the machine, not the policy (left out of the table and the curves).
_TIMING = ("eval_runtime", "eval_samples_per_second", "eval_steps_per_second")


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def eval_records(records: Records) -> list[Mapping[str, Any]]:
    """The evaluation lines (any ``eval_*`` key), one per step (the last wins), in step order."""
    by_step: dict[int, Mapping[str, Any]] = {}
    for r in records:
        if any(k.startswith("eval_") for k in r):
            by_step[int(r.get("step", 0))] = r
    return [by_step[s] for s in sorted(by_step)]


def eval_keys(records: Records) -> list[str]:
    """The held-out reward keys, total first then each reward's mean (``eval_rewards/<n>/mean``),
    then the other numeric ``eval_*`` keys, in first-seen order."""
    seen: list[str] = []
    for r in eval_records(records):
        seen += [k for k, v in r.items() if k.startswith("eval_") and k not in _TIMING and _number(v) and k not in seen]
    rewards = [k for k in seen if k.startswith("eval_rewards/") and k.endswith("/mean")]
    first = [k for k in ("eval_reward",) if k in seen] + rewards
    return first + [
        k
        for k in seen
        if k not in first and not k.startswith("eval_rewards/") and not k.endswith("_std") and "/std" not in k
    ]


def eval_series(records: Records, key: str) -> tuple[list[int], list[float]]:
    """``(steps, values)`` of held-out ``key`` where it is a finite number."""
    pairs = [(int(r.get("step", 0)), float(r[key])) for r in eval_records(records) if _number(r.get(key))]
    return [s for s, _ in pairs], [v for _, v in pairs]


def eval_rows(records: Records) -> list[dict[str, Any]]:
    """``{name, first_step, first, last_step, last}`` per held-out key (see :func:`eval_keys`)."""
    rows = []
    for key in eval_keys(records):
        steps, values = eval_series(records, key)
        if steps:
            rows.append(
                {"name": key, "first_step": steps[0], "first": values[0], "last_step": steps[-1], "last": values[-1]}
            )
    return rows


def draw_held_out(ax, records: Records) -> bool:
    """Plot the held-out total reward and each reward's mean against the step (a ``{0,1}`` reward
    with its Wilson interval, ``n`` read from its logged std: :mod:`mrtpo.report.stats`); False if none."""
    from mrtpo.report.stats import binary_count, is_binary, reward_bands

    drawn = False
    for key in [k for k in eval_keys(records) if k == "eval_reward" or k.startswith("eval_rewards/")]:
        steps, values = eval_series(records, key)
        if not steps:
            continue
        label = "total" if key == "eval_reward" else key[len("eval_rewards/") : -len("/mean")]
        line = ax.plot(steps, values, marker="o", label=label)[0]
        std = dict(zip(*eval_series(records, key[: -len("mean")] + "std"))) if key != "eval_reward" else {}
        if std and all(s in std for s in steps) and is_binary(list(zip(values, [std[s] for s in steps]))):
            counts = [n for n in (binary_count(v, std[s]) for s, v in zip(steps, values)) if n]
            lows, highs, _ = reward_bands(values, [std[s] for s in steps], True, max(set(counts), key=counts.count))
            ax.fill_between(steps, lows, highs, alpha=0.2, color=line.get_color())
        drawn = True
    if drawn:
        ax.legend(fontsize=7)
    return drawn


__all__ = ["draw_held_out", "eval_keys", "eval_records", "eval_rows", "eval_series"]
