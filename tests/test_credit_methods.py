"""The method registry and the invariants of docs/design.md#invariants across methods."""

import pytest
import torch

from mrtpo.credit import (
    CreditBatch,
    CreditConfig,
    available_methods,
    compute_advantages,
    credit_weights,
    gdpo_advantages,
    get_method,
    grpo_advantages,
    register_method,
    token_advantages,
)


def make_batch(n_prompts=3, group=4, k=3, t=6, seed=0):
    gen = torch.Generator().manual_seed(seed)
    rewards = torch.randint(0, 3, (n_prompts * group, k), generator=gen).float()
    lengths = torch.randint(1, t + 1, (n_prompts * group,), generator=gen)
    mask = (torch.arange(t).unsqueeze(0) < lengths.unsqueeze(1)).float()
    return CreditBatch(
        rewards=rewards,
        group_size=group,
        mask=mask,
        relevance=torch.rand(n_prompts * group, k, t, generator=gen),
        has_evidence=[True] * k,
        joint_relevance=torch.rand(n_prompts * group, t, generator=gen),
        entropy=torch.rand(n_prompts * group, t, generator=gen) * 3,
    )


def masked_mean(adv, mask):
    return (adv * mask).sum(1) / mask.sum(1)


def test_registry_has_the_spec_methods_with_their_needs():
    assert {"grpo", "gdpo", "mrtpo", "contrast", "entropy"} <= set(available_methods())
    needs = {name: get_method(name).needs for name in ("grpo", "gdpo", "mrtpo", "contrast", "entropy")}
    assert needs == {"grpo": "none", "gdpo": "none", "mrtpo": "per_reward", "contrast": "joint", "entropy": "entropy"}


def test_grpo_and_gdpo_are_uniform_over_tokens():
    batch = make_batch()
    grpo = compute_advantages("grpo", batch)
    gdpo = compute_advantages("gdpo", batch)
    torch.testing.assert_close(grpo, grpo_advantages(batch.rewards, 4).unsqueeze(1) * batch.mask)
    torch.testing.assert_close(gdpo, gdpo_advantages(batch.rewards, 4).unsqueeze(1) * batch.mask)


def test_uniform_weights_reproduce_gdpo_at_every_token():
    batch = make_batch()
    batch.relevance = torch.zeros_like(batch.relevance)  # no relevance ⇒ uniform fallback
    adv = compute_advantages("mrtpo", batch)
    expected = gdpo_advantages(batch.rewards, 4).unsqueeze(1) * batch.mask
    torch.testing.assert_close(adv, expected)
    ones = token_advantages(batch.rewards, 4, torch.ones(12, 3, 6), batch.mask)
    torch.testing.assert_close(ones, expected)


@pytest.mark.parametrize("method", ["mrtpo", "contrast", "entropy"])
def test_mean_over_tokens_equals_gdpo(method):
    batch = make_batch(seed=3)
    adv = compute_advantages(method, batch, CreditConfig(lam=1.0))
    gdpo = gdpo_advantages(batch.rewards, 4)
    torch.testing.assert_close(masked_mean(adv, batch.mask), gdpo, atol=1e-5, rtol=1e-5)


def test_mean_over_tokens_holds_with_cap_and_lambda():
    batch = make_batch(seed=4)
    adv = compute_advantages("mrtpo", batch, CreditConfig(lam=0.7, w_max=2.0))
    torch.testing.assert_close(masked_mean(adv, batch.mask), gdpo_advantages(batch.rewards, 4), atol=1e-5, rtol=1e-5)


def test_reward_lam_gives_each_reward_its_own_interpolation():
    # One completion of 4 tokens (3 valid), relevance 1, 2, 3 for both rewards (mean 2).
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    relevance = torch.tensor([[1.0, 2.0, 3.0, 9.0]]).unsqueeze(1).expand(1, 2, 4).clone()
    batch = CreditBatch(
        rewards=torch.zeros(1, 2), group_size=1, mask=mask, relevance=relevance, has_evidence=[True, True]
    )
    weights = credit_weights(batch, CreditConfig(reward_lam=[0.0, 0.5]), "per_reward")
    # reward 0, lam 0: uniform; reward 1, lam 0.5: 0.5 + 0.5 * r / 2 = 0.75, 1.0, 1.25 (mean 1); padding 0
    torch.testing.assert_close(weights[0, 0], torch.tensor([1.0, 1.0, 1.0, 0.0]))
    torch.testing.assert_close(weights[0, 1], torch.tensor([0.75, 1.0, 1.25, 0.0]))
    # the same as the shared lam for the reward that has it
    shared = credit_weights(batch, CreditConfig(lam=0.5), "per_reward")
    torch.testing.assert_close(weights[0, 1], shared[0, 1])


