"""Sequence- and token-level advantages from several rewards
(docs/design.md#step-group-advantages, #step-batch-statistics, #step-token-advantages).

Every function here is pure torch: no model, tokenizer or trainer. Rows are completions ordered
group by group, ``N = num_prompts × group_size``; ``rewards`` is ``(N, K)`` with NaN where a
reward does not apply. Callers that run on several processes pass the *global* batch (gathered
rewards), so every process computes the same statistics.

A completion for which *every* reward is NaN is *unscorable* (as in TRL 1.16): it takes no part in
any group or batch statistic and its advantage is 0, under every method.
"""

from __future__ import annotations

import torch
from torch import Tensor

#: Added to every standard deviation before dividing (GDPO Eq. 4 and Eq. 6).
STD_EPS = 1e-4
#: Below this batch spread of the sequence scores, step 3's division is skipped (scores are only
#: centred). Such a spread is made of ``STD_EPS`` rounding (e.g. one group whose two rewards cancel
#: exactly); dividing by it would turn that rounding into ±0.3 GDPO advantages and, at the token
#: level where numerators stay O(1), into advantages of ±10⁴. Informative batches have σ ≳ 0.1.
MIN_BATCH_STD = 1e-3


def _check_rewards(rewards: Tensor, group_size: int) -> Tensor:
    if rewards.dim() != 2:
        raise ValueError(f"rewards must be (N, K), got shape {tuple(rewards.shape)}")
    if group_size < 1:
        raise ValueError(f"group_size must be >= 1, got {group_size}")
    if rewards.shape[0] % group_size != 0:
        raise ValueError(
            f"N={rewards.shape[0]} rows is not a multiple of group_size={group_size}; "
            "rows must be ordered group by group"
        )
    return rewards.to(torch.float64)


def _reward_weight_vector(reward_weights, num_rewards: int, like: Tensor) -> Tensor:
    """``(K,)`` float64 weights ω (default all 1)."""
    if reward_weights is None:
        return torch.ones(num_rewards, dtype=torch.float64, device=like.device)
    weights = torch.as_tensor(reward_weights, dtype=torch.float64, device=like.device)
    if weights.shape != (num_rewards,):
        raise ValueError(
            f"reward_weights must have one entry per reward ({num_rewards}), got shape {tuple(weights.shape)}"
        )
    return weights


def _nan_mean_std(values: Tensor, dim: int) -> tuple[Tensor, Tensor, Tensor]:
    """NaN-aware mean, unbiased std and valid count along ``dim`` (std is 0 below two values)."""
    valid = ~torch.isnan(values)
    count = valid.sum(dim=dim, keepdim=True)
    filled = torch.where(valid, values, torch.zeros_like(values))
    mean = filled.sum(dim=dim, keepdim=True) / count.clamp_min(1)
    sq_dev = torch.where(valid, (values - mean) ** 2, torch.zeros_like(values))
    var = sq_dev.sum(dim=dim, keepdim=True) / (count - 1).clamp_min(1)
    std = torch.where(count >= 2, var.sqrt(), torch.zeros_like(var))
    return mean, std, count


def scorable_rows(rewards: Tensor) -> Tensor:
    """``(N,)`` bool: completions with at least one applicable (non-NaN) reward."""
    return ~torch.isnan(rewards).all(dim=1)


