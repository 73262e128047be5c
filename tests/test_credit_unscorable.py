"""Unscorable completions (every reward None/NaN): out of every statistic, advantage 0, every method.

The reference is TRL 1.16's own advantage code (``GRPOTrainer._generate_and_score_completions``,
``trl/trainer/grpo_trainer.py``), transcribed below with TRL's ``nanstd``; the trainer test
``test_none_rewards_match_trl`` checks the same against TRL running for real.
"""

import math

import pytest
import torch
from trl.trainer.utils import nanstd

from mrtpo.credit import (
    CreditBatch,
    CreditConfig,
    available_methods,
    gdpo_advantages,
    get_method,
    grpo_advantages,
    scorable_rows,
    token_advantages,
)

NAN = float("nan")


def trl_advantages(
    rewards_per_func: torch.Tensor, num_generations: int, aggregation: str, weights=None
) -> torch.Tensor:
    """TRL 1.16's advantages ``(N,)`` (``scale_rewards="group"``), line for line."""
    k = rewards_per_func.shape[1]
    reward_weights = torch.ones(k) if weights is None else torch.tensor(weights)
    unscorable_mask = torch.isnan(rewards_per_func).all(dim=1)
    if aggregation == "sum_then_normalize":
        rewards = (rewards_per_func * reward_weights.unsqueeze(0)).nansum(dim=1)
        rewards[unscorable_mask] = torch.nan
        mean_grouped_rewards = torch.nanmean(rewards.view(-1, num_generations), dim=1)
        mean_grouped_rewards = mean_grouped_rewards.repeat_interleave(num_generations, dim=0)
        std_rewards = nanstd(rewards.view(-1, num_generations), dim=1)
        std_rewards = std_rewards.repeat_interleave(num_generations, dim=0)
        advantages = (rewards - mean_grouped_rewards) / (std_rewards + 1e-4)
    else:  # normalize_then_sum
        grouped = rewards_per_func.view(-1, num_generations, k)
        mean_k = torch.nanmean(grouped, dim=1, keepdim=True)
        std_k = nanstd(grouped, dim=1, keepdim=True) if num_generations > 1 else torch.zeros_like(mean_k)
        reward_k = (grouped - mean_k) / (std_k + 1e-4)
        reward_k = reward_k.view(-1, k)
        rewards = (reward_k * reward_weights.unsqueeze(0)).nansum(dim=1)
        rewards[unscorable_mask] = torch.nan
        std_rewards = nanstd(rewards).expand_as(rewards) if rewards.numel() > 1 else torch.zeros_like(rewards)
        advantages = (rewards - torch.nanmean(rewards)) / (std_rewards + 1e-4)
    return torch.nan_to_num(advantages, nan=0.0)


def test_hand_computed_all_none_group_leaves_the_scale_alone():
    # group 1: one reward 0, 1; group 2: every reward None. S = ±a with a = 0.5 / (√0.5 + 1e-4);
    # over the two scorable rows σ = a√2, so the advantages are ±1/√2, not ±a/σ₄ = ±1.2247 (σ over
    # four rows with two zeros, the old behaviour).
    rewards = torch.tensor([[0.0], [1.0], [NAN], [NAN]])
    expected = torch.tensor([-1, 1, 0, 0]) / math.sqrt(2)
    torch.testing.assert_close(gdpo_advantages(rewards, 2), expected, atol=2e-4, rtol=0)
    torch.testing.assert_close(trl_advantages(rewards, 2, "normalize_then_sum"), expected, atol=2e-4, rtol=0)


def test_hand_computed_unscorable_row_inside_a_group():
    # One group of three, two rewards; row 2 unscorable. Each reward's statistics over rows 0, 1.
    rewards = torch.tensor([[1.0, 0.0], [0.0, 0.0], [NAN, NAN]])
    grpo = grpo_advantages(rewards, 3)
    # totals 1, 0 (row 2 left out): mean 0.5, std √0.5 → ±0.5/√0.5 = ±1/√2
    torch.testing.assert_close(grpo, torch.tensor([1, -1, 0]) / math.sqrt(2), atol=2e-4, rtol=0)
    torch.testing.assert_close(grpo, trl_advantages(rewards, 3, "sum_then_normalize"), atol=1e-5, rtol=1e-5)


