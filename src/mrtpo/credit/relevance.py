"""Per-token relevance between two next-token distributions (docs/design.md#step-relevance).

The replay teacher-forces the same completion under two contexts (with and without a reward's
evidence) and hands the two ``(B, T, V)`` logit tensors here. All math is fp32 in log space and
chunked over positions, so the extra memory is ``O(chunk_size × V)``, never ``O(B × T × V)``;
masked positions are skipped entirely (and reported as 0).

Variants (the ablation switch ``relevance``):

- ``js``: Jensen-Shannon *distance* ``sqrt(JSD)``, natural log, in ``[0, sqrt(ln 2)]`` (default);
- ``kl``: ``KL(p_with ‖ p_without)``, unbounded;
- ``logratio``: ``|log p_with(y_t) − log p_without(y_t)|`` of the sampled token only.

An optional top-k approximation of the JS sum keeps the ``k`` most probable tokens of the
mixture and lumps the remaining mass of each distribution into one bucket; by the data
processing inequality it never exceeds the exact value and equals it when the tail is empty.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

LN2 = math.log(2.0)
#: Upper bound of the natural-log JS distance.
JS_DISTANCE_MAX = math.sqrt(LN2)
#: ``chunk_size=None`` picks as many positions per chunk as fit one fp32 ``(chunk, V)`` buffer in
#: this many bytes: buffers under glibc's 32 MiB mmap threshold are reused from the heap, larger
#: ones are page-faulted afresh on every chunk, which makes large chunks slower (the figures:
#: docs/results/2026-12-02-real-model-cost.md; ``mrtpo bench relevance`` measures them).
DEFAULT_CHUNK_BYTES = 16 * 2**20
#: The same budget on an accelerator, whose caching allocator reuses a freed buffer at any size:
#: there each chunk costs ~25 small kernel launches, so a CPU-sized chunk (27 positions at
#: V = 152k) would make a 4 × 8 × 128-token replay launch ~10k kernels. 256 MiB keeps 441
#: positions per chunk at that vocabulary, ~2 GiB of fp32 temporaries at once.
DEFAULT_CHUNK_BYTES_ACCELERATOR = 256 * 2**20
DEFAULT_CHUNK_SIZE = None


def auto_chunk_size(vocab_size: int, chunk_bytes: int | None = None, device: torch.device | str | None = None) -> int:
    """Positions per chunk so that one fp32 ``(chunk, vocab_size)`` buffer fits ``chunk_bytes``
    (default: :data:`DEFAULT_CHUNK_BYTES` on a CPU, :data:`DEFAULT_CHUNK_BYTES_ACCELERATOR` on another device)."""
    if chunk_bytes is None:
        on_cpu = device is None or torch.device(device).type == "cpu"
        chunk_bytes = DEFAULT_CHUNK_BYTES if on_cpu else DEFAULT_CHUNK_BYTES_ACCELERATOR
    return max(1, chunk_bytes // (4 * max(1, vocab_size)))


# Log-probabilities are floored here so that -inf logits (masked vocabulary) never produce
# NaN through (-inf) - (-inf); exp(-1e4) is exactly 0 in fp32, so no probability changes.
_LOGP_FLOOR = -1e4


def _check_pair(logits_p: Tensor, logits_q: Tensor, mask: Tensor | None) -> Tensor:
    if logits_p.shape != logits_q.shape or logits_p.dim() != 3:
        raise ValueError(
            "logits must be two (B, T, V) tensors of the same shape, got "
            f"{tuple(logits_p.shape)} and {tuple(logits_q.shape)}"
        )
    b, t, _ = logits_p.shape
    if mask is None:
        return torch.ones(b, t, dtype=torch.bool, device=logits_p.device)
    if mask.shape != (b, t):
        raise ValueError(f"mask must be (B={b}, T={t}), got {tuple(mask.shape)}")
    return mask.to(torch.bool)


def _log_probs_and_probs(logits: Tensor, temperature: float) -> tuple[Tensor, Tensor]:
    """fp32 ``(log p, p)`` of ``softmax(logits / temperature)`` over the last axis, one exp per entry.

    ``logits`` must be a tensor this module owns (a chunk copy): fp32 input is modified in place.
    """
    x = logits.to(torch.float32)
    if temperature != 1.0:
        x.div_(temperature)
    x.sub_(x.amax(-1, keepdim=True))
    probs = x.exp()
    total = probs.sum(-1, keepdim=True)
    probs.div_(total)
    logp = x.sub_(total.log()).clamp_min_(_LOGP_FLOOR)
    return logp, probs


def _log_probs(logits: Tensor, temperature: float) -> Tensor:
    return _log_probs_and_probs(logits, temperature)[0]


def _js_rows(logp: Tensor, probs_p: Tensor, logq: Tensor, probs_q: Tensor) -> Tensor:
    """JSD of each row of two ``(n, V)`` distributions, written so that ``p == q`` gives 0 exactly.

    With ``δ = log q − log p``: ``log p − log m = ln 2 − softplus(δ)`` and
    ``log q − log m = ln 2 − softplus(−δ)``. Each term keeps its own softplus: merging them via
    ``softplus(−δ) = softplus(δ) − δ`` cancels large numbers where one probability is ~0.
    The probability buffers are reused in place.
    """
    delta = logq - logp
    term_p = probs_p.mul_(F.softplus(delta).neg_().add_(LN2))
    term_q = probs_q.mul_(F.softplus(delta.neg_()).neg_().add_(LN2))
    return (0.5 * term_p.add_(term_q).sum(-1)).clamp_min(0.0)


def _topk_buckets(logp: Tensor, logq: Tensor, top_k: int) -> tuple[Tensor, Tensor]:
    """Coarsen two ``(n, V)`` log-distributions to the mixture's top-k tokens plus a tail bucket."""
    mixture = torch.logaddexp(logp, logq)
    k = min(top_k, logp.shape[-1])
    idx = mixture.topk(k, dim=-1).indices
    head_p, head_q = logp.gather(-1, idx), logq.gather(-1, idx)

    def with_tail(head: Tensor) -> Tensor:
        tail_mass = (1.0 - head.exp().sum(-1, keepdim=True)).clamp_min(0.0)
        return torch.cat([head, tail_mass.log().clamp_min(_LOGP_FLOOR)], dim=-1)

    return with_tail(head_p), with_tail(head_q)


