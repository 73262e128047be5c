"""The gradient signal a credit method gives (issue 37; ``mrtpo bench signal``, the training metrics).

For one reward, mean-1 token weights ``w`` change the signal-to-noise ratio of that reward's policy
gradient by ``G = ℓ² / E[w²]``: ``ℓ`` the mean weight on the truly relevant tokens (the *lift*),
``E[w²] = 1 + CV²(w)`` (uniform weights: ``G = 1``). Measured on gradients instead: ``N`` per-group
gradients ``g_i`` ``(P,)`` of one method give

    SNR = ‖ḡ‖² / (tr Σ̂ / N)          Σ̂ the unbiased covariance of the g_i
    G_eff = (SNR / SNR_gdpo) · cos²(ḡ, ḡ_gdpo)

``E‖ḡ‖² = ‖μ‖² + tr Σ / N``, so a method with no signal still has ``SNR ≈ 1``; :func:`signal_stats`
also gives the *excess* ``SNR − 1`` (estimating ``N ‖μ‖² / tr Σ``) and ``G_eff`` with the noise taken
out of both the norms and the cosine (:func:`pair_mean`: inner products between different groups only).

Every statistic of the gradients is a function of their inner products, so the functions here take
Gram matrices and per-group *counts* (1 each for the sample; a bootstrap resample's multiplicities),
which makes a bootstrap over groups cost ``O(N²)`` per resample, whatever the parameter count.
Pure torch, float64.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import torch
from torch import Tensor


def gram(vectors: Tensor) -> Tensor:
    """``(N, N)`` float64 inner products of the rows of ``vectors`` ``(N, P)`` (accumulated in float64)."""
    v = vectors.to(torch.float64)
    return v @ v.T


def cross_gram(a: Tensor, b: Tensor) -> Tensor:
    """``(N, N)`` float64 ``⟨a_i, b_j⟩`` of the rows of ``a`` and ``b`` ``(N, P)``."""
    return a.to(torch.float64) @ b.to(torch.float64).T


def mean_sq_norm(g: Tensor, counts: Tensor) -> Tensor:
    """``‖ḡ‖²`` from the Gram matrix ``g`` ``(N, N)`` and the groups' ``counts`` ``(N,)`` (weights of the mean)."""
    a = counts.to(torch.float64) / counts.sum()
    return a @ g @ a


def trace_covariance(g: Tensor, counts: Tensor) -> Tensor:
    """``tr Σ̂ = Σ_i c_i ‖g_i − ḡ‖² / (n − 1)``, ``n = Σ_i c_i``: the unbiased total variance of the groups'
    gradients with multiplicities ``counts`` ``(N,)``, from their Gram matrix ``g`` ``(N, N)``."""
    c = counts.to(torch.float64)
    n = c.sum()
    return ((c * g.diagonal()).sum() - n * mean_sq_norm(g, c)) / (n - 1)


def pair_mean(g: Tensor, counts: Tensor) -> Tensor:
    """``Σ_{i≠j} c_i c_j g_ij / Σ_{i≠j} c_i c_j``: the mean inner product between *different* groups, an
    unbiased estimate of ``⟨μ_a, μ_b⟩`` from a (cross) Gram ``g`` ``(N, N)`` (a group never pairs with
    itself, nor with its own copies in a bootstrap resample). At ``counts = 1`` it is ``‖ḡ‖² − tr Σ̂ / N``."""
    c = counts.to(torch.float64)
    pairs = c.sum() ** 2 - (c**2).sum()
    return (c @ g @ c - (c**2 * g.diagonal()).sum()) / pairs


def snr(g: Tensor, counts: Tensor) -> float:
    """``‖ḡ‖² / (tr Σ̂ / n)``: how many standard errors long the mean gradient is, squared (inf without noise)."""
    noise = float(trace_covariance(g, counts)) / float(counts.sum())
    signal = float(mean_sq_norm(g, counts))
    return float("inf") if noise <= 0 else signal / noise


def snr_excess(g: Tensor, counts: Tensor) -> float:
    """``n · pair_mean / tr Σ̂``: the SNR less the ``1`` that noise alone gives (``= snr − 1`` at ``counts = 1``),
    an estimate of ``n ‖μ‖² / tr Σ`` whose bootstrap is not shifted by resampled copies of a group."""
    noise = float(trace_covariance(g, counts))
    return float("inf") if noise <= 0 else float(counts.sum()) * float(pair_mean(g, counts)) / noise


def cosine(g_ab: Tensor, g_aa: Tensor, g_bb: Tensor, counts: Tensor) -> float:
    """``cos(ḡ_a, ḡ_b)`` from the cross Gram ``⟨a_i, b_j⟩`` and each method's own Gram (all ``(N, N)``)."""
    a = counts.to(torch.float64) / counts.sum()
    denominator = float(mean_sq_norm(g_aa, counts) * mean_sq_norm(g_bb, counts)) ** 0.5
    return float("nan") if denominator == 0 else float(a @ g_ab @ a) / denominator


def effective_gain(snr_method: float, snr_reference: float, cos: float) -> float:
    """``G_eff = (SNR / SNR_ref) · cos²``: the method's signal along the reference's direction, relative."""
    return float("nan") if snr_reference == 0 else snr_method / snr_reference * cos**2


