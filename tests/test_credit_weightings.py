"""The weightings built to raise G = ℓ²/E[w²]: the moderate cap, rank weights, the batch mean (hand-computed)."""

import pytest
import torch

from mrtpo.credit import (
    MODERATE_LAM,
    MODERATE_W_MAX,
    CreditBatch,
    CreditConfig,
    batch_mean_weights,
    credit_weights,
    get_method,
    rank_weights,
    relevance_weights,
)
from mrtpo.credit.weights import rank_profile


def test_rank_profile_by_hand():
    # n = 4, power 1: (i + 1/2)/4 = 1/8, 3/8, 5/8, 7/8, mean 1/2 -> 0.25, 0.75, 1.25, 1.75
    torch.testing.assert_close(rank_profile(4), torch.tensor([0.25, 0.75, 1.25, 1.75], dtype=torch.float64))
    # power 2: 1, 9, 25, 49 over 64, mean 84/256 -> (1, 9, 25, 49) / 21
    torch.testing.assert_close(rank_profile(4, 2.0), torch.tensor([1, 9, 25, 49], dtype=torch.float64) / 21)


def test_rank_profile_mean_square_tends_to_closed_form():
    for p in (1.0, 2.0):
        f = rank_profile(4000, p)
        assert float((f**2).mean()) == pytest.approx((p + 1) ** 2 / (2 * p + 1), rel=1e-3)


def test_rank_weights_by_hand():
    d = torch.tensor([[0.3, 0.1, 0.9, 0.5]])  # ranks 1, 0, 3, 2
    torch.testing.assert_close(rank_weights(d, torch.ones(1, 4)), torch.tensor([[0.75, 0.25, 1.75, 1.25]]))
    # λ = 0.5: 0.5 + 0.5 f
    torch.testing.assert_close(rank_weights(d, torch.ones(1, 4), lam=0.5), torch.tensor([[0.875, 0.625, 1.375, 1.125]]))


def test_rank_weights_ties_share_their_block_and_keep_mean_one():
    d = torch.tensor([[0.2, 0.2, 0.5, 0.9]])  # the two 0.2 share (0.25 + 0.75) / 2
    torch.testing.assert_close(rank_weights(d, torch.ones(1, 4)), torch.tensor([[0.5, 0.5, 1.25, 1.75]]))


def test_rank_weights_mean_square_is_fixed_whatever_the_tail():
    """Two maps with the same order but a mild and a heavy tail: proportional weights differ a lot in
    E[w²], rank weights not at all."""
    mild = torch.tensor([[1.0, 1.1, 1.2, 1.3, 1.4, 1.5]])
    heavy = torch.tensor([[1e-3, 1e-2, 0.1, 1.0, 10.0, 100.0]])
    mask = torch.ones(1, 6)
    w_mild, w_heavy = rank_weights(mild, mask), rank_weights(heavy, mask)
    torch.testing.assert_close(w_mild, w_heavy)
    expected = float((rank_profile(6) ** 2).mean())
    assert float((w_heavy**2).mean()) == pytest.approx(expected, rel=1e-6)
    assert float((relevance_weights(heavy, mask) ** 2).mean()) > 4 * float((relevance_weights(mild, mask) ** 2).mean())


def test_rank_weights_mask_uniform_fallback_and_cap():
    d = torch.tensor([[0.9, 0.1, 7.0], [0.0, 0.0, 0.0], [3.0, 1.0, 2.0]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 1], [1, 1, 1]])
    w = rank_weights(d, mask)
    # row 0: two valid tokens, profile (1/4, 3/4) / (1/2) = (0.5, 1.5); the masked one is 0
    torch.testing.assert_close(w[0], torch.tensor([1.5, 0.5, 0.0]))
    torch.testing.assert_close(w[1], torch.ones(3))  # no relevance: uniform
    # row 2: profile n=3 is (1/6, 3/6, 5/6) / (1/2) = (1/3, 1, 5/3); capped at 1.5 -> the rest share 1.5
    capped = rank_weights(d[2:], torch.ones(1, 3), w_max=1.5)
    torch.testing.assert_close(capped, torch.tensor([[1.5, 1.5 * (1 / 3) / (4 / 3), 1.5 * 1 / (4 / 3)]]))
    assert float(capped.mean()) == pytest.approx(1.0)


