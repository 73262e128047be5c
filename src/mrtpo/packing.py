"""Completions packed behind their shared prefix: one row per prefix, no padding between completions.

A GRPO batch pads every completion to the longest one and repeats (or gathers) the prompt per row.
When completions are short next to the longest, most of the update's and the replay's tokens are
padding: the gym's 32 completions average ~17 tokens under a 40-token cap. Here each prefix (a prompt,
or a replay context) becomes one row ``prefix[:-1]`` followed, for every completion ``c`` that shares
it, by a segment ``[prefix[-1], c[:-1]]``; a block mask lets each segment see the prefix and its own
earlier tokens only, and its positions continue the prefix's. Each segment position ``s`` predicts
``c[s]`` exactly as position ``len(prefix) - 1 + s`` of the row ``prefix + c`` does: the same
queries, keys and relative positions (rotary attention depends on position differences only), so the
same logits up to float rounding, for about ``Σ len(c)`` tokens instead of ``G · max len(c)``.

The cost is a dense ``(L, L)`` attention mask per packed row, so it pays where completions vary in
length and rows stay short (the gym); :func:`pack` is pure (host lists in, tensors out).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

PROMPT_SEGMENT = -1
PAD_SEGMENT = -2


@dataclass
class PackedBatch:
    """``R`` packed rows of width ``L`` and where each of the ``N`` completions' predictions sit.

    ``input_ids`` / ``position_ids`` ``(R, L)``; ``attention`` ``(R, 1, L, L)`` bool (True: attend);
    ``labels`` ``(R, L)``: the token each position predicts, −100 on the prefix and padding;
    ``index`` ``(N, T)``: flat position ``r · L + l`` predicting completion ``n``'s token ``t``
    (0 where ``t`` is past its length); ``valid`` ``(N, T)`` bool.
    """

    input_ids: Tensor
    position_ids: Tensor
    attention: Tensor
    labels: Tensor
    index: Tensor
    valid: Tensor

    def to(self, device: Any, dtype: torch.dtype | None = None) -> PackedBatch:
        """On ``device``; with ``dtype`` the attention mask becomes additive in it (0 where attended, the
        dtype's minimum elsewhere), which SDPA's CPU kernel runs faster than a boolean mask."""
        moved = [
            getattr(self, f).to(device, non_blocking=True)
            for f in ("input_ids", "position_ids", "attention", "labels", "index", "valid")
        ]
        if dtype is not None:
            moved[2] = torch.zeros(moved[2].shape, dtype=dtype, device=device).masked_fill(
                ~moved[2], torch.finfo(dtype).min
            )
        return PackedBatch(*moved)

    def gather(self, per_position: Tensor) -> Tensor:
        """Per-position values ``(R, L, *rest)`` -> per-completion ``(N, T, *rest)``, 0 past each length."""
        flat = per_position.reshape(-1, *per_position.shape[2:])
        picked = flat.index_select(0, self.index.reshape(-1)).view(*self.index.shape, *per_position.shape[2:])
        keep = self.valid.view(*self.valid.shape, *([1] * (per_position.dim() - 2)))
        return picked.masked_fill(~keep, 0)


def pack(
    prefixes: Sequence[Sequence[int]],
    completions: Sequence[Sequence[Sequence[int]]],
    pad_id: int = 0,
    width: int | None = None,
) -> PackedBatch:
    """Pack ``completions[r]`` (each a list of token ids) behind ``prefixes[r]`` (at least one token),
    one row per prefix; completions are numbered in order, row by row. ``width``: the ``T`` of
    ``index`` (default: the longest completion)."""
    if any(len(p) == 0 for p in prefixes):
        raise ValueError("every prefix needs at least one token (its last token starts each segment)")
    rows, segments, positions, labels, spans = [], [], [], [], []
    for prefix, members in zip(prefixes, completions):
        head = list(prefix[:-1])
        ids, seg, pos, lab = head[:], [PROMPT_SEGMENT] * len(head), list(range(len(head))), [-100] * len(head)
        for j, completion in enumerate(members):
            n = len(completion)
            spans.append((len(rows), len(ids), n))
            ids += ([int(prefix[-1])] + [int(x) for x in completion[:-1]]) if n else []
            seg += [j] * n
            pos += list(range(len(head), len(head) + n))
            lab += [int(x) for x in completion]
        rows.append(ids)
        segments.append(seg)
        positions.append(pos)
        labels.append(lab)
    length = max(1, max(map(len, rows)))
    t = width if width is not None else max([n for _, _, n in spans], default=0)

    def padded(lists, fill):
        return torch.tensor([x + [fill] * (length - len(x)) for x in lists], dtype=torch.long)

    seg = padded(segments, PAD_SEGMENT)
    query, key = seg.unsqueeze(2), seg.unsqueeze(1)  # (R, L, 1), (R, 1, L)
    causal = torch.ones(length, length, dtype=torch.bool).tril()
    visible = causal & (key != PAD_SEGMENT) & ((key == PROMPT_SEGMENT) | (key == query))
    visible |= torch.eye(length, dtype=torch.bool)  # a padding query sees itself (no empty softmax row)
    row, start, n = torch.tensor(spans, dtype=torch.long).view(-1, 3).unbind(1)
    offsets = torch.arange(t)
    valid = offsets < n.unsqueeze(1)  # (N, T)
    index = torch.where(valid, (row * length + start).unsqueeze(1) + offsets, 0)
    return PackedBatch(
        padded(rows, pad_id), padded(positions, 0), visible.unsqueeze(1), padded(labels, -100), index, valid
    )


def _dtype(model: Any) -> torch.dtype:
    """The dtype attention runs in: autocast's where it is on, else the model's."""
    from mrtpo.model_calls import underlying_model

    device = next(underlying_model(model).parameters()).device
    if torch.is_autocast_enabled(device.type):
        return torch.get_autocast_dtype(device.type)
    return next(underlying_model(model).parameters()).dtype


def can_pack(model: Any) -> bool:
    """Whether the model reads a 4D boolean attention mask as given (its attention is SDPA)."""
    from mrtpo.model_calls import underlying_model

    config = getattr(underlying_model(model), "config", None)
    return getattr(config, "_attn_implementation", None) == "sdpa"


def split_rows(ids: Tensor, mask: Tensor) -> list[list[int]]:
    """The kept tokens of each row of ``ids`` ``(B, W)`` under ``mask`` ``(B, W)``, as lists (one host copy)."""
    return [[t for t, m in zip(row, keep) if m] for row, keep in zip(ids.tolist(), mask.tolist())]


def packed_logps(
    model: Any,
    prompt_ids: Tensor,
    prompt_mask: Tensor,
    completion_ids: Tensor,
    completion_mask: Tensor,
    compute_entropy: bool = False,
) -> tuple[Tensor, Tensor | None]:
    """What :func:`mrtpo.shared_prompt.shared_prompt_logps` returns — per-token log-probabilities and,
    if asked, entropies ``(B, T)`` of ``completion_ids`` under TRL's fused LM head — with the rows of
    each distinct prompt packed behind it (one forward call, no padding between completions); 0 at
    positions ``completion_mask`` leaves out.

    ``prompt_ids`` / ``prompt_mask`` ``(B, P)`` left-padded, ``completion_ids`` / ``completion_mask``
    ``(B, T)`` right-padded with the mask a prefix of ones. ``model`` carries TRL's fused LM head.
    """
    prompts = split_rows(prompt_ids, prompt_mask)
    lengths = completion_mask.sum(-1).tolist()
    completions = [row[:n] for row, n in zip(completion_ids.tolist(), lengths)]
    order: dict[tuple[int, ...], list[int]] = {}
    for j, prompt in enumerate(prompts):
        order.setdefault(tuple(prompt), []).append(j)
    members = list(order.values())
    batch = pack(
        [list(p) for p in order], [[completions[j] for j in group] for group in members], width=completion_ids.shape[1]
    ).to(completion_ids.device, _dtype(model))
    out = model(
        input_ids=batch.input_ids,
        attention_mask=batch.attention,
        position_ids=batch.position_ids,
        shift_labels=batch.labels,
        fused_lm_head=True,
    )
    rows = torch.tensor([j for group in members for j in group], device=completion_ids.device)
    inverse = torch.empty_like(rows)
    inverse[rows] = torch.arange(len(rows), device=rows.device)
    logps = batch.gather(out.log_probs).index_select(0, inverse)
    entropy = batch.gather(out.entropy).index_select(0, inverse) if compute_entropy else None
    return logps, entropy


@torch.no_grad()
def packed_pass_logits(
    model: Any,
    members: Sequence[tuple[Sequence[Sequence[int]], Tensor]],
    lengths: Sequence[Tensor],
    counter: Any = None,
):
    """:func:`mrtpo.replay.pass_context_logits` in one forward call: every distinct context of every
    member group packed with the group's completions behind it (``lengths[m]`` ``(G,)`` their
    lengths). Returns the same :class:`mrtpo.model_calls.PassLogits` layout, 0 past each completion."""
    from mrtpo.model_calls import PassLogits, underlying_model

    device = next(underlying_model(model).parameters()).device
    slots, prefixes, completions, sizes, widths = [], [], [], [], []
    for (contexts, ids), n in zip(members, lengths):
        distinct: dict[tuple[int, ...], int] = {}
        slots.append([distinct.setdefault(tuple(int(x) for x in ctx), len(distinct)) for ctx in contexts])
        rows = [row[:k] for row, k in zip(ids.tolist(), n.tolist())]
        for ctx in distinct:
            prefixes.append(list(ctx))
            completions.append(rows)
        sizes.append(ids.shape[0])
        widths.append(ids.shape[1])
    batch = pack(prefixes, completions, width=max(widths)).to(device, _dtype(model))
    out = model(input_ids=batch.input_ids, attention_mask=batch.attention, position_ids=batch.position_ids)
    if counter is not None:
        counter.calls += 1
    blocks, first = [], 0
    for m, member_slots in enumerate(slots):
        blocks.append([first + slot * sizes[m] for slot in member_slots])
        first += (max(member_slots) + 1) * sizes[m]
    return PassLogits(batch.gather(out.logits), blocks, sizes, widths)


__all__ = ["PackedBatch", "can_pack", "pack", "packed_logps", "packed_pass_logits", "split_rows"]
