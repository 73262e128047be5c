"""Group, batch and token advantages against hand-computed values and the GDPO paper's toy case."""

import math

import pytest
import torch

from mrtpo.credit import (
    STD_EPS,
    gdpo_advantages,
    group_normalize,
    grpo_advantages,
    token_advantages,
)

SQRT_HALF = math.sqrt(0.5)


def gdpo_toy_rewards():
    """GDPO paper, G = 2, two 0/1 rewards: group 1 totals (0, 1), group 2 totals (0, 2)."""
    return torch.tensor([[0.0, 0.0], [1.0, 0.0], [0.0, 0.0], [1.0, 1.0]])


def test_gdpo_reference_numbers_before_batch_norm():
    adv = gdpo_advantages(gdpo_toy_rewards(), group_size=2, batch_norm=False)
    expected = torch.tensor([-SQRT_HALF, SQRT_HALF, -2 * SQRT_HALF, 2 * SQRT_HALF])
    torch.testing.assert_close(adv, expected, atol=2e-4, rtol=0)


def test_grpo_collapses_the_two_groups():
    adv = grpo_advantages(gdpo_toy_rewards(), group_size=2)
    expected = torch.tensor([-SQRT_HALF, SQRT_HALF, -SQRT_HALF, SQRT_HALF])
    torch.testing.assert_close(adv, expected, atol=2e-4, rtol=0)


def test_group_normalize_by_hand():
    # One group of 3: values 1, 2, 6 → mean 3, unbiased std sqrt(((−2)²+(−1)²+3²)/2) = sqrt(7).
    rewards = torch.tensor([[1.0], [2.0], [6.0]])
    adv = group_normalize(rewards, 3).squeeze(1)
    std = math.sqrt(7.0)
    expected = torch.tensor([-2 / (std + STD_EPS), -1 / (std + STD_EPS), 3 / (std + STD_EPS)], dtype=torch.float64)
    torch.testing.assert_close(adv, expected)


def test_batch_norm_gives_zero_mean_unit_std():
    adv = gdpo_advantages(gdpo_toy_rewards(), group_size=2).double()
    assert abs(adv.mean().item()) < 1e-6
    # S = (−a, a, −2a, 2a) with a = 1/√2 (up to eps): std over 4 values, unbiased.
    s = torch.tensor([-SQRT_HALF, SQRT_HALF, -2 * SQRT_HALF, 2 * SQRT_HALF], dtype=torch.float64)
    expected = (s - s.mean()) / (s.std() + STD_EPS)
    torch.testing.assert_close(adv, expected, atol=5e-4, rtol=0)


def test_nan_rewards_are_not_applicable():
    # Reward 2 applies only to completions 0 and 1 of the group; completion 2 has NaN.
    rewards = torch.tensor([[0.0, 1.0], [1.0, 0.0], [1.0, float("nan")]])
    adv = group_normalize(rewards, 3)
    assert adv[2, 1] == 0.0
    # Reward 2 stats over the two valid values (1, 0): mean 0.5, std √0.5.
    torch.testing.assert_close(adv[:2, 1], torch.tensor([0.5, -0.5], dtype=torch.float64) / (SQRT_HALF + STD_EPS))
    # Reward 1 stats over (0, 1, 1): mean 2/3, std sqrt(1/3).
    std = math.sqrt(1 / 3)
    torch.testing.assert_close(adv[:, 0], torch.tensor([-2 / 3, 1 / 3, 1 / 3], dtype=torch.float64) / (std + STD_EPS))
    assert torch.isfinite(gdpo_advantages(rewards, 3)).all()


def test_single_valid_value_and_all_nan_give_zero():
    rewards = torch.tensor([[float("nan"), 1.0], [float("nan"), float("nan")], [3.0, float("nan")]])
    assert torch.equal(group_normalize(rewards, 3), torch.zeros(3, 2, dtype=torch.float64))
    assert torch.equal(gdpo_advantages(rewards, 3), torch.zeros(3))


def test_group_of_size_one_gives_zero():
    rewards = torch.tensor([[1.0, 0.0], [0.0, 1.0], [5.0, 2.0]])
    assert torch.equal(gdpo_advantages(rewards, 1), torch.zeros(3))
    assert torch.equal(grpo_advantages(rewards, 1), torch.zeros(3))


def test_all_equal_rewards_give_zero():
    rewards = torch.full((6, 3), 0.5)
    assert torch.equal(gdpo_advantages(rewards, 3), torch.zeros(6))
    assert torch.equal(grpo_advantages(rewards, 3), torch.zeros(6))
    assert torch.equal(token_advantages(rewards, 3, torch.ones(6, 3, 4), torch.ones(6, 4)), torch.zeros(6, 4))


