"""Property-based checks of the invariants of docs/design.md#invariants over random shapes (hypothesis)."""

import torch
from hypothesis import given, settings, strategies as st

from mrtpo.credit import (
    JS_DISTANCE_MAX,
    CreditBatch,
    CreditConfig,
    compute_advantages,
    gdpo_advantages,
    js_distance,
    relevance_weights,
)

shapes = st.fixed_dictionaries(
    {
        "prompts": st.integers(1, 4),
        "group": st.integers(1, 5),
        "k": st.integers(1, 4),
        "t": st.integers(1, 9),
        "seed": st.integers(0, 2**31 - 1),
        "nan_rate": st.sampled_from([0.0, 0.2, 0.6]),
    }
)


def random_batch(p):
    gen = torch.Generator().manual_seed(p["seed"])
    n = p["prompts"] * p["group"]
    rewards = torch.randint(-3, 4, (n, p["k"]), generator=gen).float()
    rewards[torch.rand(n, p["k"], generator=gen) < p["nan_rate"]] = float("nan")
    lengths = torch.randint(0, p["t"] + 1, (n,), generator=gen)
    mask = (torch.arange(p["t"]).unsqueeze(0) < lengths.unsqueeze(1)).float()
    relevance = torch.rand(n, p["k"], p["t"], generator=gen) ** 3
    return CreditBatch(rewards, p["group"], mask, relevance=relevance), gen


@settings(max_examples=60, deadline=None)
@given(shapes, st.floats(0.0, 1.0), st.one_of(st.none(), st.floats(1.0, 4.0)))
def test_mean_over_valid_tokens_is_gdpo(p, lam, w_max):
    batch, _ = random_batch(p)
    adv = compute_advantages("mrtpo", batch, CreditConfig(lam=lam, w_max=w_max))
    assert torch.isfinite(adv).all()
    assert torch.equal(adv[batch.mask == 0], torch.zeros(int((batch.mask == 0).sum())))
    rows = batch.mask.sum(1) > 0
    mean = (adv * batch.mask).sum(1)[rows] / batch.mask.sum(1)[rows]
    torch.testing.assert_close(mean, gdpo_advantages(batch.rewards, p["group"])[rows], atol=1e-4, rtol=1e-4)


@settings(max_examples=60, deadline=None)
@given(shapes, st.floats(0.0, 1.0), st.one_of(st.none(), st.floats(1.0, 4.0)))
def test_weights_average_one_and_respect_cap(p, lam, w_max):
    batch, _ = random_batch(p)
    w = relevance_weights(batch.relevance[:, 0], batch.mask, lam=lam, w_max=w_max)
    rows = batch.mask.sum(1) > 0
    torch.testing.assert_close(
        (w * batch.mask).sum(1)[rows] / batch.mask.sum(1)[rows], torch.ones(int(rows.sum())), atol=1e-5, rtol=0
    )
    assert (w >= 0).all()
    if w_max is not None:
        assert (w <= w_max + 1e-5).all()


@settings(max_examples=40, deadline=None)
@given(shapes)
def test_reward_permutation_invariance(p):
    batch, gen = random_batch(p)
    perm = torch.randperm(p["k"], generator=gen)
    permuted = CreditBatch(batch.rewards[:, perm], p["group"], batch.mask, relevance=batch.relevance[:, perm])
    torch.testing.assert_close(
        compute_advantages("mrtpo", permuted), compute_advantages("mrtpo", batch), atol=1e-5, rtol=1e-5
    )


@settings(max_examples=40, deadline=None)
@given(
    st.integers(1, 3),
    st.integers(1, 12),
    st.integers(2, 70),
    st.integers(1, 40),
    st.integers(0, 2**31 - 1),
    st.floats(0.1, 30.0),
)
def test_js_bounds_symmetry_and_chunk_invariance(b, t, v, chunk, seed, scale):
    gen = torch.Generator().manual_seed(seed)
    logits_p = torch.randn(b, t, v, generator=gen) * scale
    logits_q = torch.randn(b, t, v, generator=gen) * scale
    d = js_distance(logits_p, logits_q, chunk_size=chunk)
    assert ((d >= 0) & (d <= JS_DISTANCE_MAX + 1e-6)).all()
    torch.testing.assert_close(d, js_distance(logits_q, logits_p, chunk_size=chunk), atol=1e-5, rtol=0)
    torch.testing.assert_close(d, js_distance(logits_p, logits_q, chunk_size=10_000), atol=1e-6, rtol=1e-6)
    assert torch.equal(js_distance(logits_p, logits_p.clone(), chunk_size=chunk), torch.zeros(b, t))
