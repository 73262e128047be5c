"""Evidence replays: teacher-force a completion with and without a reward's evidence (SPEC §1 step 4).

The contexts come from :mod:`mrtpo.counterfactual` (the original prompt and, per reward, the prompt
without its ``in_prompt`` evidence or with its ``privileged`` evidence appended). The same
completion tokens are scored under every context with plain no-grad forwards (full logits, never a
fused log-prob head), all through the same code path, dtype and padding, so identical contexts give
a relevance of exactly 0. This module returns relevance; which method uses it is decided in
:mod:`mrtpo.credit`.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from mrtpo.counterfactual import DEFAULT_PRIVILEGED_HEADER, PromptRenderer, default_render_prompt, replay_contexts
from mrtpo.credit import entropy as entropy_map
from mrtpo.credit import relevance as relevance_fn
from mrtpo.verifiers import Evidence, Example


@torch.no_grad()
def completion_logits(model: Any, prompt_ids: Tensor, completion_ids: Tensor) -> Tensor:
    """Logits ``(T, V)`` predicting each of the ``T`` completion tokens after ``prompt_ids`` ``(P,)``.

    A plain forward of one unpadded sequence with ``logits_to_keep = T + 1``; the last logit
    (predicting past the completion) is dropped so position ``t`` predicts ``completion_ids[t]``.
    """
    ids = torch.cat([prompt_ids, completion_ids]).unsqueeze(0).to(model.device)
    t = completion_ids.numel()
    out = model(input_ids=ids, attention_mask=torch.ones_like(ids), logits_to_keep=t + 1, use_cache=False)
    return out.logits[0, :-1]


def underlying_model(model: Any) -> Any:
    """The transformers model under any wrappers: DDP / FSDP ``.module``, a PEFT model's base model."""
    seen: set[int] = set()
    while id(model) not in seen:
        seen.add(id(model))
        inner = getattr(model, "module", None)
        if isinstance(inner, torch.nn.Module):
            model = inner
            continue
        get_base = getattr(model, "get_base_model", None)
        if callable(get_base):
            model = get_base()
            continue
        break
    return model


def _cache_keyword(model: Any) -> str:
    """The forward keyword for a KV cache: ``cache`` in recent transformers, ``past_key_values`` before.

    Read from the underlying model's forward: wrappers (PEFT, DDP) take ``**kwargs`` and pass them
    through, so their own signature says nothing, and a name the model does not know would be
    swallowed silently (the replay would then run without the prompt's cache).
    """
    params = inspect.signature(underlying_model(model).forward).parameters
    if "cache" in params:
        return "cache"
    if "past_key_values" in params:
        return "past_key_values"
    raise TypeError(f"{type(underlying_model(model)).__name__}.forward takes neither `cache` nor `past_key_values`: "
                    "the replay needs a model that accepts a KV cache")


def _returned_cache(out: Any) -> Any:
    cache = out.get("cache") if hasattr(out, "get") else None
    return cache if cache is not None else out.past_key_values


def common_prefix_length(sequences: Sequence[Sequence[int]]) -> int:
    """Length of the longest common prefix of all ``sequences``."""
    shortest = min(len(s) for s in sequences)
    for i in range(shortest):
        token = sequences[0][i]
        if any(s[i] != token for s in sequences[1:]):
            return i
    return shortest


class ForwardCounter:
    """Counts model forward calls (every rank must make the same number under FSDP / ZeRO-3),
    and the seconds :func:`group_relevance` spends in the relevance kernels (for ``bench cost``)."""

    def __init__(self) -> None:
        self.calls = 0
        self.kernel_s = 0.0


def shared_lengths(contexts: Sequence[Sequence[int]]) -> list[int]:
    """Per context, how many of its leading tokens it reads from the original's cache.

    The original ``contexts[0]`` but its last token is the trunk, run once; every context shares
    the trunk up to where it departs from the original (its common prefix with it) and keeps at
    least its last token to run with the completions. A removed span or an appended reference
    departs late, so a counterfactual costs only its tokens after the departure, not its whole
    prompt again.
    """
    original = contexts[0]
    return [min(common_prefix_length([ctx, original]), len(ctx) - 1, len(original) - 1) for ctx in contexts]