def _chunked_positions(
    row_fn: Callable[[Tensor, Tensor, Tensor], Tensor],
    logits_p: Tensor,
    logits_q: Tensor,
    mask: Tensor,
    chunk_size: int | None,
    extra: Tensor | None = None,
    rows_p: Tensor | None = None,
    rows_q: Tensor | None = None,
) -> Tensor:
    """Apply ``row_fn(p_rows, q_rows, extra_rows) -> (n,)`` over valid positions, chunk by chunk.

    Without ``rows_p`` / ``rows_q``, position ``(b, t)`` of ``mask`` ``(B, T)`` (and ``extra``)
    reads ``logits_p[b, t]`` and ``logits_q[b, t]``. With them (``(N,)`` each), ``mask`` is
    ``(N, T)`` and pair ``n`` reads row ``rows_p[n]`` of ``logits_p`` ``(R, T, V)`` and row
    ``rows_q[n]`` of ``logits_q``: only each chunk's positions are gathered, never whole rows.
    One host sync per call (the valid positions), whatever ``N``.
    """
    n, t = mask.shape
    v = logits_p.shape[-1]
    if chunk_size is None:
        chunk_size = auto_chunk_size(v, device=logits_p.device)
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    out = torch.zeros(n * t, dtype=torch.float32, device=logits_p.device)
    positions = mask.reshape(-1).nonzero(as_tuple=True)[0]
    flat_p, flat_q = logits_p.reshape(-1, v), logits_q.reshape(-1, v)
    column = torch.arange(t, device=logits_p.device)
    index_p = (rows_p.view(-1, 1) * t + column).reshape(-1) if rows_p is not None else None
    index_q = (rows_q.view(-1, 1) * t + column).reshape(-1) if rows_q is not None else None
    flat_extra = extra.reshape(n * t) if extra is not None else None
    for start in range(0, positions.numel(), chunk_size):
        rows = positions[start : start + chunk_size]
        extra_rows = flat_extra[rows] if flat_extra is not None else None
        p_rows = flat_p[index_p[rows]] if index_p is not None else flat_p[rows]
        q_rows = flat_q[index_q[rows]] if index_q is not None else flat_q[rows]
        out[rows] = row_fn(p_rows, q_rows, extra_rows)
    return out.view(n, t)


def _js_rows_fn(temperature: float, top_k: int | None) -> Callable[[Tensor, Tensor, Tensor | None], Tensor]:
    def rows(p: Tensor, q: Tensor, _: Tensor | None) -> Tensor:
        logp, probs_p = _log_probs_and_probs(p, temperature)
        logq, probs_q = _log_probs_and_probs(q, temperature)
        if top_k is not None:
            logp, logq = _topk_buckets(logp, logq, top_k)
            probs_p, probs_q = logp.exp(), logq.exp()
        return _js_rows(logp, probs_p, logq, probs_q)

    return rows


def _kl_rows_fn(temperature: float) -> Callable[[Tensor, Tensor, Tensor | None], Tensor]:
    def rows(p: Tensor, q: Tensor, _: Tensor | None) -> Tensor:
        logp, probs = _log_probs_and_probs(p, temperature)
        return probs.mul_(logp.sub_(_log_probs(q, temperature))).sum(-1).clamp_min(0.0)

    return rows


