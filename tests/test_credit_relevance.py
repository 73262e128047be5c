"""JS / KL / log-ratio / entropy relevance against scipy and the SPEC's reference numbers."""

import math

import numpy as np
import pytest
import torch
from scipy.spatial.distance import jensenshannon
from scipy.stats import entropy as scipy_entropy

from mrtpo.credit import (
    JS_DISTANCE_MAX,
    entropy,
    js_distance,
    js_divergence,
    kl_divergence,
    log_ratio,
    log_ratio_from_logprobs,
    relevance,
)


def as_logits(probs) -> torch.Tensor:
    """(V,) probabilities → (1, 1, V) logits (log p; zeros become -inf)."""
    return torch.tensor(probs, dtype=torch.float64).log().float().view(1, 1, -1)


def test_spec_reference_natural_log():
    d = js_distance(as_logits([1.0, 0.0]), as_logits([0.5, 0.5]))
    assert d.item() == pytest.approx(0.46450140402245893, abs=1e-6)


def test_spec_reference_disjoint_base2():
    # scipy base 2 gives 1.0 for disjoint supports; in nats the distance is sqrt(ln 2).
    d = js_distance(as_logits([1.0, 0.0, 0.0]), as_logits([0.0, 1.0, 0.0]))
    assert d.item() / math.sqrt(math.log(2)) == pytest.approx(1.0, abs=1e-6)
    assert jensenshannon([1, 0, 0], [0, 1, 0], base=2) == pytest.approx(1.0)


def test_random_distributions_match_scipy():
    gen = torch.Generator().manual_seed(1)
    logits_p = torch.randn(3, 7, 50, generator=gen) * 3
    logits_q = torch.randn(3, 7, 50, generator=gen) * 3
    d = js_distance(logits_p, logits_q, chunk_size=5)
    p = torch.softmax(logits_p.double(), -1).numpy()
    q = torch.softmax(logits_q.double(), -1).numpy()
    expected = np.array([[jensenshannon(p[b, t], q[b, t]) for t in range(7)] for b in range(3)])
    np.testing.assert_allclose(d.numpy(), expected, atol=1e-5)


def test_identical_distributions_give_exact_zero():
    logits = torch.randn(4, 9, 300) * 10
    assert torch.equal(js_distance(logits, logits.clone()), torch.zeros(4, 9))
    assert torch.equal(kl_divergence(logits, logits.clone()), torch.zeros(4, 9))
    bf16 = logits.bfloat16()
    assert torch.equal(js_distance(bf16, bf16.clone()), torch.zeros(4, 9))


def test_symmetry_and_bound():
    logits_p, logits_q = torch.randn(2, 5, 40) * 20, torch.randn(2, 5, 40) * 20
    d_pq, d_qp = js_distance(logits_p, logits_q), js_distance(logits_q, logits_p)
    torch.testing.assert_close(d_pq, d_qp, atol=1e-6, rtol=0)
    assert (d_pq <= JS_DISTANCE_MAX + 1e-7).all() and (d_pq >= 0).all()


def test_chunk_size_does_not_change_the_result():
    logits_p, logits_q = torch.randn(3, 11, 64), torch.randn(3, 11, 64)
    mask = (torch.rand(3, 11) > 0.3).float()
    ref = js_distance(logits_p, logits_q, mask, chunk_size=1)
    for chunk in (2, 7, 33, 10_000):
        torch.testing.assert_close(js_distance(logits_p, logits_q, mask, chunk_size=chunk), ref, atol=1e-6, rtol=1e-6)


def test_mask_zeroes_positions_and_empty_mask():
    logits_p, logits_q = torch.randn(2, 4, 16), torch.randn(2, 4, 16)
    mask = torch.tensor([[1, 1, 0, 0], [0, 0, 0, 0]])
    d = js_distance(logits_p, logits_q, mask)
    assert torch.equal(d[mask == 0], torch.zeros(6))
    assert (d[mask == 1] > 0).all()
    torch.testing.assert_close(d[0, :2], js_distance(logits_p, logits_q)[0, :2])