@torch.no_grad()
def group_context_logits(
    model: Any,
    contexts: Sequence[Sequence[int]],
    completions: Tensor,
    counter: ForwardCounter | None = None,
):
    """For each context, the logits ``(G, T, V)`` predicting every token of ``G`` completions.

    ``contexts``: token ids of the ``C`` prompts (the original one first, then its
    counterfactuals); ``completions``: ``(G, T)`` right-padded completion ids (padding never
    influences a valid position: attention is causal). Yields ``(context_index, logits)`` in
    context order; the logits are views of one ``(C·G, T, V)`` tensor in the model's dtype (the
    relevance kernels upcast chunk by chunk). Repeated contexts run once and share their logits,
    so identical contexts give identical logits (and a relevance of exactly 0).

    At most three forward calls, whatever ``C`` and ``G``: the original prompt but its last token
    (the trunk) once; every context's tokens after its departure from the original
    (:func:`shared_lengths`) but its last, as one left-padded batch on the trunk's cache, each
    row seeing only the trunk positions it shares (the rest and the pads masked, positions
    continuing its own prefix); then all ``C × G`` rows ``[last context token, completion[:-1]]``
    as one batch on that cache, repeated per completion. Every context goes through the same
    path, and the prompt is paid once per group. The first two calls skip the vocabulary head
    (``logits_to_keep=1``): only their cache is read.
    """
    key = _cache_keyword(model)
    counter = counter or ForwardCounter()
    device = next(underlying_model(model).parameters()).device
    g, t = completions.shape
    distinct: dict[tuple[int, ...], int] = {}
    slots = [distinct.setdefault(tuple(int(x) for x in ctx), len(distinct)) for ctx in contexts]
    contexts = [list(ctx) for ctx in distinct]
    c = len(contexts)
    completions = completions.to(device)
    trunk_len = len(contexts[0]) - 1
    shared = shared_lengths(contexts)
    cache = None
    if trunk_len > 0:
        trunk = torch.tensor([contexts[0][:-1]], dtype=torch.long, device=device)
        cache = _returned_cache(model(input_ids=trunk, use_cache=True, logits_to_keep=1))  # only its cache is used
        counter.calls += 1
        cache.batch_repeat_interleave(c)
    past_mask = (torch.arange(trunk_len, device=device) < torch.tensor(shared, device=device).unsqueeze(1)).long()
    heads = [ctx[s:-1] for ctx, s in zip(contexts, shared)]
    width = max(map(len, heads))
    if width > 0:
        ids = torch.zeros(c, width, dtype=torch.long, device=device)
        head_mask = torch.zeros(c, width, dtype=torch.long, device=device)
        positions = torch.zeros(c, width, dtype=torch.long, device=device)
        for row, (head, start) in enumerate(zip(heads, shared)):
            if head:
                ids[row, width - len(head):] = torch.tensor(head, device=device)
                head_mask[row, width - len(head):] = 1
                positions[row, width - len(head):] = torch.arange(start, start + len(head), device=device)
        past_mask = torch.cat([past_mask, head_mask], dim=1)
        kwargs = {key: cache} if cache is not None else {}
        out = model(input_ids=ids, attention_mask=past_mask, position_ids=positions, use_cache=True, logits_to_keep=1,
                    **kwargs)
        cache = _returned_cache(out)
        counter.calls += 1
    last = torch.tensor([int(ctx[-1]) for ctx in contexts], device=device)
    inputs = torch.cat([last.repeat_interleave(g).unsqueeze(1), completions[:, :-1].repeat(c, 1)], dim=1)
    starts = torch.tensor([len(ctx) - 1 for ctx in contexts], device=device).repeat_interleave(g)
    positions = starts.unsqueeze(1) + torch.arange(t, device=device)
    attention = torch.cat([past_mask.repeat_interleave(g, dim=0),
                           torch.ones(c * g, t, dtype=torch.long, device=device)], dim=1)
    kwargs = {}
    if cache is not None:
        cache.batch_repeat_interleave(g)
        kwargs = {key: cache}
    out = model(input_ids=inputs, attention_mask=attention, position_ids=positions, use_cache=cache is not None,
                **kwargs)
    counter.calls += 1
    logits = out.logits.view(c, g, t, -1)
    for index, slot in enumerate(slots):
        yield index, logits[slot]


def group_forward_calls(contexts: Sequence[Sequence[int]]) -> int:
    """Forward calls :func:`group_context_logits` makes for these contexts, whatever their number and
    the completions' shape: the trunk (if the original has more than one token), the contexts'
    tokens after their departure but the last (if any context has some), and the completions."""
    shared = shared_lengths(contexts)
    heads = any(len(ctx) - 1 > s for ctx, s in zip(contexts, shared))
    return (1 if len(contexts[0]) > 1 else 0) + (1 if heads else 0) + 1


@dataclass
class GroupRelevance:
    """Relevance of one prompt group. ``maps``: ``(C − 1, G, T)``, one per counterfactual context
    (0 on padding); ``entropy``: ``(G, T)`` of the original context when asked for."""

    maps: Tensor
    entropy: Tensor | None = None


