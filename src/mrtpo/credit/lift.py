"""Does a reward's credit land where its verifier looks? The *lift* of docs/design.md#measurement.

For one response, a reward's token weights ``w`` and the span ``S`` of tokens its verifier reads
(an end phrase, a keyword, a P.S. block, a wrong argument value)::

    lift = (Σ_{t∈S} w_t / Σ_t w_t) / (|S| / T)

the share of the reward's weight on the span over the span's share of the tokens. Uniform
weights (GRPO, GDPO) give exactly 1; lift > 1 means the credit concentrates on the span.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor


def span_lift(weights: Tensor, span: Tensor, mask: Tensor) -> float | None:
    """Lift of ``weights`` ``(T,)`` on ``span`` ``(T,)`` bool over the completion ``mask`` ``(T,)``.

    ``None`` when the lift is undefined: an empty span, a span covering every token, or weights
    that sum to zero on the completion.
    """
    mask = mask.bool()
    span = span.bool() & mask
    n_tokens, n_span = int(mask.sum()), int(span.sum())
    if n_span == 0 or n_span == n_tokens:
        return None
    w = weights.double() * mask
    total = float(w.sum())
    if not total > 0:
        return None
    return (float(w[span].sum()) / total) / (n_span / n_tokens)


def char_spans_to_tokens(offsets: Sequence[tuple[int, int]], spans: Sequence[tuple[int, int]]) -> Tensor:
    """``(T,)`` bool: tokens whose non-empty character range ``offsets[t] = (start, end)`` overlaps a span.

    Spans are half-open ``[start, end)`` character ranges of the decoded response.
    """
    marks = torch.zeros(len(offsets), dtype=torch.bool)
    for t, (a, b) in enumerate(offsets):
        marks[t] = a < b and any(a < e and s < b for s, e in spans)
    return marks


def summarise_lifts(values: Sequence[float]) -> dict[str, float | int | None]:
    """Mean, standard deviation, median, share above 1 and count of a list of lifts."""
    n = len(values)
    if n == 0:
        return {"n": 0, "mean": None, "std": None, "median": None, "above_1": None}
    mean = sum(values) / n
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1)) if n > 1 else 0.0
    ordered = sorted(values)
    median = ordered[n // 2] if n % 2 else (ordered[n // 2 - 1] + ordered[n // 2]) / 2
    return {"n": n, "mean": mean, "std": std, "median": median, "above_1": sum(v > 1 for v in values) / n}


__all__ = ["char_spans_to_tokens", "span_lift", "summarise_lifts"]