def test_temperature_scales_logits():
    logits_p, logits_q = torch.randn(1, 3, 20), torch.randn(1, 3, 20)
    torch.testing.assert_close(
        js_distance(logits_p, logits_q, temperature=0.5), js_distance(2 * logits_p, 2 * logits_q)
    )


def test_top_k_is_a_lower_bound_and_exact_at_full_vocab():
    gen = torch.Generator().manual_seed(2)
    logits_p, logits_q = torch.randn(2, 6, 100, generator=gen) * 2, torch.randn(2, 6, 100, generator=gen) * 2
    exact = js_distance(logits_p, logits_q)
    assert (js_distance(logits_p, logits_q, top_k=5) <= exact + 1e-6).all()
    torch.testing.assert_close(js_distance(logits_p, logits_q, top_k=100), exact, atol=1e-5, rtol=0)


def test_top_k_gap_is_bounded_by_the_tail_mass():
    # Each token contributes at most ln2 · m(token) to the JSD, so dropping the tail into one
    # bucket loses at most ln2 · m(tail), where m is the mixture (p + q) / 2.
    gen = torch.Generator().manual_seed(3)
    logits_p, logits_q = torch.randn(3, 5, 200, generator=gen) * 6, torch.randn(3, 5, 200, generator=gen) * 6
    k = 8
    exact = js_divergence(logits_p, logits_q)
    approx = js_divergence(logits_p, logits_q, top_k=k)
    mixture = (torch.softmax(logits_p, -1) + torch.softmax(logits_q, -1)) / 2
    tail = 1 - mixture.topk(k, dim=-1).values.sum(-1)
    assert (approx <= exact + 1e-6).all()
    assert (exact - approx <= math.log(2) * tail + 1e-6).all()


def test_kl_matches_scipy():
    logits_p, logits_q = torch.randn(1, 4, 30), torch.randn(1, 4, 30)
    kl = kl_divergence(logits_p, logits_q)
    p = torch.softmax(logits_p.double(), -1)[0].numpy()
    q = torch.softmax(logits_q.double(), -1)[0].numpy()
    np.testing.assert_allclose(kl[0].numpy(), [scipy_entropy(p[t], q[t]) for t in range(4)], atol=1e-5)


def test_log_ratio_of_sampled_tokens():
    p = [[0.5, 0.25, 0.25], [0.1, 0.8, 0.1]]
    q = [[0.25, 0.25, 0.5], [0.1, 0.1, 0.8]]
    logits_p = torch.tensor(p).log().unsqueeze(0)
    logits_q = torch.tensor(q).log().unsqueeze(0)
    ids = torch.tensor([[0, 1]])
    expected = torch.tensor([[math.log(2.0), math.log(8.0)]])
    torch.testing.assert_close(log_ratio(logits_p, logits_q, ids), expected)
    lp = torch.log_softmax(logits_p, -1).gather(-1, ids.unsqueeze(-1)).squeeze(-1)
    lq = torch.log_softmax(logits_q, -1).gather(-1, ids.unsqueeze(-1)).squeeze(-1)
    torch.testing.assert_close(log_ratio_from_logprobs(lp, lq), expected)


def test_entropy_matches_scipy():
    logits = torch.randn(2, 3, 25)
    probs = torch.softmax(logits.double(), -1).numpy()
    expected = np.array([[scipy_entropy(probs[b, t]) for t in range(3)] for b in range(2)])
    np.testing.assert_allclose(entropy(logits).numpy(), expected, atol=1e-5)
    uniform = torch.zeros(1, 1, 64)
    assert entropy(uniform).item() == pytest.approx(math.log(64), abs=1e-5)


