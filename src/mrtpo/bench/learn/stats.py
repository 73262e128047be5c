"""Statistics of a learning benchmark: pure functions on numbers and ``metrics.jsonl`` records.

Steps to a target reward, per-step curves over seeds, a mean with its Student-t 95% confidence
interval, a paired comparison of two methods over the seeds they share (paired t-test and an
exact sign-flip permutation test), the same over policies and seeds (a two-level interval: t over
policies and a two-stage bootstrap), a run's value after a given number of training seconds (the
equal-wall-clock comparison), and the share of sampled completions two runs have in common.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from typing import Any

CONFIDENCE = 0.95
#: Above this many pairs the exact sign-flip test (2^n sign patterns) is not computed.
MAX_SIGN_FLIP_PAIRS = 16
#: Resamples of the two-level bootstrap, and its fixed RNG seed (the interval is reproducible).
BOOTSTRAP_RESAMPLES = 10000
BOOTSTRAP_SEED = 0
#: The paired measure of the total reward at equal training seconds (the reference's whole run).
EQUAL_TIME = "reward_at_equal_time"

__all__ = [
    "BOOTSTRAP_RESAMPLES",
    "BOOTSTRAP_SEED",
    "CONFIDENCE",
    "aggregate_curves",
    "describe",
    "finite",
    "paired_comparison",
    "shared_samples",
    "sign_flip_p_value",
    "steps_to_target",
    "summarise_steps_to_target",
    "t_quantile",
    "tail_mean",
    "training_seconds",
    "two_level_interval",
    "value_at_seconds",
]


def finite(v: Any) -> bool:
    """A real number that is not NaN or infinite (bools are not numbers here)."""
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def t_quantile(p: float, df: int) -> float:
    """The ``p`` quantile of Student's t distribution with ``df`` degrees of freedom."""
    from scipy.stats import t

    return float(t.ppf(p, df))


def _t_two_sided_p(t_value: float, df: int) -> float:
    from scipy.stats import t

    return float(2 * t.sf(abs(t_value), df))


def describe(values: Sequence[Any], confidence: float = CONFIDENCE) -> dict[str, Any]:
    """mean, sample std, min, max, n of the finite ``values`` and ``ci95``: the Student-t
    confidence interval of the mean ``[low, high]`` (None below two values: no spread to use)."""
    vals = [float(v) for v in values if finite(v)]
    if not vals:
        return {"mean": None, "std": None, "min": None, "max": None, "n": 0, "ci95": None}
    n = len(vals)
    mean = sum(vals) / n
    std = math.sqrt(sum((v - mean) ** 2 for v in vals) / (n - 1)) if n > 1 else None
    ci = None
    if std is not None:
        half = t_quantile(0.5 + confidence / 2, n - 1) * std / math.sqrt(n)
        ci = [mean - half, mean + half]
    return {"mean": mean, "std": std, "min": min(vals), "max": max(vals), "n": n, "ci95": ci}


def sign_flip_p_value(differences: Sequence[float]) -> float | None:
    """Exact two-sided permutation p-value of a zero mean paired difference: the share of the 2^n
    sign patterns whose mean is at least as far from 0 as the observed one (None above
    :data:`MAX_SIGN_FLIP_PAIRS` pairs or without pairs). Assumes nothing about the distribution
    beyond symmetry under the null; with n pairs it cannot go below 2 / 2^n."""
    d = [float(x) for x in differences]
    if not d or len(d) > MAX_SIGN_FLIP_PAIRS:
        return None
    observed = abs(sum(d))
    tolerance = 1e-12 * max(1.0, observed)
    hits = sum(
        abs(sum(s * x for s, x in zip(signs, d))) >= observed - tolerance
        for signs in itertools.product((1, -1), repeat=len(d))
    )
    return hits / 2 ** len(d)


def paired_comparison(
    method: Mapping[Any, Any], reference: Mapping[Any, Any], confidence: float = CONFIDENCE
) -> dict[str, Any]:
    """``method − reference`` paired over the keys (seeds) where both have a finite value.

    Returns the pairs used (``seeds``, ``n``), the mean and sample std of the differences, the
    Student-t ``ci95`` of the mean difference, the paired t statistic with its two-sided
    ``p_value`` (None below two pairs, or when every difference is the same: no spread), and
    ``p_sign_flip`` (:func:`sign_flip_p_value`).
    """
    seeds = [s for s in method if s in reference and finite(method[s]) and finite(reference[s])]
    diffs = [float(method[s]) - float(reference[s]) for s in seeds]
    stats = describe(diffs, confidence)
    out: dict[str, Any] = {
        "seeds": [str(s) for s in seeds],
        "n": len(diffs),
        "mean_difference": stats["mean"],
        "std_difference": stats["std"],
        "ci95": stats["ci95"],
        "t": None,
        "df": None,
        "p_value": None,
        "p_sign_flip": sign_flip_p_value(diffs),
    }
    if stats["std"]:  # at least two pairs with some spread
        out["t"] = stats["mean"] / (stats["std"] / math.sqrt(len(diffs)))
        out["df"] = len(diffs) - 1
        out["p_value"] = _t_two_sided_p(out["t"], out["df"])
    return out