def test_reward_lam_keeps_the_sequence_mean_and_checks_its_length_and_range():
    batch = make_batch(seed=6)
    adv = compute_advantages("mrtpo", batch, CreditConfig(reward_lam=[0.2, 1.0, 0.0], w_max=1.5))
    torch.testing.assert_close(masked_mean(adv, batch.mask), gdpo_advantages(batch.rewards, 4), atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match=r"one entry per reward \(3\), got 2"):
        compute_advantages("mrtpo", batch, CreditConfig(reward_lam=[0.2, 1.0]))
    with pytest.raises(ValueError, match=r"in \[0, 1\]"):
        compute_advantages("mrtpo", batch, CreditConfig(reward_lam=[0.2, 1.5, 0.0]))


def test_rewards_without_evidence_stay_uniform():
    batch = make_batch(seed=5)
    batch.has_evidence = [True, False, False]
    adv = compute_advantages("mrtpo", batch)
    # Changing the relevance of a reward without evidence changes nothing.
    batch.relevance[:, 1:] = torch.rand_like(batch.relevance[:, 1:]) * 100
    torch.testing.assert_close(compute_advantages("mrtpo", batch), adv)
    # Changing the relevance of the reward with evidence does (where it has a nonzero advantage).
    batch.relevance[:, 0] = torch.rand_like(batch.relevance[:, 0])
    assert not torch.allclose(compute_advantages("mrtpo", batch), adv)


def test_mrtpo_moves_credit_to_the_relevant_token():
    # One group of 2, one reward: completion 1 wins. All relevance on token 2 of each completion.
    rewards = torch.tensor([[0.0], [1.0]])
    mask = torch.ones(2, 4)
    relevance = torch.zeros(2, 1, 4)
    relevance[:, 0, 2] = 0.3
    adv = compute_advantages("mrtpo", CreditBatch(rewards, 2, mask, relevance=relevance))
    gdpo = gdpo_advantages(rewards, 2)
    torch.testing.assert_close(adv[:, 2], 4 * gdpo)  # weight 4 on the one relevant token …
    torch.testing.assert_close(adv[:, [0, 1, 3]], torch.zeros(2, 3))  # … μ = 0, so 0 elsewhere


def test_reward_order_does_not_change_mrtpo():
    batch = make_batch(seed=6)
    perm = [2, 0, 1]
    permuted = CreditBatch(
        batch.rewards[:, perm],
        batch.group_size,
        batch.mask,
        relevance=batch.relevance[:, perm],
        has_evidence=[batch.has_evidence[i] for i in perm],
    )
    config = CreditConfig(reward_weights=[1.0, 2.0, 0.5])
    permuted_config = CreditConfig(reward_weights=[0.5, 1.0, 2.0])
    torch.testing.assert_close(
        compute_advantages("mrtpo", permuted, permuted_config),
        compute_advantages("mrtpo", batch, config),
        atol=1e-6,
        rtol=1e-6,
    )


def test_group_order_does_not_change_results():
    batch = make_batch(seed=7)
    order = torch.tensor([8, 9, 10, 11, 0, 1, 2, 3, 4, 5, 6, 7])  # groups 3, 1, 2
    shuffled = CreditBatch(
        batch.rewards[order],
        4,
        batch.mask[order],
        relevance=batch.relevance[order],
        joint_relevance=batch.joint_relevance[order],
        entropy=batch.entropy[order],
    )
    for method in ("grpo", "gdpo", "mrtpo", "contrast", "entropy"):
        torch.testing.assert_close(
            compute_advantages(method, shuffled), compute_advantages(method, batch)[order], atol=1e-6, rtol=1e-6
        )


def test_missing_inputs_and_unknown_method_are_clear_errors():
    batch = make_batch()
    with pytest.raises(KeyError, match="unknown credit method 'gspo'.*mrtpo"):
        get_method("gspo")
    with pytest.raises(ValueError, match="contrast.*joint relevance"):
        compute_advantages("contrast", CreditBatch(batch.rewards, 4, batch.mask))
    with pytest.raises(ValueError, match="mrtpo.*per-reward relevance"):
        compute_advantages("mrtpo", CreditBatch(batch.rewards, 4, batch.mask))
    with pytest.raises(ValueError, match="already registered"):
        register_method("gdpo", "none", "duplicate")(lambda b, c: b.mask)


@pytest.mark.parametrize("method", ["grpo", "gdpo", "mrtpo", "contrast", "entropy"])
def test_two_processes_with_global_rewards_match_one(method):
    """Each process holds its rows' relevance; rewards are gathered: the split changes nothing."""
    batch = make_batch(n_prompts=4, group=2, seed=8)
    whole = compute_advantages(method, batch)
    parts = []
    for rows in (slice(0, 3), slice(3, 8)):  # an uneven split that cuts a group in half
        parts.append(
            compute_advantages(
                method,
                CreditBatch(
                    batch.rewards,
                    2,
                    batch.mask[rows],
                    relevance=batch.relevance[rows],
                    joint_relevance=batch.joint_relevance[rows],
                    entropy=batch.entropy[rows],
                    rows=rows,
                ),
            )
        )
    torch.testing.assert_close(torch.cat(parts), whole)