def _log_ratio_rows_fn(temperature: float) -> Callable[[Tensor, Tensor, Tensor | None], Tensor]:
    def rows(p: Tensor, q: Tensor, ids: Tensor | None) -> Tensor:
        logp, logq = _log_probs(p, temperature), _log_probs(q, temperature)
        ids = ids.unsqueeze(-1)
        return (logp.gather(-1, ids) - logq.gather(-1, ids)).abs().squeeze(-1)

    return rows


def _entropy_rows_fn(temperature: float) -> Callable[[Tensor, Tensor, Tensor | None], Tensor]:
    def rows(p: Tensor, _q: Tensor, _e: Tensor | None) -> Tensor:
        logp, probs = _log_probs_and_probs(p, temperature)
        return (-(probs.mul_(logp)).sum(-1)).clamp_min(0.0)

    return rows


def _distance(jsd: Tensor) -> Tensor:
    return jsd.sqrt().clamp(max=JS_DISTANCE_MAX)


def js_divergence(
    logits_p: Tensor,
    logits_q: Tensor,
    mask: Tensor | None = None,
    chunk_size: int | None = DEFAULT_CHUNK_SIZE,
    temperature: float = 1.0,
    top_k: int | None = None,
) -> Tensor:
    """Per-position Jensen-Shannon divergence (nats) of ``softmax(logits / temperature)``.

    ``logits_p``, ``logits_q``: ``(B, T, V)``; ``mask``: ``(B, T)`` (1 = score this position).
    ``chunk_size``: positions per chunk (None: :func:`auto_chunk_size`). Returns ``(B, T)``
    float32 in ``[0, ln 2]``, 0 where masked.
    """
    valid = _check_pair(logits_p, logits_q, mask)
    return _chunked_positions(_js_rows_fn(temperature, top_k), logits_p, logits_q, valid, chunk_size)


def js_distance(
    logits_p: Tensor,
    logits_q: Tensor,
    mask: Tensor | None = None,
    chunk_size: int | None = DEFAULT_CHUNK_SIZE,
    temperature: float = 1.0,
    top_k: int | None = None,
) -> Tensor:
    """Per-position Jensen-Shannon distance ``sqrt(JSD)`` ``(B, T)``, in ``[0, sqrt(ln 2)]``.

    See :func:`js_divergence` for the arguments; ``top_k`` switches to the tail-bucket
    approximation (a lower bound of the exact distance).
    """
    return _distance(js_divergence(logits_p, logits_q, mask, chunk_size, temperature, top_k))


def kl_divergence(
    logits_p: Tensor,
    logits_q: Tensor,
    mask: Tensor | None = None,
    chunk_size: int | None = DEFAULT_CHUNK_SIZE,
    temperature: float = 1.0,
) -> Tensor:
    """Per-position ``KL(p ‖ q)`` in nats ``(B, T)``; ``p`` is the with-evidence distribution."""
    valid = _check_pair(logits_p, logits_q, mask)
    return _chunked_positions(_kl_rows_fn(temperature), logits_p, logits_q, valid, chunk_size)


def log_ratio(
    logits_p: Tensor,
    logits_q: Tensor,
    token_ids: Tensor,
    mask: Tensor | None = None,
    chunk_size: int | None = DEFAULT_CHUNK_SIZE,
    temperature: float = 1.0,
) -> Tensor:
    """``|log p(y_t) − log q(y_t)|`` of the sampled tokens ``token_ids`` ``(B, T)``.

    Only the sampled token's probability is compared: cheaper to ship (two log-prob vectors,
    no distributions) but blind to changes elsewhere in the distribution.
    """
    valid = _check_pair(logits_p, logits_q, mask)
    if token_ids.shape != valid.shape:
        raise ValueError(f"token_ids must be {tuple(valid.shape)}, got {tuple(token_ids.shape)}")
    return _chunked_positions(_log_ratio_rows_fn(temperature), logits_p, logits_q, valid, chunk_size, extra=token_ids)


def log_ratio_from_logprobs(logprobs_p: Tensor, logprobs_q: Tensor, mask: Tensor | None = None) -> Tensor:
    """``|log p(y_t) − log q(y_t)|`` from per-token log-probs ``(B, T)`` (e.g. a fused log-prob head)."""
    diff = (logprobs_p.to(torch.float32) - logprobs_q.to(torch.float32)).abs()
    return diff if mask is None else diff * mask.to(torch.float32)


def entropy(
    logits: Tensor,
    mask: Tensor | None = None,
    chunk_size: int | None = DEFAULT_CHUNK_SIZE,
    temperature: float = 1.0,
) -> Tensor:
    """Per-position entropy (nats) of ``softmax(logits / temperature)`` ``(B, T)``, 0 where masked."""
    valid = _check_pair(logits, logits, mask)
    return _chunked_positions(_entropy_rows_fn(temperature), logits, logits, valid, chunk_size)