def test_reward_weights_scale_each_reward():
    rewards = gdpo_toy_rewards()
    only_first = gdpo_advantages(rewards, 2, reward_weights=[1.0, 0.0], batch_norm=False)
    torch.testing.assert_close(only_first, torch.tensor([-SQRT_HALF, SQRT_HALF] * 2), atol=2e-4, rtol=0)
    doubled = gdpo_advantages(rewards, 2, reward_weights=[2.0, 2.0], batch_norm=False)
    torch.testing.assert_close(doubled, 2 * gdpo_advantages(rewards, 2, batch_norm=False))


def test_token_advantages_by_hand():
    # One group of 2, two rewards; only reward 1 varies: Â[:,0] = ∓a, Â[:,1] = 0.
    rewards = torch.tensor([[0.0, 1.0], [1.0, 1.0]])
    weights = torch.tensor([[[2.0, 0.0], [1.0, 1.0]], [[0.5, 1.5], [1.0, 1.0]]])
    mask = torch.ones(2, 2)
    a = 0.5 / (SQRT_HALF + STD_EPS)
    raw = token_advantages(rewards, 2, weights, mask, batch_norm=False)
    torch.testing.assert_close(raw, torch.tensor([[-2 * a, 0.0], [0.5 * a, 1.5 * a]]))
    # With batch norm: S = (−a, a) → μ = 0, σ = a√2.
    normed = token_advantages(rewards, 2, weights, mask)
    torch.testing.assert_close(normed, raw / (a * math.sqrt(2) + STD_EPS))


def test_token_advantages_zero_on_masked_and_empty_rows():
    rewards = torch.tensor([[0.0], [1.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [0.0, 0.0, 0.0]])
    adv = token_advantages(rewards, 2, torch.ones(2, 1, 3), mask)
    assert adv[0, 2] == 0 and torch.equal(adv[1], torch.zeros(3))
    assert torch.isfinite(adv).all()


def test_batch_stats_override_matches_global_batch():
    """Two processes with gathered statistics compute what one process computes on the whole batch."""
    torch.manual_seed(0)
    rewards = torch.randint(0, 2, (8, 3)).float()
    full = gdpo_advantages(rewards, 2)
    from mrtpo.credit import batch_statistics, group_normalize, weighted_reward_sum

    stats = batch_statistics(weighted_reward_sum(group_normalize(rewards, 2)))
    halves = torch.cat(
        [gdpo_advantages(rewards[:4], 2, batch_stats=stats), gdpo_advantages(rewards[4:], 2, batch_stats=stats)]
    )
    torch.testing.assert_close(halves, full)


@pytest.mark.parametrize(
    "shape, group_size, message",
    [((4,), 2, r"\(N, K\)"), ((5, 2), 2, "multiple of group_size"), ((4, 2), 0, "group_size")],
)
def test_shape_errors_are_clear(shape, group_size, message):
    with pytest.raises(ValueError, match=message):
        gdpo_advantages(torch.zeros(shape), group_size)


def test_token_advantages_rejects_mismatched_weights():
    with pytest.raises(ValueError, match=r"weights must be \(N=2, K=1, T\)"):
        token_advantages(torch.zeros(2, 1), 2, torch.ones(2, 2, 3), torch.ones(2, 3))
    with pytest.raises(ValueError, match="reward_weights"):
        gdpo_advantages(torch.zeros(2, 2), 2, reward_weights=[1.0])


def test_rounding_sized_batch_spread_is_not_amplified():
    # One group of 2 whose rewards cancel: S = (±6e-5) is pure STD_EPS rounding, so no division.
    rewards = torch.tensor([[2.0, 0.0], [0.0, 1.0]])
    from mrtpo.credit import MIN_BATCH_STD, batch_statistics, group_normalize, weighted_reward_sum

    scores = weighted_reward_sum(group_normalize(rewards, 2))
    assert 0 < batch_statistics(scores)[1] < MIN_BATCH_STD
    adv = gdpo_advantages(rewards, 2)
    assert adv.abs().max() < 1e-3
    weights = torch.tensor([[[1.0, 0.0, 0.0], [1.0, 0.0, 0.0]], [[0.0, 2.0, 1.0], [2.0, 1.0, 0.0]]])
    token = token_advantages(rewards, 2, weights, torch.tensor([[1.0, 0, 0], [1, 1, 1]]))
    assert token.abs().max() < 3.0  # O(1) numerators, not ±10⁴
