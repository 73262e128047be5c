"""The statistics behind the report's bands: a step's mean reward with a 95 % interval.

A ``{0,1}`` reward's step mean is a proportion: its interval is Wilson's score interval, which
stays inside [0, 1] (a ``mean ± std`` band of a proportion dips below 0). Whether a reward is
``{0,1}`` is read from what TRL logs: for ``n`` values in {0, 1} with mean ``m``, TRL's
(Bessel-corrected) std is exactly ``sqrt(m (1 − m) n / (n − 1))``, so ``n`` follows from ``m`` and
``s`` and must be a whole number, with ``m n`` (the successes) whole too. Other rewards get the
normal interval of their mean, ``m ± z s / sqrt(n)``. Completions of one prompt are treated as
independent draws (they are correlated, so the intervals are if anything too narrow).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

#: The two-sided 95 % normal quantile.
Z95 = 1.959963984540054

__all__ = ["Z95", "binary_count", "config_count", "is_binary", "mean_interval", "reward_bands", "wilson_interval"]


def wilson_interval(p: float, n: int, z: float = Z95) -> tuple[float, float]:
    """Wilson's score interval ``(low, high)`` for a proportion ``p`` observed over ``n`` trials."""
    if n <= 0:
        raise ValueError(f"a proportion needs n >= 1 trials, got {n}")
    z2 = z * z
    centre = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = z / (1 + z2 / n) * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n))
    return max(0.0, centre - half), min(1.0, centre + half)


def mean_interval(mean: float, std: float, n: int, z: float = Z95) -> tuple[float, float]:
    """The normal interval ``mean ± z std / sqrt(n)`` of a mean over ``n`` values."""
    half = z * std / math.sqrt(n)
    return mean - half, mean + half


def binary_count(mean: float, std: float, tol: float = 0.02) -> int | None:
    """``n`` if ``(mean, std)`` are those of ``n >= 2`` values in {0, 1} (TRL's unbiased std), else None.

    Only defined for ``0 < mean < 1`` (all-equal values carry no ``n``)."""
    if not 0.0 < mean < 1.0 or not math.isfinite(std):
        return None
    var, bern = std * std, mean * (1.0 - mean)
    if var <= bern * (1 + 1e-6):  # a {0,1} sample's unbiased variance exceeds m (1 - m)
        return None
    n_real = var / (var - bern)
    n = round(n_real)
    if n < 2 or abs(n_real - n) > tol * max(1.0, n) or abs(mean * n - round(mean * n)) > tol:
        return None
    return n


def is_binary(steps: Sequence[tuple[float, float]], sample_values: Iterable[Any] = ()) -> bool:
    """Whether a reward is ``{0,1}``: at least one step has a mean strictly inside (0, 1), every such
    step's ``(mean, std)`` fits :func:`binary_count`, and every sampled value (``None``: not scored)
    is 0 or 1. A reward whose means are all 0 or all 1 is not called ``{0,1}`` (it may be a constant)."""
    if any(v not in (0, 1) for v in sample_values if v is not None):
        return False
    inside = [(m, s) for m, s in steps if 0.0 < m < 1.0]
    return bool(inside) and all(binary_count(m, s) is not None for m, s in inside)


def config_count(config: Mapping[str, Any]) -> int | None:
    """Completions behind one logged step's mean on one process, from the run's settings:
    ``per_device_train_batch_size × steps_per_generation`` (TRL's default: gradient accumulation)."""
    try:
        per_device = int(config["per_device_train_batch_size"])
    except (KeyError, TypeError, ValueError):
        return None
    gen = config.get("steps_per_generation") or config.get("gradient_accumulation_steps") or 1
    return per_device * int(gen)


def reward_bands(
    means: Sequence[float], stds: Sequence[float] | None, binary: bool, n_hint: int | None
) -> tuple[list[float], list[float], str]:
    """Per step ``(low, high)`` of the band and its description.

    ``binary``: Wilson intervals with each step's own ``n`` (:func:`binary_count`, else ``n_hint``);
    otherwise the normal interval of the mean over ``n_hint`` values, or ``± std`` when no ``n`` is
    known. Steps without a usable ``n`` or std get a zero-width band (NaN-free, drawn as the line)."""
    lows, highs = [], []
    if binary:
        for i, m in enumerate(means):
            n = binary_count(m, stds[i]) if stds is not None else None
            n = n or n_hint
            lo, hi = wilson_interval(min(max(m, 0.0), 1.0), n) if n else (m, m)
            lows.append(lo)
            highs.append(hi)
        return lows, highs, "{0,1}: proportion, 95% Wilson interval"
    if stds is None:
        return list(means), list(means), "mean"
    for m, s in zip(means, stds):
        lo, hi = mean_interval(m, s, n_hint) if n_hint else (m - s, m + s)
        lows.append(lo)
        highs.append(hi)
    return lows, highs, (f"mean, 95% interval (n={n_hint})" if n_hint else "mean ± std")
