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