RelevanceFn = Callable[..., Tensor]


def relevance(
    kind: str,
    logits_with: Tensor,
    logits_without: Tensor,
    token_ids: Tensor | None = None,
    mask: Tensor | None = None,
    chunk_size: int | None = DEFAULT_CHUNK_SIZE,
    temperature: float = 1.0,
    top_k: int | None = None,
) -> Tensor:
    """Relevance ``(B, T)`` of one reward's evidence under the chosen ``kind`` (js / kl / logratio)."""
    if kind == "js":
        return js_distance(logits_with, logits_without, mask, chunk_size, temperature, top_k)
    if top_k is not None:
        raise ValueError(f"top_k approximates the JS sum only; it has no meaning for {kind!r}")
    if kind == "kl":
        return kl_divergence(logits_with, logits_without, mask, chunk_size, temperature)
    if kind == "logratio":
        if token_ids is None:
            raise ValueError("relevance 'logratio' needs the sampled token_ids")
        return log_ratio(logits_with, logits_without, token_ids, mask, chunk_size, temperature)
    raise ValueError(f"unknown relevance {kind!r}; choose one of {RELEVANCE_KINDS}")


RELEVANCE_KINDS: tuple[str, ...] = ("js", "kl", "logratio")


def _check_rows(logits: Tensor, rows: Tensor, mask: Tensor) -> None:
    if logits.dim() != 3 or mask.dim() != 2 or rows.shape != (mask.shape[0],) or mask.shape[1] != logits.shape[1]:
        raise ValueError(
            f"need logits (R, T, V), rows (N,) and mask (N, T) with the same T; "
            f"got {tuple(logits.shape)}, {tuple(rows.shape)} and {tuple(mask.shape)}"
        )


def paired_relevance(
    kind: str,
    logits: Tensor,
    with_rows: Tensor,
    without_rows: Tensor,
    token_ids: Tensor | None,
    mask: Tensor,
    chunk_size: int | None = DEFAULT_CHUNK_SIZE,
    temperature: float = 1.0,
    top_k: int | None = None,
) -> Tensor:
    """:func:`relevance` of ``N`` pairs of rows of one logits tensor ``(R, T, V)``, in one pass.

    Pair ``n`` compares row ``with_rows[n]`` (the context with the evidence) with row
    ``without_rows[n]``; ``token_ids`` and ``mask`` are ``(N, T)``. Equals
    ``relevance(kind, logits[with_rows], logits[without_rows], token_ids, mask, ...)`` without
    copying the rows, and with one host sync for all pairs. Returns ``(N, T)``.
    """
    _check_rows(logits, with_rows, mask)
    _check_rows(logits, without_rows, mask)
    valid = mask.to(torch.bool)
    if kind == "js":
        fn = _js_rows_fn(temperature, top_k)
    elif top_k is not None:
        raise ValueError(f"top_k approximates the JS sum only; it has no meaning for {kind!r}")
    elif kind == "kl":
        fn = _kl_rows_fn(temperature)
    elif kind == "logratio":
        if token_ids is None:
            raise ValueError("relevance 'logratio' needs the sampled token_ids")
        fn = _log_ratio_rows_fn(temperature)
    else:
        raise ValueError(f"unknown relevance {kind!r}; choose one of {RELEVANCE_KINDS}")
    out = _chunked_positions(
        fn,
        logits,
        logits,
        valid,
        chunk_size,
        extra=token_ids if kind == "logratio" else None,
        rows_p=with_rows,
        rows_q=without_rows,
    )
    return _distance(out) if kind == "js" else out


def paired_entropy(
    logits: Tensor, rows: Tensor, mask: Tensor, chunk_size: int | None = DEFAULT_CHUNK_SIZE, temperature: float = 1.0
) -> Tensor:
    """:func:`entropy` of rows ``rows`` ``(N,)`` of ``logits`` ``(R, T, V)`` under ``mask`` ``(N, T)``."""
    _check_rows(logits, rows, mask)
    return _chunked_positions(
        _entropy_rows_fn(temperature), logits, logits, mask.to(torch.bool), chunk_size, rows_p=rows, rows_q=rows
    )


__all__ = [
    "DEFAULT_CHUNK_BYTES",
    "DEFAULT_CHUNK_BYTES_ACCELERATOR",
    "DEFAULT_CHUNK_SIZE",
    "auto_chunk_size",
    "JS_DISTANCE_MAX",
    "RELEVANCE_KINDS",
    "entropy",
    "js_distance",
    "js_divergence",
    "kl_divergence",
    "log_ratio",
    "log_ratio_from_logprobs",
    "paired_entropy",
    "paired_relevance",
    "relevance",
]
