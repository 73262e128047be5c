"""Token weights: mean 1 per response, uniform fallback, λ, cap with renormalisation."""

import pytest
import torch

from mrtpo.credit import relevance_weights


def test_proportional_weights_by_hand():
    d = torch.tensor([[1.0, 2.0, 3.0]])
    torch.testing.assert_close(relevance_weights(d, torch.ones(1, 3)), torch.tensor([[0.5, 1.0, 1.5]]))
    # λ = 0.5: 0.5 + 0.5 · d / 2
    torch.testing.assert_close(relevance_weights(d, torch.ones(1, 3), lam=0.5), torch.tensor([[0.75, 1.0, 1.25]]))


def test_lambda_zero_is_uniform():
    d = torch.rand(3, 7)
    torch.testing.assert_close(relevance_weights(d, torch.ones(3, 7), lam=0.0), torch.ones(3, 7))


def test_uniform_fallback_below_threshold():
    d = torch.tensor([[0.0, 0.0, 0.0, 0.0], [1e-7, 0.0, 3e-7, 0.0], [0.0, 1.0, 0.0, 0.0]])
    w = relevance_weights(d, torch.ones(3, 4))
    torch.testing.assert_close(w[:2], torch.ones(2, 4))
    torch.testing.assert_close(w[2], torch.tensor([0.0, 4.0, 0.0, 0.0]))


def test_masked_positions_and_empty_rows():
    d = torch.tensor([[1.0, 3.0, 100.0], [5.0, 5.0, 5.0]])
    mask = torch.tensor([[1, 1, 0], [0, 0, 0]])
    w = relevance_weights(d, mask)
    torch.testing.assert_close(w, torch.tensor([[0.5, 1.5, 0.0], [0.0, 0.0, 0.0]]))


def test_cap_and_renormalize_by_hand():
    d = torch.tensor([[10.0, 1.0, 1.0]])  # proportional: 2.5, 0.25, 0.25
    w = relevance_weights(d, torch.ones(1, 3), w_max=1.5)
    torch.testing.assert_close(w, torch.tensor([[1.5, 0.75, 0.75]]))


def test_cap_needs_several_rounds_and_holds_mean():
    d = torch.tensor([[8.0, 4.0, 1.0, 1.0, 1.0, 1.0]])
    w = relevance_weights(d, torch.ones(1, 6), w_max=1.6)
    assert w.max().item() <= 1.6 + 1e-6
    assert w.mean().item() == pytest.approx(1.0, abs=1e-6)
    # Both large tokens end at the cap; the four small ones share the rest evenly.
    torch.testing.assert_close(w, torch.tensor([[1.6, 1.6, 0.7, 0.7, 0.7, 0.7]]))


def test_cap_with_zero_relevance_elsewhere_shares_evenly():
    d = torch.tensor([[0.0, 1.0, 0.0, 0.0]])  # proportional: 0, 4, 0, 0
    w = relevance_weights(d, torch.ones(1, 4), w_max=2.5)
    torch.testing.assert_close(w, torch.tensor([[0.5, 2.5, 0.5, 0.5]]))


def test_argument_errors():
    with pytest.raises(ValueError, match="lam"):
        relevance_weights(torch.ones(1, 2), torch.ones(1, 2), lam=1.5)
    with pytest.raises(ValueError, match="w_max"):
        relevance_weights(torch.ones(1, 2), torch.ones(1, 2), w_max=0.5)
    with pytest.raises(ValueError, match=r"\(B, T\)"):
        relevance_weights(torch.ones(2), torch.ones(2))


@pytest.mark.parametrize("c", [0.2, 0.5])
def test_lam_c_and_w_max_one_plus_c_bound_every_weight_to_one_plus_minus_c(c):
    """The bounded variant of issue 33 (weights in [1 − c, 1 + c], as RLSD clips them) is ``lam = c`` with
    ``w_max = 1 + c``: λ keeps every token at least 1 − c of the uniform credit, the cap takes the peak
    down to 1 + c and the water-fill only scales the rest up; the mean stays 1."""
    gen = torch.Generator().manual_seed(7)
    distance = torch.rand(64, 30, generator=gen) ** 4 * 5  # heavy-tailed relevance
    lengths = torch.randint(1, 31, (64,), generator=gen)
    mask = (torch.arange(30) < lengths.unsqueeze(1)).float()
    weights = relevance_weights(distance, mask, lam=c, w_max=1 + c)
    valid = mask.bool()
    assert weights[valid].min() >= 1 - c - 1e-6 and weights[valid].max() <= 1 + c + 1e-6
    torch.testing.assert_close((weights * mask).sum(1) / mask.sum(1), torch.ones(64), atol=1e-5, rtol=0)
    assert (weights[valid] > 1 + c - 1e-4).any()  # the bound binds