def group_normalize(rewards: Tensor, group_size: int) -> Tensor:
    """Per-reward group advantage ``Â[j,k]`` (GDPO Eq. 4), NaN-aware.

    ``(R[j,k] − mean_j R[·,k]) / (std_j R[·,k] + 1e-4)`` within each group, unbiased std.
    A reward with fewer than two valid values in a group, or zero spread, gets 0; NaN entries
    (not applicable) get 0. Input ``(N, K)``, output ``(N, K)`` float64.
    """
    rewards = _check_rewards(rewards, group_size)
    n, k = rewards.shape
    grouped = rewards.view(n // group_size, group_size, k)
    mean, std, count = _nan_mean_std(grouped, dim=1)
    adv = (grouped - mean) / (std + STD_EPS)
    informative = (count >= 2) & (std > 0)
    adv = torch.where(informative & ~torch.isnan(grouped), adv, torch.zeros_like(adv))
    return adv.view(n, k)


def weighted_reward_sum(group_adv: Tensor, reward_weights=None) -> Tensor:
    """``S[j] = Σ_k ω_k Â[j,k]`` with NaN treated as 0. ``(N, K)`` → ``(N,)``."""
    weights = _reward_weight_vector(reward_weights, group_adv.shape[1], group_adv)
    return torch.nan_to_num(group_adv.to(torch.float64), nan=0.0) @ weights


def reward_coefficients(rewards: Tensor, group_size: int, reward_weights=None) -> Tensor:
    """``ω_k Â[j,k]`` ``(N, K)`` float64, NaN → 0: reward ``k``'s coefficient in completion ``j``'s
    token advantages (step 6). Where it is 0, reward ``k``'s token weights cannot change ``j``'s
    advantages, so its relevance need not be computed."""
    group_adv = group_normalize(rewards, group_size)
    omega = _reward_weight_vector(reward_weights, group_adv.shape[1], group_adv)
    return torch.nan_to_num(group_adv, nan=0.0) * omega


def batch_statistics(scores: Tensor) -> tuple[Tensor, Tensor]:
    """Mean and unbiased std of ``S`` ``(N,)`` over the whole (global) batch, NaN rows left out
    (unscorable completions); std is 0 below two rows."""
    mean, std, _ = _nan_mean_std(scores.to(torch.float64).view(-1), dim=0)
    return mean.view(()), std.view(())


def batch_normalize(values: Tensor, mean: Tensor | float, std: Tensor | float) -> Tensor:
    """``(values − μ) / (σ + 1e-4)``, or only ``values − μ`` when ``σ < MIN_BATCH_STD``."""
    std = torch.as_tensor(std, dtype=torch.float64)
    if std < MIN_BATCH_STD:
        return values - mean
    return (values - mean) / (std + STD_EPS)


def _scores(rewards: Tensor, group_size: int, reward_weights) -> Tensor:
    """``S[j]`` ``(N,)`` float64, NaN on unscorable rows (so batch statistics leave them out)."""
    scores = weighted_reward_sum(group_normalize(rewards, group_size), reward_weights)
    return torch.where(scorable_rows(rewards), scores, torch.full_like(scores, float("nan")))


def gdpo_advantages(
    rewards: Tensor,
    group_size: int,
    reward_weights=None,
    batch_norm: bool = True,
    batch_stats: tuple[Tensor | float, Tensor | float] | None = None,
) -> Tensor:
    """GDPO sequence advantages ``(N,)``: per-reward group-normalise, weight, sum, batch-normalise.

    ``batch_stats`` overrides ``(μ, σ)`` of step 3 (e.g. gathered from other processes); by
    default they come from ``rewards`` itself, which should then be the global batch. Unscorable
    rows get 0 (TRL 1.16's ``normalize_then_sum``).
    """
    scores = _scores(rewards, group_size, reward_weights)  # NaN on unscorable rows
    if batch_norm:
        mean, std = batch_stats if batch_stats is not None else batch_statistics(scores)
        scores = batch_normalize(scores, mean, std)
    return torch.nan_to_num(scores, nan=0.0).to(torch.float32)


def grpo_advantages(rewards: Tensor, group_size: int, reward_weights=None) -> Tensor:
    """Multi-reward GRPO baseline ``(N,)``: weighted sum of rewards (NaN → 0), then group-normalise.

    Unscorable rows are left out of their group's statistics and get 0 (TRL's
    ``sum_then_normalize`` with ``scale_rewards="group"``).
    """
    rewards = _check_rewards(rewards, group_size)
    weights = _reward_weight_vector(reward_weights, rewards.shape[1], rewards)
    total = torch.nan_to_num(rewards, nan=0.0) @ weights
    total = torch.where(scorable_rows(rewards), total, torch.full_like(total, float("nan")))
    return group_normalize(total.unsqueeze(1), group_size).squeeze(1).to(torch.float32)


def token_advantages(
    rewards: Tensor,
    group_size: int,
    weights: Tensor,
    mask: Tensor,
    reward_weights=None,
    batch_norm: bool = True,
    batch_stats: tuple[Tensor | float, Tensor | float] | None = None,
    rows: slice | None = None,
) -> Tensor:
    """Per-token advantages ``A[j,t]`` (docs/design.md#step-token-advantages), ``(N, T)`` float32, 0 where
    ``mask`` is 0.

    ``A[j,t] = (Σ_k ω_k Â[j,k] w[j,k,t] − μ) / (σ + 1e-4)`` with ``μ, σ`` the batch statistics
    of the sequence scores ``S[j] = Σ_k ω_k Â[j,k]``. ``weights`` is ``(N, K, T)`` (1 where a
    reward has no evidence); ``mask`` is ``(N, T)`` with 1 on completion tokens. With
    ``batch_norm=False`` the numerator is returned unnormalised.

    ``rows``: ``rewards`` is the global batch (all processes) and ``weights``/``mask`` cover only
    these rows of it (this process's share): group and batch statistics stay global.
    Unscorable rows get 0 at every token.
    """
    coeff = reward_coefficients(rewards, group_size, reward_weights)  # (N_global, K)
    scorable = scorable_rows(rewards)
    if batch_norm and batch_stats is None:
        batch_stats = batch_statistics(_scores(rewards, group_size, reward_weights))
    if rows is not None:
        coeff, scorable = coeff[rows], scorable[rows]
    n, k = coeff.shape
    if weights.dim() != 3 or weights.shape[:2] != (n, k):
        raise ValueError(f"weights must be (N={n}, K={k}, T), got shape {tuple(weights.shape)}")
    if mask.shape != (n, weights.shape[2]):
        raise ValueError(f"mask must be (N={n}, T={weights.shape[2]}), got shape {tuple(mask.shape)}")
    numerator = torch.einsum("nk,nkt->nt", coeff, weights.to(torch.float64))
    if batch_norm:
        numerator = batch_normalize(numerator, *batch_stats)
    keep = mask.to(torch.float64) * scorable.to(torch.float64).unsqueeze(1)
    return (numerator * keep).to(torch.float32)


__all__ = [
    "MIN_BATCH_STD",
    "STD_EPS",
    "batch_normalize",
    "batch_statistics",
    "gdpo_advantages",
    "group_normalize",
    "grpo_advantages",
    "reward_coefficients",
    "scorable_rows",
    "token_advantages",
    "weighted_reward_sum",
]