def test_batch_mean_weights_by_hand():
    # batch mean of d over the 5 valid tokens: (1 + 3 + 0 + 0 + 1) / 5 = 1
    d = torch.tensor([[1.0, 3.0, 9.0], [0.0, 0.0, 1.0]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    w = batch_mean_weights(d, mask)
    torch.testing.assert_close(w, torch.tensor([[1.0, 3.0, 0.0], [0.0, 0.0, 1.0]]))
    # mean 1 over the batch's valid tokens, not per response (row 0 averages 2, row 1 1/3)
    assert float(w.sum() / mask.sum()) == pytest.approx(1.0)
    torch.testing.assert_close(w.sum(1) / mask.sum(1), torch.tensor([2.0, 1 / 3]))
    # λ = 0.5: 0.5 + 0.5 d / 1
    torch.testing.assert_close(batch_mean_weights(d, mask, lam=0.5), torch.tensor([[1.0, 2.0, 0.0], [0.5, 0.5, 1.0]]))


def test_batch_mean_weights_cap_holds_the_batch_mean():
    d = torch.tensor([[8.0, 0.0], [0.0, 0.0]])  # mean 2: proportional 4, 0, 0, 0
    w = batch_mean_weights(d, torch.ones(2, 2), w_max=2.5)
    torch.testing.assert_close(w, torch.tensor([[2.5, 0.5], [0.5, 0.5]]))
    torch.testing.assert_close(batch_mean_weights(torch.zeros(2, 2), torch.ones(2, 2)), torch.ones(2, 2))


def test_moderate_cap_keeps_weights_in_its_range():
    torch.manual_seed(0)
    d = torch.rand(64, 20) ** 6  # heavy-tailed maps
    w = relevance_weights(d, torch.ones(64, 20), MODERATE_LAM, MODERATE_W_MAX)
    assert float(w.min()) >= 0.5 - 1e-6 and float(w.max()) <= 3.0 + 1e-6
    torch.testing.assert_close(w.mean(1), torch.ones(64))


def _batch(relevance, mask, rewards):
    return CreditBatch(rewards, 2, mask, relevance=relevance)


def test_config_chooses_the_shape_for_every_reward():
    d = torch.tensor(
        [[[0.3, 0.1, 0.9, 0.5], [1.0, 1.0, 1.0, 5.0]], [[0.0, 1.0, 0.0, 0.0], [2.0, 2.0, 2.0, 2.0]]]
    )  # (N=2, K=2, T=4)
    mask = torch.ones(2, 4)
    batch = _batch(d, mask, torch.tensor([[1.0, 0.0], [0.0, 1.0]]))
    rank = credit_weights(batch, CreditConfig(weighting="rank"), "per_reward")
    torch.testing.assert_close(rank[0, 0], torch.tensor([0.75, 0.25, 1.75, 1.25]))
    # three tied tokens share (0.25 + 0.75 + 1.25) / 3 = 0.75
    torch.testing.assert_close(rank[0, 1], torch.tensor([0.75, 0.75, 0.75, 1.75]))
    plain = credit_weights(batch, CreditConfig(), "per_reward")
    torch.testing.assert_close(plain[1, 0], torch.tensor([0.0, 4.0, 0.0, 0.0]))
    # the batch mean of reward 0's map over both responses: (1.8 + 1) / 8 = 0.35
    batch_w = credit_weights(batch, CreditConfig(weight_mean="batch"), "per_reward")
    torch.testing.assert_close(batch_w[:, 0], d[:, 0] / 0.35)


def test_batch_mean_leaves_out_rows_without_a_map():
    """Rows whose map was not computed (has_evidence False) neither take part in the batch mean nor change."""
    d = torch.tensor([[[2.0, 0.0]], [[0.0, 0.0]]])
    batch = CreditBatch(
        torch.tensor([[1.0], [0.0]]), 2, torch.ones(2, 2), relevance=d, has_evidence=torch.tensor([[True], [False]])
    )
    w = credit_weights(batch, CreditConfig(weight_mean="batch"), "per_reward")
    torch.testing.assert_close(w[:, 0], torch.tensor([[2.0, 0.0], [1.0, 1.0]]))


def test_joint_map_under_batch_mean_and_uniform_unmapped_rows():
    joint = torch.tensor([[3.0, 1.0], [0.0, 0.0]])  # row 1 was not replayed
    batch = CreditBatch(torch.tensor([[1.0], [0.0]]), 2, torch.ones(2, 2), joint_relevance=joint)
    w = credit_weights(batch, CreditConfig(weight_mean="batch"), "joint")
    torch.testing.assert_close(w[:, 0], torch.tensor([[1.5, 0.5], [1.0, 1.0]]))


def test_advantages_under_rank_weights_average_to_the_sequence_advantage():
    """Mean 1 per response keeps GDPO's sequence advantage as each response's token mean."""
    torch.manual_seed(1)
    n, k, t = 8, 2, 6
    rewards = torch.randint(0, 2, (n, k)).float()
    batch = CreditBatch(rewards, 4, torch.ones(n, t), relevance=torch.rand(n, k, t))
    config = CreditConfig(weighting="rank", rank_power=2.0)
    adv = get_method("mrtpo")(batch, config)
    torch.testing.assert_close(adv.mean(1), get_method("gdpo").sequence_advantages(batch, config), atol=1e-5, rtol=0)


def test_config_rejects_unknown_and_contradictory_shapes():
    with pytest.raises(ValueError, match="weighting"):
        CreditConfig(weighting="softmax")
    with pytest.raises(ValueError, match="weight_mean"):
        CreditConfig(weight_mean="running")
    with pytest.raises(ValueError, match="rank_power"):
        CreditConfig(weighting="rank", rank_power=0.0)
    with pytest.raises(ValueError, match="does not apply"):
        CreditConfig(weighting="rank", weight_mean="batch")


def test_trainer_config_checks_the_weight_shape(tmp_path):
    from mrtpo.trainer import MRTPOConfig

    base = dict(
        output_dir=str(tmp_path),
        use_cpu=True,
        bf16=False,
        report_to=[],
        per_device_train_batch_size=4,
        num_generations=2,
    )
    config = MRTPOConfig(**base, weighting="rank", rank_power=2.0)
    assert (config.weighting, config.rank_power, config.weight_mean) == ("rank", 2.0, "response")
    with pytest.raises(ValueError, match="does not apply"):
        MRTPOConfig(**base, weighting="rank", weight_mean="batch")
