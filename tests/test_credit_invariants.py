"""The invariants of docs/design.md#invariants, over every registered credit method.

Parametrised by the registry itself, so a new method is checked the moment it is registered: its
weights are 0 on padding and average 1 over each response's tokens for each reward (credit is moved,
never created), its token advantages are those weights applied to GDPO's per-reward advantages and
average to its sequence advantage, and with flat relevance it is exactly its sequence method.
"""

import dataclasses

import pytest
import torch

from mrtpo.credit import (
    CreditBatch,
    CreditConfig,
    available_methods,
    gdpo_advantages,
    get_method,
    grpo_advantages,
    token_advantages,
)

N_PROMPTS, GROUP, K, T = 3, 4, 3, 7
#: Shape of each optional map field of CreditBatch: a new field needs its shape here (the test says so).
MAP_SHAPES = {
    "relevance": (K, T),
    "decoy_relevance": (K, T),
    "joint_relevance": (T,),
    "entropy": (T,),
    "known_positions": (K, T),
}
#: Fields that are 0/1 masks rather than maps (random: each position known with probability 1/3; flat: all known).
MASKS = ("known_positions",)
CONFIGS = {
    "paper": CreditConfig(lam=1.0),
    "bounded": CreditConfig(lam=0.2, w_max=1.2),
    "weighted": CreditConfig(lam=0.7, w_max=2.0, reward_weights=[1.0, 0.5, 2.0]),
}


def full_batch(seed: int = 0, flat: bool = False) -> CreditBatch:
    """A batch carrying every map any method may need: random (or, ``flat``, constant) relevance."""
    gen = torch.Generator().manual_seed(seed)
    n = N_PROMPTS * GROUP
    lengths = torch.randint(2, T + 1, (n,), generator=gen)
    mask = (torch.arange(T).unsqueeze(0) < lengths.unsqueeze(1)).float()
    maps = {}
    for field in dataclasses.fields(CreditBatch):
        if field.name in ("rewards", "group_size", "mask", "has_evidence", "rows"):
            continue
        if field.name not in MAP_SHAPES:
            raise AssertionError(f"CreditBatch.{field.name} is new: give its shape in MAP_SHAPES")
        shape = (n, *MAP_SHAPES[field.name])
        if field.name in MASKS:
            values = torch.ones(shape) if flat else (torch.rand(shape, generator=gen) < 1 / 3).float()
        else:
            values = torch.full(shape, 0.5) if flat else torch.rand(shape, generator=gen) + 0.01
        maps[field.name] = values * mask.view(n, *([1] * (len(shape) - 2)), T)
    if flat and "decoy_relevance" in maps:
        maps["decoy_relevance"] = torch.zeros_like(maps["decoy_relevance"])  # contrastive: map less decoy is flat
    rewards = torch.randint(0, 3, (n, K), generator=gen).float()
    return CreditBatch(rewards, GROUP, mask, has_evidence=[True] * K, **maps)


def sequence_advantages(method, batch: CreditBatch, config: CreditConfig):
    if method.sequence == "grpo":
        return grpo_advantages(batch.rewards, batch.group_size, config.reward_weights)
    return gdpo_advantages(batch.rewards, batch.group_size, config.reward_weights, config.batch_norm)


def masked_mean(x, mask):
    return (x * mask).sum(-1) / mask.sum(-1)


def check_weights(name: str, config: CreditConfig) -> None:
    batch = full_batch(seed=1)
    weights = get_method(name).weights(batch, config)
    assert weights.shape == (N_PROMPTS * GROUP, K, T)
    mask = batch.mask.unsqueeze(1).expand_as(weights)
    assert torch.all(weights[mask == 0] == 0)
    torch.testing.assert_close(masked_mean(weights, batch.mask.unsqueeze(1)), torch.ones(N_PROMPTS * GROUP, K))


def check_advantages(name: str, config: CreditConfig) -> None:
    method = get_method(name)
    batch = full_batch(seed=2)
    advantages = method(batch, config)
    assert torch.all(advantages[batch.mask == 0] == 0)
    torch.testing.assert_close(
        masked_mean(advantages, batch.mask), sequence_advantages(method, batch, config), atol=1e-5, rtol=1e-5
    )
    if method.sequence == "gdpo":  # GDPO's per-reward advantages, each on its own weights
        expected = token_advantages(
            batch.rewards,
            GROUP,
            method.weights(batch, config),
            batch.mask,
            reward_weights=config.reward_weights,
            batch_norm=config.batch_norm,
        )
        torch.testing.assert_close(advantages, expected, atol=1e-6, rtol=1e-6)


def check_flat(name: str) -> None:
    method = get_method(name)
    batch, config = full_batch(seed=3, flat=True), CreditConfig(lam=1.0)
    expected = sequence_advantages(method, batch, config).unsqueeze(1) * batch.mask
    torch.testing.assert_close(method(batch, config), expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("config", CONFIGS.values(), ids=CONFIGS.keys())
@pytest.mark.parametrize("name", available_methods())
def test_weights_average_one_and_vanish_on_padding(name, config):
    check_weights(name, config)


@pytest.mark.parametrize("config", CONFIGS.values(), ids=CONFIGS.keys())
@pytest.mark.parametrize("name", available_methods())
def test_token_advantages_move_the_sequence_advantage_without_creating_any(name, config):
    check_advantages(name, config)


@pytest.mark.parametrize("name", available_methods())
def test_flat_relevance_is_the_sequence_method_at_every_token(name):
    check_flat(name)


def test_a_newly_registered_method_is_checked_and_a_broken_one_caught():
    """A method registered in one place is picked up by the checks above; one that creates credit
    (weights ``2 × MRTPO's``) or puts all credit where its weights do not say fails them."""
    from mrtpo.credit import register_method
    from mrtpo.credit.methods import _METHODS

    mrtpo = get_method("mrtpo")
    register_method("test-double-credit", "per_reward", "creates credit", transform=lambda w, b: 2 * w)(
        lambda batch, config: token_advantages(
            batch.rewards, batch.group_size, 2 * mrtpo.weights(batch, config), batch.mask
        )
    )
    register_method("test-first-token", "none", "all credit on the first token")(
        lambda batch, config: (
            gdpo_advantages(batch.rewards, batch.group_size).unsqueeze(1)
            * torch.nn.functional.one_hot(torch.zeros(batch.mask.shape[0], dtype=torch.long), batch.mask.shape[1])
            * batch.mask.sum(1, keepdim=True)
        )
    )
    try:
        assert "test-double-credit" in available_methods()
        with pytest.raises(AssertionError):
            check_weights("test-double-credit", CONFIGS["paper"])
        with pytest.raises(AssertionError):
            check_advantages("test-double-credit", CONFIGS["paper"])
        check_weights("test-first-token", CONFIGS["paper"])  # it reports uniform weights ...
        with pytest.raises(AssertionError):
            check_advantages("test-first-token", CONFIGS["paper"])  # ... that are not the ones it applies
        with pytest.raises(AssertionError):
            check_flat("test-first-token")  # ... nor GDPO where the map is flat
    finally:
        _METHODS.pop("test-double-credit", None)
        _METHODS.pop("test-first-token", None)