def two_level_interval(
    differences: Mapping[Any, Sequence[Any]],
    confidence: float = CONFIDENCE,
    resamples: int = BOOTSTRAP_RESAMPLES,
    rng_seed: int = BOOTSTRAP_SEED,
) -> dict[str, Any]:
    """The mean paired difference over policies, with intervals that cover both the policy and the seed.

    ``differences`` is ``{policy: [paired difference per seed]}`` (non-finite values dropped, a
    policy left without any left out). Each policy weighs the same: ``mean`` is the mean of the
    per-policy means. A policy's mean already carries its seeds' noise, so the spread of the
    per-policy means holds both levels and ``ci95_t`` is the Student-t interval over policies
    (df = policies - 1). ``ci95_bootstrap`` is the percentile interval of a two-stage bootstrap
    (draw the policies with replacement, then each drawn policy's seeds with replacement; fixed
    ``rng_seed``). ``between_policy_std``: sample std of the per-policy means;
    ``within_policy_std``: the pooled std of seeds around their policy's mean. Intervals, t and p
    are None below two policies (no policy-level spread to use).
    """
    import numpy as np

    groups = {str(p): [float(v) for v in vals if finite(v)] for p, vals in differences.items()}
    groups = {p: v for p, v in groups.items() if v}
    means = {p: sum(v) / len(v) for p, v in groups.items()}
    between = describe(list(means.values()), confidence)
    dof_within = sum(len(v) - 1 for v in groups.values())
    within = (
        math.sqrt(sum((x - means[p]) ** 2 for p, v in groups.items() for x in v) / dof_within) if dof_within else None
    )
    pairs = [x for v in groups.values() for x in v]
    out: dict[str, Any] = {
        "policies": list(groups),
        "n_policies": len(groups),
        "n_pairs": len(pairs),
        "positive": sum(x > 0 for x in pairs),
        "per_policy_mean": means,
        "mean": between["mean"],
        "between_policy_std": between["std"],
        "within_policy_std": within,
        "ci95_t": between["ci95"],
        "t": None,
        "df": None,
        "p_value": None,
        "ci95_bootstrap": None,
        "bootstrap": {"resamples": resamples, "rng_seed": rng_seed},
    }
    if len(groups) < 2:
        return out
    if between["std"]:
        out["t"] = between["mean"] / (between["std"] / math.sqrt(len(groups)))
        out["df"] = len(groups) - 1
        out["p_value"] = _t_two_sided_p(out["t"], out["df"])
    rng = np.random.default_rng(rng_seed)
    arrays = [np.asarray(v) for v in groups.values()]
    picks = rng.integers(0, len(arrays), size=(resamples, len(arrays)))
    drawn = np.empty(picks.shape)
    for j, values in enumerate(arrays):  # every slot that drew policy j: a resample of its seeds
        rows, cols = np.nonzero(picks == j)
        drawn[rows, cols] = values[rng.integers(0, len(values), size=(len(rows), len(values)))].mean(axis=1)
    low, high = np.quantile(drawn.mean(axis=1), [(1 - confidence) / 2, (1 + confidence) / 2])
    out["ci95_bootstrap"] = [float(low), float(high)]
    return out


def training_seconds(records: Sequence[Mapping[str, Any]]) -> tuple[list[int], list[float]] | None:
    """``(steps, cumulative training seconds)`` from each step's ``step_time`` in metrics.jsonl
    (the trainer's own timing: evaluation is not in it). None unless steps 1..n each logged one
    (with ``logging_steps`` > 1 the unlogged steps' time is unknown)."""
    from mrtpo.report.curves import series

    steps, times = series(records, "step_time")
    if not steps or steps != list(range(1, len(steps) + 1)):
        return None
    return steps, list(itertools.accumulate(times))


