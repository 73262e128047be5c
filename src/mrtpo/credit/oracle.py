"""The oracle's token weights: a mean-1 mask on the positions the task knows each reward reads.

An upper bound for any relevance map (issue 37): where the task knows the tokens that decide a reward
(the gym's ground-truth positions, a real checker's span), the oracle puts that reward's credit on
them, shaped like every other map by ``lam`` and ``w_max`` (:func:`mrtpo.credit.weights.relevance_weights`
with the 0/1 mask as relevance). ``shuffle`` = q mixes the mask with the same mask permuted within the
response, ``(1 − q)·known + q·shuffled``, so a share q of its relevance sits on arbitrary tokens: the
dose–response from the oracle (q = 0) towards the shuffled control. At ``lam = 1`` without a cap the
weights are exactly ``(1 − q)·w_oracle + q·w_shuffled``. A (response, reward) with no known position
(an ``include`` rule whose word never occurs) gets uniform weights.
"""

from __future__ import annotations

import torch
from torch import Tensor

from mrtpo.credit.weights import relevance_weights


def oracle_weights(
    known: Tensor,
    mask: Tensor,
    lam: float = 1.0,
    w_max: float | None = None,
    shuffled: Tensor | None = None,
    shuffle: float = 0.0,
) -> Tensor:
    """``(N, K, T)`` float32 weights, mean 1 over each row's valid tokens (0 where ``mask`` is 0).

    ``known`` ``(N, K, T)``: 1 on each reward's known positions; ``mask`` ``(N, T)``: 1 on completion
    tokens; ``shuffled`` ``(N, K, T)``: ``known`` permuted within each response (needed when
    ``shuffle`` > 0); ``shuffle`` ∈ [0, 1]: the share of the mask moved to the permuted positions.
    """
    if known.dim() != 3 or known.shape[0] != mask.shape[0] or known.shape[2] != mask.shape[1]:
        raise ValueError(f"known must be (N, K, T) over mask (N, T), got {tuple(known.shape)} and {tuple(mask.shape)}")
    if not 0.0 <= shuffle <= 1.0:
        raise ValueError(f"oracle_shuffle must be in [0, 1], got {shuffle}")
    relevance = known.to(torch.float64) * mask.to(torch.float64).unsqueeze(1)
    if shuffle > 0:
        if shuffled is None or shuffled.shape != known.shape:
            raise ValueError("a shuffled oracle needs the permuted mask (N, K, T)")
        relevance = (1.0 - shuffle) * relevance + shuffle * shuffled.to(torch.float64)
    return torch.stack([relevance_weights(relevance[:, k], mask, lam, w_max) for k in range(known.shape[1])], dim=1)


__all__ = ["oracle_weights"]