def random_batch(seed: int, groups: int = 6, g: int = 4, k: int = 3) -> torch.Tensor:
    """Rewards with None slots, all-None rows and an all-None group; continuous and 0/1 columns."""
    gen = torch.Generator().manual_seed(seed)
    rewards = torch.randn(groups * g, k, generator=gen)
    rewards[:, 0] = (rewards[:, 0] > 0).float()
    rewards[torch.rand(groups * g, k, generator=gen) < 0.3] = NAN
    rewards[torch.rand(groups * g, generator=gen) < 0.2] = NAN  # whole rows
    rewards[g : 2 * g] = NAN  # a whole group
    rewards[0] = NAN
    return rewards


@pytest.mark.parametrize("seed", range(8))
def test_gdpo_and_grpo_equal_trl_with_none_rewards(seed):
    rewards = random_batch(seed)
    unscorable = ~scorable_rows(rewards)
    assert unscorable.sum() >= 5 and (~unscorable).sum() >= 10
    weights = [1.0, 0.5, 2.0]
    gdpo = gdpo_advantages(rewards, 4, reward_weights=weights)
    torch.testing.assert_close(gdpo, trl_advantages(rewards, 4, "normalize_then_sum", weights), atol=1e-5, rtol=1e-5)
    grpo = grpo_advantages(rewards, 4, reward_weights=weights)
    torch.testing.assert_close(grpo, trl_advantages(rewards, 4, "sum_then_normalize", weights), atol=1e-5, rtol=1e-5)
    assert torch.equal(gdpo[unscorable], torch.zeros(int(unscorable.sum())))


@pytest.mark.parametrize("seed", range(4))
def test_every_method_gives_unscorable_rows_zero_and_keeps_gdpo_on_scorable_ones(seed):
    rewards = random_batch(seed)
    n, k = rewards.shape
    t = 7
    gen = torch.Generator().manual_seed(100 + seed)
    lengths = torch.randint(1, t + 1, (n,), generator=gen)
    mask = (torch.arange(t) < lengths.unsqueeze(1)).float()
    batch = CreditBatch(
        rewards=rewards,
        group_size=4,
        mask=mask,
        relevance=torch.rand(n, k, t, generator=gen) * mask.unsqueeze(1),
        joint_relevance=torch.rand(n, t, generator=gen) * mask,
        decoy_relevance=torch.rand(n, k, t, generator=gen) * mask.unsqueeze(1),
        entropy=torch.rand(n, t, generator=gen) * mask,
        known_positions=(torch.rand(n, k, t, generator=gen) < 0.3).float() * mask.unsqueeze(1),
    )
    unscorable = ~scorable_rows(rewards)
    gdpo = gdpo_advantages(rewards, 4)
    for name in available_methods():
        method = get_method(name)
        adv = method(batch)
        assert torch.equal(adv[unscorable], torch.zeros(int(unscorable.sum()), t)), name
        mean = (adv * mask).sum(1) / mask.sum(1)
        expected = grpo_advantages(rewards, 4) if name == "grpo" else gdpo
        torch.testing.assert_close(mean, expected, atol=1e-5, rtol=1e-5, msg=name)
        torch.testing.assert_close(method.sequence_advantages(batch), expected, msg=name)
    # λ = 0: mrtpo is gdpo at every token, whatever the relevance
    lam0 = get_method("mrtpo")(batch, CreditConfig(lam=0.0))
    torch.testing.assert_close(lam0, gdpo.unsqueeze(1) * mask, atol=1e-6, rtol=1e-6)


def test_rows_of_a_global_batch_match_the_whole():
    """Two processes' shares of a batch with unscorable rows equal the one-process result."""
    rewards = random_batch(3)
    n, t = rewards.shape[0], 5
    weights, mask = torch.rand(n, 3, t) + 0.5, torch.ones(n, t)
    whole = token_advantages(rewards, 4, weights, mask)
    half = n // 2
    parts = [token_advantages(rewards, 4, weights[r], mask[r], rows=r) for r in (slice(0, half), slice(half, n))]
    torch.testing.assert_close(torch.cat(parts), whole)
    assert torch.equal(whole[~scorable_rows(rewards)], torch.zeros(int((~scorable_rows(rewards)).sum()), t))
