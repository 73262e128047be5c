"""Token weights from relevance (docs/design.md#step-weights): credit is moved between tokens, never created.

For each response, ``m = mean_t d[t]`` over its valid tokens. If ``m < 1e-6`` the weights are
uniform (the evidence changed nothing). Otherwise ``w[t] = (1 − λ) + λ · d[t] / m``, optionally
capped at ``w_max`` and renormalised so that the mean over valid tokens stays exactly 1.

Two other shapes, built to raise a reward's gradient signal ``G = ℓ² / E[w²]`` (ℓ the mean weight
on the truly relevant tokens): :func:`rank_weights` (the weight follows the token's *rank* in its
response, so ``E[w²]`` is fixed by construction, whatever the map's tail) and
:func:`batch_mean_weights` (``m`` is the mean over the whole batch, so a response the evidence
barely moves keeps less than its share: mean 1 over the batch, no longer per response). The
*moderate cap* is a setting of the default shape: ``lam`` = :data:`MODERATE_LAM`, ``w_max`` =
:data:`MODERATE_W_MAX` puts every weight in ``[1 − λ, w_max] = [0.5, 3]``.
"""

from __future__ import annotations

import torch
from torch import Tensor

#: Below this mean relevance a response gets uniform weights.
MIN_MEAN_RELEVANCE = 1e-6
#: The moderate cap: weights in [1 − 0.5, 3] (a relevant-to-other ratio up to 6, against 1.5 for the
#: default [0.8, 1.2]; E[w²] stays bounded, unlike the paper's uncapped λ = 1).
MODERATE_LAM = 0.5
MODERATE_W_MAX = 3.0
#: Token weight shapes (``weighting``) and what the relevance is divided by (``weight_mean``).
WEIGHTINGS = ("relevance", "rank")
WEIGHT_MEANS = ("response", "batch")


def _cap_and_renormalize(weights: Tensor, mask: Tensor, w_max: float) -> Tensor:
    """Water-fill: cap at ``w_max`` and scale the uncapped valid entries so each row averages 1.

    When every uncapped entry is 0 the remaining budget is shared evenly among them.

    ``weights`` and ``mask`` are ``(B, T)`` float64; rows with no valid token are left alone.
    Terminates in at most ``T`` rounds because every round caps at least one more entry.
    """
    count = mask.sum(-1, keepdim=True)
    for _ in range(weights.shape[-1] + 1):
        capped = (weights >= w_max) & (mask > 0)
        weights = torch.where(capped, torch.full_like(weights, w_max), weights)
        free = (~capped) & (mask > 0)
        free_sum = (weights * free).sum(-1, keepdim=True)
        budget = count - w_max * capped.sum(-1, keepdim=True)
        num_free = free.sum(-1, keepdim=True)
        scaled = weights * (budget / free_sum.clamp_min(1e-300))
        # Free entries that are all 0 (λ = 1, zero relevance) share the budget evenly instead.
        even = (budget / num_free.clamp_min(1)).expand_as(weights)
        refill = torch.where(free_sum > 0, scaled, even)
        weights = torch.where(free, refill, weights)
        if not ((weights > w_max + 1e-12) & free).any():
            break
    return weights


def _check(distance: Tensor, mask: Tensor, lam: float, w_max: float | None) -> None:
    if distance.shape != mask.shape or distance.dim() != 2:
        raise ValueError(f"distance and mask must both be (B, T), got {tuple(distance.shape)} and {tuple(mask.shape)}")
    if not 0.0 <= lam <= 1.0:
        raise ValueError(f"lam must be in [0, 1], got {lam}")
    if w_max is not None and w_max < 1.0:
        raise ValueError(f"w_max must be >= 1 (weights average to 1), got {w_max}")


def relevance_weights(
    distance: Tensor,
    mask: Tensor,
    lam: float = 1.0,
    w_max: float | None = None,
) -> Tensor:
    """Turn per-token relevance ``(B, T)`` into weights ``(B, T)`` with mean 1 over valid tokens.

    ``mask`` ``(B, T)``: 1 on completion tokens. Masked positions get weight 0; a row with no
    valid token is all 0. ``lam`` ∈ [0, 1] interpolates between uniform (0) and proportional (1).
    ``w_max`` ≥ 1 caps a single token's weight (None: no cap).
    """
    _check(distance, mask, lam, w_max)
    valid = mask.to(torch.float64)
    d = torch.nan_to_num(distance.to(torch.float64), nan=0.0).clamp_min(0.0) * valid
    count = valid.sum(-1, keepdim=True)
    mean = d.sum(-1, keepdim=True) / count.clamp_min(1)
    informative = mean >= MIN_MEAN_RELEVANCE
    proportional = (1.0 - lam) + lam * d / mean.clamp_min(MIN_MEAN_RELEVANCE)
    weights = torch.where(informative, proportional, torch.ones_like(d)) * valid
    if w_max is not None:
        weights = _cap_and_renormalize(weights, valid, float(w_max))
    return weights.to(torch.float32)


