"""Token weights from relevance (docs/design.md#step-weights): credit is moved between tokens, never created.

For each response, ``m = mean_t d[t]`` over its valid tokens. If ``m < 1e-6`` the weights are
uniform (the evidence changed nothing). Otherwise ``w[t] = (1 − λ) + λ · d[t] / m``, optionally
capped at ``w_max`` and renormalised so that the mean over valid tokens stays exactly 1.
"""

from __future__ import annotations

import torch
from torch import Tensor

#: Below this mean relevance a response gets uniform weights.
MIN_MEAN_RELEVANCE = 1e-6


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
    if distance.shape != mask.shape or distance.dim() != 2:
        raise ValueError(
            f"distance and mask must both be (B, T), got {tuple(distance.shape)} and {tuple(mask.shape)}"
        )
    if not 0.0 <= lam <= 1.0:
        raise ValueError(f"lam must be in [0, 1], got {lam}")
    if w_max is not None and w_max < 1.0:
        raise ValueError(f"w_max must be >= 1 (weights average to 1), got {w_max}")
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


__all__ = ["MIN_MEAN_RELEVANCE", "relevance_weights"]