def signal_stats(
    grams: Mapping[str, Tensor], cross: Mapping[str, Tensor], reference: str, counts: Tensor
) -> dict[str, dict[str, float]]:
    """Per method: ``snr``, ``snr_excess``, ``cos_to_ref``, ``g_eff`` and ``g_eff_excess``.

    ``grams``: method -> its ``(N, N)`` Gram; ``cross``: method -> ``⟨g_method_i, g_reference_j⟩``
    ``(N, N)``; ``counts`` ``(N,)``: the groups' multiplicities. ``snr`` is ``1 + snr_excess`` (the
    definition at ``counts = 1``; under a resample it stays centred on the sample's value);
    ``g_eff_excess = ⟨μ, μ_ref⟩² tr Σ_ref / (‖μ_ref‖⁴ tr Σ)`` from :func:`pair_mean`: ``G_eff`` with the
    noise's share of ``‖ḡ‖²`` and of the cosine taken out (NaN when the reference shows no signal).
    """
    ref_excess = snr_excess(grams[reference], counts)
    ref_pairs = float(pair_mean(grams[reference], counts))
    ref_noise = float(trace_covariance(grams[reference], counts))
    out = {}
    for method, g in grams.items():
        excess = snr_excess(g, counts)
        cos = cosine(cross[method], g, grams[reference], counts)
        noise = float(trace_covariance(g, counts))
        along = float(pair_mean(cross[method], counts))
        unbiased = float("nan") if ref_pairs <= 0 or noise <= 0 else along**2 * ref_noise / (ref_pairs**2 * noise)
        out[method] = {
            "snr": 1.0 + excess,
            "snr_excess": excess,
            "cos_to_ref": cos,
            "g_eff": effective_gain(1.0 + excess, 1.0 + ref_excess, cos),
            "g_eff_excess": unbiased,
        }
    return out


def bootstrap_counts(n: int, resamples: int = 1000, seed: int = 0) -> Tensor:
    """``(resamples, n)`` float64: how often each of ``n`` groups is drawn in each bootstrap resample."""
    generator = torch.Generator().manual_seed(seed)
    draws = torch.randint(0, n, (resamples, n), generator=generator)
    return torch.stack([torch.bincount(d, minlength=n) for d in draws]).to(torch.float64)


def percentile_interval(values: Sequence[float], level: float = 0.95) -> tuple[float, float]:
    """The central ``level`` percentile interval of ``values``; non-finite values are left out."""
    finite = [v for v in values if v == v and abs(v) != float("inf")]
    if not finite:
        return float("nan"), float("nan")
    ordered = torch.tensor(finite, dtype=torch.float64)
    tail = (1.0 - level) / 2
    return float(torch.quantile(ordered, tail)), float(torch.quantile(ordered, 1.0 - tail))


def bootstrap_interval(
    statistic: Callable[[Tensor], float], n: int, resamples: int = 1000, level: float = 0.95, seed: int = 0
) -> tuple[float, float]:
    """Percentile interval of ``statistic(counts)`` over ``resamples`` bootstrap resamples of ``n`` groups
    (``counts`` ``(n,)``: how often each group was drawn); non-finite draws are left out."""
    return percentile_interval([statistic(c) for c in bootstrap_counts(n, resamples, seed)], level)


def lift_and_mean_square(weights: Tensor, relevant: Tensor, mask: Tensor) -> tuple[float, float] | None:
    """``(ℓ, E[w²])`` of one response's weights ``(T,)`` for one reward: ``ℓ`` = the mean weight on the
    ``relevant`` ``(T,)`` bool tokens, ``E[w²]`` = the mean square over the valid ``mask`` ``(T,)`` tokens.
    For mean-1 weights ``ℓ`` is the lift of :func:`mrtpo.credit.lift.span_lift` and ``E[w²] = 1 + CV²``;
    for batch-mean weights both keep the response's own scale. ``None`` where the lift is undefined (no
    relevant token, or every token relevant)."""
    mask = mask.bool()
    relevant = relevant.bool() & mask
    n_relevant, n = int(relevant.sum()), int(mask.sum())
    if n_relevant == 0 or n_relevant == n:
        return None
    w = weights.double()
    return float(w[relevant].mean()), float((w[mask] ** 2).mean())


def predicted_gain(lift: float, mean_square: float) -> float:
    """``G = ℓ² / E[w²]``."""
    return float("nan") if mean_square <= 0 else lift**2 / mean_square


def group_sums(values: Sequence[Sequence[float]]) -> tuple[Tensor, Tensor]:
    """``(sums, sizes)`` ``(N,)`` float64 of each group's list of values (what :func:`pooled` weighs)."""
    return (
        torch.tensor([sum(v) for v in values], dtype=torch.float64),
        torch.tensor([len(v) for v in values], dtype=torch.float64),
    )


def pooled(sums: Tensor, sizes: Tensor, counts: Tensor) -> float:
    """Mean of all values with each group's ``sums[i]`` / ``sizes[i]`` counted ``counts[i]`` times (NaN when empty)."""
    n = float(counts.to(torch.float64) @ sizes)
    return float(counts.to(torch.float64) @ sums) / n if n else float("nan")


__all__ = [
    "bootstrap_counts",
    "bootstrap_interval",
    "cosine",
    "cross_gram",
    "effective_gain",
    "gram",
    "group_sums",
    "lift_and_mean_square",
    "mean_sq_norm",
    "pair_mean",
    "percentile_interval",
    "pooled",
    "predicted_gain",
    "signal_stats",
    "snr",
    "snr_excess",
    "trace_covariance",
]