def test_relevance_dispatch_and_errors():
    logits_p, logits_q = torch.randn(1, 2, 8), torch.randn(1, 2, 8)
    ids = torch.tensor([[1, 2]])
    assert torch.equal(relevance("js", logits_p, logits_q), js_distance(logits_p, logits_q))
    assert torch.equal(relevance("kl", logits_p, logits_q), kl_divergence(logits_p, logits_q))
    assert torch.equal(relevance("logratio", logits_p, logits_q, ids), log_ratio(logits_p, logits_q, ids))
    with pytest.raises(ValueError, match="unknown relevance 'cosine'"):
        relevance("cosine", logits_p, logits_q)
    with pytest.raises(ValueError, match="token_ids"):
        relevance("logratio", logits_p, logits_q)
    with pytest.raises(ValueError, match="top_k"):
        relevance("kl", logits_p, logits_q, top_k=3)
    with pytest.raises(ValueError, match="same shape"):
        js_distance(logits_p, torch.randn(1, 3, 8))
    with pytest.raises(ValueError, match="chunk_size"):
        js_distance(logits_p, logits_q, chunk_size=0)


def test_auto_chunk_size_keeps_one_buffer_under_the_budget():
    from mrtpo.credit import DEFAULT_CHUNK_BYTES, auto_chunk_size

    for vocab in (7, 49_152, 151_936, 10**9):
        chunk = auto_chunk_size(vocab)
        assert chunk >= 1
        assert chunk == 1 or chunk * vocab * 4 <= DEFAULT_CHUNK_BYTES
    assert auto_chunk_size(151_936) == auto_chunk_size(151_936, device="cpu") == 27
    # an accelerator reuses freed buffers at any size: larger chunks, far fewer kernel launches
    assert auto_chunk_size(151_936, device="cuda:0") == 2**28 // (4 * 151_936) == 441
    assert auto_chunk_size(151_936, chunk_bytes=2**20, device="cuda") == 1
    logits_p, logits_q = torch.randn(2, 40, 33), torch.randn(2, 40, 33)
    torch.testing.assert_close(js_distance(logits_p, logits_q), js_distance(logits_p, logits_q, chunk_size=5))


@pytest.mark.parametrize("kind,top_k", [("js", None), ("js", 3), ("kl", None), ("logratio", None)])
@pytest.mark.parametrize("chunk_size", [1, 4, None])
def test_paired_relevance_equals_relevance_of_the_gathered_rows(kind, top_k, chunk_size):
    """Pairs of rows of one (R, T, V) tensor, in any order and repeating rows, give the relevance
    of the two gathered (N, T, V) tensors; masked positions stay 0; one row with itself gives 0."""
    from mrtpo.credit import paired_entropy, paired_relevance

    gen = torch.Generator().manual_seed(3)
    logits = torch.randn(5, 6, 11, generator=gen) * 3
    with_rows, without_rows = torch.tensor([0, 0, 3, 4, 2]), torch.tensor([1, 2, 1, 4, 0])
    ids = torch.randint(0, 11, (5, 6), generator=gen)
    mask = torch.rand(5, 6, generator=gen) > 0.3
    got = paired_relevance(kind, logits, with_rows, without_rows, ids, mask, chunk_size, 0.7, top_k)
    expected = relevance(kind, logits[with_rows], logits[without_rows], ids, mask, chunk_size, 0.7, top_k)
    torch.testing.assert_close(got, expected, atol=1e-6, rtol=1e-5)
    assert got[~mask].abs().sum() == 0 and got[3].abs().sum() == 0 and got[mask].abs().sum() > 0
    torch.testing.assert_close(
        paired_entropy(logits, with_rows, mask, chunk_size, 0.7),
        entropy(logits[with_rows], mask, chunk_size, 0.7),
        atol=1e-6,
        rtol=1e-5,
    )
    with pytest.raises(ValueError, match="rows"):
        paired_relevance(kind, logits, with_rows[:2], without_rows, ids, mask)