def rank_profile(n: int, power: float = 1.0) -> Tensor:
    """``(n,)`` float64 weights of the 1st … n-th smallest of ``n`` tokens: ``((i + ½) / n) ** power``
    scaled to mean exactly 1 (``power`` 1: a straight line from ≈ 0 to ≈ 2). Its mean square is
    ``E[f²] → (p + 1)² / (2p + 1)`` for large ``n`` (4/3 at ``p = 1``)."""
    if n < 1:
        return torch.zeros(0, dtype=torch.float64)
    f = ((torch.arange(n, dtype=torch.float64) + 0.5) / n) ** power
    return f / f.mean()


def rank_weights(
    distance: Tensor, mask: Tensor, lam: float = 1.0, power: float = 1.0, w_max: float | None = None
) -> Tensor:
    """Weights ``(B, T)`` from each token's rank of relevance within its response: mean 1 per row.

    The ``n`` valid tokens of a row, sorted by ``distance`` ``(B, T)``, get :func:`rank_profile`
    ``(n, power)``; tied tokens share the mean of their block's profile (so the mean stays exactly
    1); then ``(1 − λ) + λ · f``, capped at ``w_max`` as :func:`relevance_weights` does. ``E[w²]``
    therefore depends only on ``n``, ``power`` and ``λ`` (ties only lower it), never on how heavy
    the map's tail is. A row whose mean relevance is below :data:`MIN_MEAN_RELEVANCE` is uniform;
    masked positions are 0.
    """
    _check(distance, mask, lam, w_max)
    if power <= 0:
        raise ValueError(f"rank power must be > 0, got {power}")
    valid = mask.to(torch.float64)
    d = torch.nan_to_num(distance.to(torch.float64), nan=0.0).clamp_min(0.0) * valid
    weights = valid.clone()
    for row in range(d.shape[0]):
        keep = valid[row] > 0
        values = d[row, keep]
        n = values.numel()
        if n == 0 or values.mean() < MIN_MEAN_RELEVANCE:
            continue
        ordered, order = values.sort(stable=True)
        cumulative = torch.cat([torch.zeros(1, dtype=torch.float64), rank_profile(n, power).cumsum(0)])
        first = torch.searchsorted(ordered, ordered, right=False)  # each token's tie block [first, last)
        last = torch.searchsorted(ordered, ordered, right=True)
        shared = (cumulative[last] - cumulative[first]) / (last - first)
        ranked = torch.empty(n, dtype=torch.float64)
        ranked[order] = shared
        weights[row, keep] = (1.0 - lam) + lam * ranked
    if w_max is not None:
        weights = _cap_and_renormalize(weights, valid, float(w_max))
    return weights.to(torch.float32)


def batch_mean_weights(distance: Tensor, mask: Tensor, lam: float = 1.0, w_max: float | None = None) -> Tensor:
    """Weights ``(B, T)`` ``(1 − λ) + λ · d[t] / m̄`` with ``m̄`` the mean relevance over *every* valid
    token of the batch instead of the response's own mean (which makes each weight depend on the
    response's later tokens).

    Mean 1 over the batch's valid tokens, **not** per response: a response the evidence moves more
    than the batch's average gets more than its share of the reward's advantage, one it barely moves
    gets as little as ``1 − λ`` per token, so its token advantages no longer average to its sequence
    advantage. ``w_max`` caps one token and renormalises over the batch. A batch whose mean relevance
    is below :data:`MIN_MEAN_RELEVANCE` is uniform; masked positions are 0.
    """
    _check(distance, mask, lam, w_max)
    valid = mask.to(torch.float64)
    d = torch.nan_to_num(distance.to(torch.float64), nan=0.0).clamp_min(0.0) * valid
    count = valid.sum()
    mean = d.sum() / count.clamp_min(1)
    if count == 0 or mean < MIN_MEAN_RELEVANCE:
        return valid.to(torch.float32)
    weights = ((1.0 - lam) + lam * d / mean) * valid
    if w_max is not None:
        flat = _cap_and_renormalize(weights.reshape(1, -1), valid.reshape(1, -1), float(w_max))
        weights = flat.view_as(weights)
    return weights.to(torch.float32)


__all__ = [
    "MIN_MEAN_RELEVANCE",
    "MODERATE_LAM",
    "MODERATE_W_MAX",
    "WEIGHTINGS",
    "WEIGHT_MEANS",
    "batch_mean_weights",
    "rank_profile",
    "rank_weights",
    "relevance_weights",
]