def test_per_completion_evidence_presence():
    """(N, K) has_evidence: a slot a prompt lacks stays uniform for that completion only."""
    batch = make_batch(seed=9)
    has = torch.ones(12, 3, dtype=torch.bool)
    has[:4, 2] = False  # the first prompt has no third constraint
    batch.has_evidence = has
    w = get_method("mrtpo").weights(batch)
    torch.testing.assert_close(w[:4, 2], batch.mask[:4])
    assert not torch.allclose(w[4:, 2], batch.mask[4:])
    with pytest.raises(ValueError, match="has_evidence"):
        batch.has_evidence = torch.ones(5, 3, dtype=torch.bool)
        get_method("mrtpo").weights(batch)


def test_shuffled_control_permutes_mrtpo_weights_within_each_response():
    batch = make_batch(t=9, seed=3)
    config = CreditConfig()
    mrtpo = get_method("mrtpo").weights(batch, config)
    shuffled = get_method("mrtpo-shuffled").weights(batch, config)
    mask = batch.mask.bool()
    moved = 0
    for j in range(mask.shape[0]):
        n = int(mask[j].sum())
        for i in range(mrtpo.shape[1]):
            a, b = mrtpo[j, i, :n], shuffled[j, i, :n]
            torch.testing.assert_close(b.sort().values, a.sort().values)  # the same values ...
            moved += int(not torch.equal(a, b))  # ... on other tokens
        assert torch.all(shuffled[j, :, n:] == 0)
    assert moved > mrtpo.shape[0]  # most rows of several tokens change order
    assert torch.equal(shuffled, get_method("mrtpo-shuffled").weights(batch, config))  # seeded by the batch


def test_swapped_control_gives_each_reward_the_next_rewards_map():
    batch = make_batch(seed=5)
    config = CreditConfig()
    mrtpo = get_method("mrtpo").weights(batch, config)
    swapped = get_method("mrtpo-swapped").weights(batch, config)
    for i in range(mrtpo.shape[1]):
        torch.testing.assert_close(swapped[:, i], mrtpo[:, (i + 1) % mrtpo.shape[1]])


@pytest.mark.parametrize("control", ["mrtpo-shuffled", "mrtpo-swapped"])
def test_controls_move_credit_like_mrtpo_without_creating_it(control):
    """Each control's token advantages average to GDPO's sequence advantage, as MRTPO's do, and
    they are the advantages of its own weights."""
    batch = make_batch(t=8, seed=6)
    config = CreditConfig()
    method = get_method(control)
    assert method.needs == "per_reward"
    adv = method(batch, config)
    torch.testing.assert_close(
        masked_mean(adv, batch.mask), gdpo_advantages(batch.rewards, batch.group_size), atol=1e-5, rtol=1e-5
    )
    expected = token_advantages(batch.rewards, batch.group_size, method.weights(batch, config), batch.mask)
    torch.testing.assert_close(adv, expected)
    assert not torch.allclose(adv, compute_advantages("mrtpo", batch, config))


def test_gdpo_cancels_on_a_constant_sum_group_and_mrtpo_does_not():
    """Two equally weighted rewards that trade off inside each group (r1 + r2 constant): their group-
    normalised advantages are negatives of each other, so GDPO's summed advantage is exactly 0 for
    every completion; MRTPO puts the two signs on each reward's own tokens, which need not cancel."""
    r1 = torch.tensor([1.0, 0.0, 1.0, 0.0, 0.0, 1.0, 1.0, 1.0])
    rewards = torch.stack([r1, 1.0 - r1], dim=1)  # (8, 2), two groups of 4
    t = 6
    mask = torch.ones(8, t)
    relevance = torch.zeros(8, 2, t)
    relevance[:, 0, :3] = 1.0  # reward 1 reads the first half of each response
    relevance[:, 1, 3:] = 1.0  # reward 2 the second half
    batch = CreditBatch(rewards=rewards, group_size=4, mask=mask, relevance=relevance, has_evidence=[True, True])
    gdpo = compute_advantages("gdpo", batch)
    assert torch.count_nonzero(gdpo) == 0
    mrtpo = compute_advantages("mrtpo", batch)
    assert mrtpo.abs().min() > 0.5  # every token credited, with the sign of the reward that reads it
    first, second = mrtpo[:, :3], mrtpo[:, 3:]
    assert torch.all(torch.sign(first) == torch.sign(r1 - 0.5).unsqueeze(1))
    assert torch.all(torch.sign(second) == -torch.sign(r1 - 0.5).unsqueeze(1))
    torch.testing.assert_close(masked_mean(mrtpo, mask), torch.zeros(8), atol=1e-5, rtol=0)  # still no net credit


def test_explain_writes_out_trainings_default_weight_shape():
    from mrtpo.credit import DEFAULT_LAM, DEFAULT_W_MAX
    from mrtpo.explain import WEIGHT_SHAPE
    from mrtpo.trainer.config import MRTPOConfig

    assert WEIGHT_SHAPE == {"lam": DEFAULT_LAM, "w_max": DEFAULT_W_MAX}
    defaults = {f.name: f.default for f in MRTPOConfig.__dataclass_fields__.values()}
    assert (defaults["lam"], defaults["w_max"]) == (DEFAULT_LAM, DEFAULT_W_MAX) == (0.2, 1.2)