def replay_passes(group_size: int, micro_batch: int | None) -> int:
    """How many passes :func:`group_relevance` makes over a group of ``group_size`` completions."""
    return 1 if micro_batch is None or micro_batch >= group_size else -(-group_size // micro_batch)


def group_relevance(
    model: Any,
    contexts: Sequence[Sequence[int]],
    placements: Sequence[str],
    completions: Tensor,
    lengths: Tensor,
    *,
    kind: str = "js",
    temperature: float = 1.0,
    chunk_size: int | None = None,
    top_k: int | None = None,
    with_entropy: bool = False,
    micro_batch: int | None = None,
    counter: ForwardCounter | None = None,
    on_device: bool = False,
) -> GroupRelevance:
    """Relevance of each counterfactual ``contexts[1:]`` against the original ``contexts[0]``.

    ``placements[i]`` says which side of counterfactual ``i`` carries the evidence
    (``in_prompt``: the original; ``privileged``: the counterfactual), which matters for ``kl``.
    ``completions``: ``(G, T)`` right-padded ids of the group's completions, ``lengths``: ``(G,)``.
    ``micro_batch``: replay at most this many completions at once (``None``: the whole group).
    The logits held at a time scale with it and with the contexts (all contexts of a pass run as
    one batch: 2 (bf16) or 4 (fp32) bytes x contexts x rows x T x V, plus the kernels' fp32 chunks);
    each pass re-runs the contexts, so :func:`replay_passes` times the forward calls of one pass.
    The maps are built on the model's device without a host copy per context; ``on_device`` returns
    them there (a caller replaying many groups copies once at the end), else on the CPU.
    """
    if len(placements) != len(contexts) - 1:
        raise ValueError(f"need one placement per counterfactual: {len(contexts) - 1}, got {len(placements)}")
    if micro_batch is not None and micro_batch < 1:
        raise ValueError(f"micro_batch must be >= 1 or None, got {micro_batch}")
    g, t = completions.shape
    device = next(underlying_model(model).parameters()).device
    completions = completions.to(device)
    mask = torch.arange(t, device=device).unsqueeze(0) < lengths.to(device).view(-1, 1)
    maps = torch.zeros(len(contexts) - 1, g, t, device=device)
    ent = torch.zeros(g, t, device=device) if with_entropy else None
    step = g if replay_passes(g, micro_batch) == 1 else micro_batch
    for first_row in range(0, g, step):
        rows = slice(first_row, min(g, first_row + step))
        sub = completions[rows]
        base = None
        for index, logits in group_context_logits(model, contexts, sub, counter):
            start = time.perf_counter()
            if index == 0:
                base = logits
                if with_entropy:
                    ent[rows] = entropy_map(base, mask[rows], chunk_size, temperature)
            else:
                with_ev, without_ev = (base, logits) if placements[index - 1] == "in_prompt" else (logits, base)
                maps[index - 1, rows] = relevance_fn(kind, with_ev, without_ev, sub, mask[rows], chunk_size,
                                                     temperature, top_k)
            if counter is not None:
                counter.kernel_s += time.perf_counter() - start
    if on_device:
        return GroupRelevance(maps=maps, entropy=ent)
    return GroupRelevance(maps=maps.cpu(), entropy=ent.cpu() if ent is not None else None)


@dataclass
class ReplayResult:
    """Relevance of one completion. ``relevance`` ``(K, T)``: 0 rows where a reward has no evidence."""

    relevance: Tensor
    has_evidence: list[bool]
    joint: Tensor | None = None  # (T,) all evidence at once (contrast baseline)
    entropy: Tensor | None = None  # (T,) the policy's own entropy (entropy baseline)


def replay_completion(
    model: Any,
    tokenizer: Any,
    example: Example,
    completion_ids: Tensor,
    evidences: Sequence[Evidence | None],
    *,
    render: PromptRenderer | None = None,
    kind: str = "js",
    temperature: float = 1.0,
    chunk_size: int | None = None,
    top_k: int | None = None,
    header: str = DEFAULT_PRIVILEGED_HEADER,
    verifiers: Sequence[str] | None = None,
    with_joint: bool = False,
    with_entropy: bool = False,
) -> ReplayResult:
    """Replay one completion ``(T,)`` of ``example`` under each reward's counterfactual.

    ``1 + K_e`` contexts (plus one for ``with_joint``), through :func:`group_context_logits`. ``render`` turns an example into its prompt
    string (default :func:`default_render_prompt`); it must be the renderer used for generation.
    """
    render = render or (lambda ex: default_render_prompt(ex, tokenizer))
    names = list(verifiers) if verifiers is not None else [f"reward_{k}" for k in range(len(evidences))]

    def ids_of(prompt: str) -> list[int]:
        return list(tokenizer(prompt, add_special_tokens=False)["input_ids"])

    completion_ids = completion_ids.to(torch.long).cpu()
    t = completion_ids.numel()
    contexts, placements, present = replay_contexts(example, evidences, render, ids_of, names=names, joint=with_joint,
                                                    header=header)
    group = group_relevance(model, contexts, placements, completion_ids.unsqueeze(0), torch.tensor([t]), kind=kind,
                            temperature=temperature, chunk_size=chunk_size, top_k=top_k, with_entropy=with_entropy)
    maps = [m[0] for m in group.maps]
    rows, has, cursor = [], [], 0
    for ev in evidences:
        has.append(ev is not None)
        if ev is None:
            rows.append(torch.zeros(t))
        else:
            rows.append(maps[cursor])
            cursor += 1
    joint = maps[cursor] if with_joint and present else None
    ent = group.entropy[0] if group.entropy is not None else None
    relevance = torch.stack(rows) if rows else torch.zeros(0, t)
    return ReplayResult(relevance=relevance.float(), has_evidence=has, joint=joint, entropy=ent)


__all__ = [
    "ForwardCounter", "GroupRelevance", "ReplayResult", "common_prefix_length", "completion_logits",
    "group_context_logits", "group_forward_calls", "group_relevance", "replay_completion", "replay_passes",
    "shared_lengths", "underlying_model",
]