def value_at_seconds(
    records: Sequence[Mapping[str, Any]], key: str, seconds: float, tail: int
) -> dict[str, Any] | None:
    """A run's ``key`` (mean of its last ``tail`` logged values) at the last step whose cumulative
    training time (:func:`training_seconds`) is within ``seconds``: the value it had reached with
    that much training. ``ran_out`` is True when the run ended before using ``seconds`` (its last
    step then: a value reached with less time). None without per-step times or before one step
    fits the budget."""
    from mrtpo.report.curves import series

    timed = training_seconds(records)
    if timed is None:
        return None
    steps, cumulative = timed
    within = [s for s, c in zip(steps, cumulative) if c <= seconds * (1 + 1e-12)]
    if not within:
        return None
    step = within[-1]
    logged, values = series(records, key)
    value = tail_mean([v for s, v in zip(logged, values) if s <= step], tail)
    return {
        "step": step,
        "seconds": cumulative[step - 1],
        "value": value,
        "ran_out": step == steps[-1] and cumulative[-1] < seconds * (1 - 1e-12),
    }


def steps_to_target(
    records: Sequence[Mapping[str, Any]], target: float, key: str = "reward", window: int = 1
) -> int | None:
    """The first logged step at which ``key`` reaches ``target``; None if it never does.

    ``records`` are metrics.jsonl lines; only per-step training lines count (the end-of-training
    summary and eval lines are ignored, a step logged twice keeps its last line). With
    ``window > 1`` the value compared is the mean of the last ``window`` logged values up to and
    including that step (fewer at the start), which damps single lucky batches.
    """
    from mrtpo.report.curves import series

    if window < 1:
        raise ValueError(f"window must be >= 1, got {window}")
    steps, values = series(records, key)
    for i, step in enumerate(steps):
        recent = values[max(0, i - window + 1) : i + 1]
        if sum(recent) / len(recent) >= target:
            return step
    return None


def summarise_steps_to_target(per_seed: Mapping[int, int | None], max_steps: int | None = None) -> dict[str, Any]:
    """Per method: how many seeds reached the target, and the mean (with ``std`` and ``ci95``) of
    the steps over those that did.

    A seed that never reached it is not averaged in (its step count is unknown, only "more than
    the run's length"); ``text`` says so, e.g. ``"3.5 (2/3 seeds; 1 not reached within 8 steps)"``.
    """
    reached = [s for s in per_seed.values() if s is not None]
    n, k = len(per_seed), len(reached)
    stats = describe(reached)
    mean = stats["mean"]
    within = f" within {max_steps} steps" if max_steps else ""
    if not n:
        text = "no runs"
    elif k == 0:
        text = f"not reached (0/{n} seeds{within})"
    elif k == n:
        text = f"{mean:.1f} ({k}/{n} seeds)"
    else:
        text = f"{mean:.1f} ({k}/{n} seeds; {n - k} not reached{within})"
    return {
        "per_seed": {str(s): v for s, v in per_seed.items()},
        "reached": k,
        "of": n,
        "mean": mean,
        "std": stats["std"],
        "ci95": stats["ci95"],
        "text": text,
    }


def aggregate_curves(per_seed: Mapping[Any, tuple[Sequence[int], Sequence[float]]]) -> dict[str, list]:
    """Mean / min / max over seeds at every step any seed logged (``n`` seeds at that step)."""
    by_step: dict[int, list[float]] = {}
    for steps, values in per_seed.values():
        for s, v in zip(steps, values):
            if finite(v):
                by_step.setdefault(int(s), []).append(float(v))
    out: dict[str, list] = {"steps": [], "mean": [], "min": [], "max": [], "n": []}
    for s in sorted(by_step):
        vals = by_step[s]
        out["steps"].append(s)
        out["mean"].append(sum(vals) / len(vals))
        out["min"].append(min(vals))
        out["max"].append(max(vals))
        out["n"].append(len(vals))
    return out


def tail_mean(values: Sequence[float], tail: int) -> float | None:
    """Mean of the last ``tail`` finite values (None if there are none)."""
    vals = [v for v in values if finite(v)][-tail:]
    return sum(vals) / len(vals) if vals else None


def shared_samples(reference: Sequence[Sequence[str]], other: Sequence[Sequence[str]]) -> dict[str, Any]:
    """How many of ``other``'s sampled completions are identical to ``reference``'s.

    Both are per generation batch, in order, lists of completion digests of two runs with the same
    seed (so the same prompts and sampling RNG). Until the updates move either policy enough to
    change one sampled token, the two runs sample the same completions and their rewards cannot
    differ. Returns ``share`` (identical / compared, over the batches both have), ``compared``,
    ``per_batch`` shares and ``first_different`` (index of the first batch with a difference, or
    None when every compared completion is identical).
    """
    per_batch, same, total = [], 0, 0
    for ref, oth in zip(reference, other):
        hits = sum(a == b for a, b in zip(ref, oth))
        n = max(len(ref), len(oth))
        per_batch.append(hits / n if n else 1.0)
        same, total = same + hits, total + n
    first = next((i for i, share in enumerate(per_batch) if share < 1.0), None)
    return {
        "share": same / total if total else None,
        "compared": total,
        "per_batch": per_batch,
        "first_different": first,
    }
