"""Evidence replays: teacher-force a completion with and without a reward's evidence (docs/design.md#step-relevance).

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
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from types import MethodType
from typing import Any

import torch
from torch import Tensor

from mrtpo.counterfactual import DEFAULT_PRIVILEGED_HEADER, PromptRenderer, default_render_prompt
from mrtpo.credit import paired_entropy, paired_relevance
from mrtpo.replay_plan import example_contexts, plan_replays
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


@contextmanager
def autocast_outputs(model: Any) -> Iterator[None]:
    """While active, a model prepared by accelerate for mixed precision returns autocast's own
    (bf16 / fp16) outputs instead of an fp32 copy of them.

    accelerate wraps such a model's ``forward`` so that every output is upcast to fp32; for a
    replay that is a second, fp32 copy of ``(Σ C·G, T, V)`` logits next to the bf16 ones (2.5 →
    7.5 GB per group of 8 × 256 tokens at V = 152k), though the relevance kernels upcast each chunk
    anyway: the maps come out bit-identical. The wrapped forward of every module of ``model`` that
    has one (the model, or the module under DDP / FSDP wrappers, which call it) is swapped for the
    autocast forward underneath it, and restored on exit. A model without the wrapper is untouched.
    """
    from accelerate.utils.operations import ConvertOutputsToFp32

    swapped = []
    for module in model.modules() if isinstance(model, torch.nn.Module) else []:
        forward = module.__dict__.get("forward")
        converter = getattr(getattr(forward, "__func__", forward), "__wrapped__", None)
        if isinstance(converter, ConvertOutputsToFp32):
            inner = converter.model_forward
            module.forward = MethodType(inner, module) if hasattr(forward, "__func__") else inner
            swapped.append((module, forward))
    try:
        yield
    finally:
        for module, forward in swapped:
            module.forward = forward


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


def _left_padded(sequences: Sequence[Sequence[int]], starts: Sequence[int],
                 device: Any) -> tuple[Tensor, Tensor, Tensor]:
    """``(ids, mask, positions)`` ``(N, W)`` of token sequences left-padded to the longest, each
    sequence's positions counting from its ``starts[i]``; built on the host, one copy each."""
    width = max(map(len, sequences))
    ids, mask, positions = [], [], []
    for seq, start in zip(sequences, starts):
        pad = width - len(seq)
        ids.append([0] * pad + list(seq))
        mask.append([0] * pad + [1] * len(seq))
        positions.append([0] * pad + list(range(start, start + len(seq))))
    return tuple(torch.tensor(x, dtype=torch.long).to(device, non_blocking=True) for x in (ids, mask, positions))


@dataclass
class PassLogits:
    """The logits of one replay pass: ``logits`` ``(Σ C·G, T, V)``, in the model's dtype;
    ``blocks[m][c]``: the first row of member ``m``'s context ``c`` (its ``sizes[m]`` completions'
    rows follow); ``widths[m]``: the member's own completion width ``≤ T``."""

    logits: Tensor
    blocks: list[list[int]]
    sizes: list[int]
    widths: list[int]

    def of(self, member: int, context: int) -> Tensor:
        """``(G, T_m, V)``: member ``member``'s completions under its context ``context``."""
        first = self.blocks[member][context]
        return self.logits[first:first + self.sizes[member], :self.widths[member]]


@torch.no_grad()
def pass_context_logits(
    model: Any,
    members: Sequence[tuple[Sequence[Sequence[int]], Tensor]],
    counter: ForwardCounter | None = None,
) -> PassLogits:
    """For each member group and each of its contexts, the logits predicting every token of the
    member's completions, as one :class:`PassLogits`.

    ``members``: one ``(contexts, completions)`` pair per prompt group replayed in this pass:
    ``contexts`` the token ids of its ``C`` prompts (the original one first, then its
    counterfactuals), ``completions`` ``(G, T)`` right-padded ids (padding never influences a valid
    position: attention is causal). A member's repeated contexts run once and share their rows, so
    identical contexts give identical logits (and a relevance of exactly 0).

    At most three forward calls, whatever the number of members, contexts and completions: every
    member's original prompt but its last token (its trunk), left-padded into one batch; every
    context's tokens after its departure from its original (:func:`shared_lengths`) but its last,
    as one left-padded batch on the trunks' cache, each row seeing only the trunk positions of its
    own group it shares (the rest and the pads masked, positions continuing its own prefix); then
    all ``Σ C × G`` rows ``[last context token, completion[:-1]]`` as one batch on that cache,
    repeated per completion. Every context goes through the same path, and each prompt is paid once
    per pass. The first two calls skip the vocabulary head (``logits_to_keep=1``): only their cache
    is read. Inputs and masks are built on the host and copied once per call; nothing is read back.
    """
    key = _cache_keyword(model)
    counter = counter or ForwardCounter()
    device = next(underlying_model(model).parameters()).device
    slots, member_contexts = [], []
    for contexts, _ in members:
        distinct: dict[tuple[int, ...], int] = {}
        slots.append([distinct.setdefault(tuple(int(x) for x in ctx), len(distinct)) for ctx in contexts])
        member_contexts.append([list(ctx) for ctx in distinct])
    trunk_lens = [len(contexts[0]) - 1 for contexts in member_contexts]
    trunk_width = max(trunk_lens)
    row_member = [m for m, contexts in enumerate(member_contexts) for _ in contexts]
    rows = [ctx for contexts in member_contexts for ctx in contexts]
    shared = [s for contexts in member_contexts for s in shared_lengths(contexts)]
    cache = None
    if trunk_width > 0:
        ids, mask, positions = _left_padded([contexts[0][:-1] for contexts in member_contexts],
                                            [0] * len(members), device)
        out = model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True, logits_to_keep=1)
        cache = _returned_cache(out)  # only its cache is used
        counter.calls += 1
        cache.reorder_cache(torch.tensor(row_member).to(device, non_blocking=True))
    past_mask = torch.tensor([[int(trunk_width - trunk_lens[m] <= j < trunk_width - trunk_lens[m] + s)
                               for j in range(trunk_width)] for m, s in zip(row_member, shared)],
                             dtype=torch.long).view(len(rows), trunk_width).to(device, non_blocking=True)
    heads = [ctx[s:-1] for ctx, s in zip(rows, shared)]
    if max(map(len, heads)) > 0:
        ids, head_mask, positions = _left_padded(heads, shared, device)
        past_mask = torch.cat([past_mask, head_mask], dim=1)
        kwargs = {key: cache} if cache is not None else {}
        out = model(input_ids=ids, attention_mask=past_mask, position_ids=positions, use_cache=True, logits_to_keep=1,
                    **kwargs)
        cache = _returned_cache(out)
        counter.calls += 1
    sizes = [completions.shape[0] for _, completions in members]
    widths = [completions.shape[1] for _, completions in members]
    t = max(widths)
    # built where the completions are (the host, from the trainer), then copied once
    padded = [torch.nn.functional.pad(completions, (0, t - completions.shape[1])) for _, completions in members]
    expand_host = torch.repeat_interleave(torch.arange(len(rows)), torch.tensor([sizes[m] for m in row_member]))
    expand = expand_host.to(device, non_blocking=True)
    last = torch.tensor([int(ctx[-1]) for ctx in rows])[expand_host].to(padded[0].device)
    starts = torch.tensor([len(ctx) - 1 for ctx in rows])[expand_host]
    inputs = torch.cat([last.unsqueeze(1), torch.cat([padded[m][:, :-1] for m in row_member])], dim=1)
    inputs = inputs.to(device, non_blocking=True)
    positions = (starts.unsqueeze(1) + torch.arange(t)).to(device, non_blocking=True)
    attention = torch.cat([past_mask[expand], torch.ones(len(expand_host), t, dtype=torch.long, device=device)], dim=1)
    kwargs = {}
    if cache is not None:
        cache.reorder_cache(expand)
        kwargs = {key: cache}
    out = model(input_ids=inputs, attention_mask=attention, position_ids=positions, use_cache=cache is not None,
                **kwargs)
    counter.calls += 1
    blocks, first_row = [], 0
    for m, member_slots in enumerate(slots):
        blocks.append([first_row + slot * sizes[m] for slot in member_slots])
        first_row += len(member_contexts[m]) * sizes[m]
    return PassLogits(out.logits, blocks, sizes, widths)


def group_context_logits(model: Any, contexts: Sequence[Sequence[int]], completions: Tensor,
                         counter: ForwardCounter | None = None):
    """:func:`pass_context_logits` for one group: yields ``(context_index, logits (G, T, V))``."""
    result = pass_context_logits(model, [(contexts, completions)], counter)
    for index in range(len(contexts)):
        yield index, result.of(0, index)


def pass_forward_calls(member_contexts: Sequence[Sequence[Sequence[int]]]) -> int:
    """Forward calls :func:`pass_context_logits` makes for these groups' contexts, whatever their
    number and the completions' shape: the trunks (if some original has more than one token), the
    contexts' tokens after their departure but the last (if any context has some), the completions."""
    trunk = any(len(contexts[0]) > 1 for contexts in member_contexts)
    heads = any(len(ctx) - 1 > s for contexts in member_contexts for ctx, s in zip(contexts, shared_lengths(contexts)))
    return int(trunk) + int(heads) + 1


def group_forward_calls(contexts: Sequence[Sequence[int]]) -> int:
    """:func:`pass_forward_calls` for one group."""
    return pass_forward_calls([contexts])


def plan_passes(sizes: Sequence[int], micro_batch: int | None = None,
                groups_per_pass: int | None = 1) -> list[list[tuple[int, slice]]]:
    """Pack groups of ``sizes[i]`` completions into replay passes: a list of passes, each a list of
    ``(group index, completion rows)``.

    A pass holds at most ``groups_per_pass`` groups (``None``: any number) and at most
    ``micro_batch`` completions (``None``: any number); a group that does not fit in what is left of
    a pass continues in the next one. Groups and rows keep their order; empty groups take no room.
    """
    if micro_batch is not None and micro_batch < 1:
        raise ValueError(f"micro_batch must be >= 1 or None, got {micro_batch}")
    if groups_per_pass is not None and groups_per_pass < 1:
        raise ValueError(f"groups_per_pass must be >= 1 or None, got {groups_per_pass}")
    passes: list[list[tuple[int, slice]]] = []
    current: list[tuple[int, slice]] = []
    room = micro_batch
    for group, size in enumerate(sizes):
        first = 0
        while first < size:
            if current and (room == 0 or (groups_per_pass is not None and len(current) == groups_per_pass)):
                passes.append(current)
                current, room = [], micro_batch
            take = size - first if room is None else min(size - first, room)
            current.append((group, slice(first, first + take)))
            first += take
            room = None if room is None else room - take
    if current:
        passes.append(current)
    return passes


def replay_forward_calls(group_contexts: Sequence[Sequence[Sequence[int]]], sizes: Sequence[int],
                         micro_batch: int | None = None, groups_per_pass: int | None = 1, packed: bool = False) -> int:
    """Forward calls :func:`batch_relevance` makes for these groups (contexts, completion counts)."""
    return sum(1 if packed else pass_forward_calls([group_contexts[group] for group, _ in members])
               for members in plan_passes(sizes, micro_batch, groups_per_pass))


@dataclass
class GroupRelevance:
    """Relevance of one prompt group. ``maps``: ``(C − 1, G, T)``, one per counterfactual context
    (0 on padding); ``entropy``: ``(G, T)`` of the original context when asked for."""

    maps: Tensor
    entropy: Tensor | None = None


@dataclass
class ReplayGroup:
    """One prompt group to replay: ``contexts`` (the original prompt's ids first, then its
    counterfactuals'), ``placements[i]`` the side of counterfactual ``i`` that carries the evidence,
    ``completions`` ``(G, T)`` right-padded ids, ``lengths`` ``(G,)``; ``bases[i]`` the context that
    counterfactual ``i`` is measured against (``None``: every one against the original, context 0)."""

    contexts: Sequence[Sequence[int]]
    placements: Sequence[str]
    completions: Tensor
    lengths: Tensor
    bases: Sequence[int] | None = None


def batch_relevance(
    model: Any,
    groups: Sequence[ReplayGroup],
    *,
    kind: str = "js",
    temperature: float = 1.0,
    chunk_size: int | None = None,
    top_k: int | None = None,
    with_entropy: bool = False,
    micro_batch: int | None = None,
    groups_per_pass: int | None = 1,
    counter: ForwardCounter | None = None,
    on_device: bool = False,
    packed: bool = False,
) -> list[GroupRelevance]:
    """Relevance of each group's counterfactuals ``contexts[1:]`` against its original ``contexts[0]``
    (or against the context ``bases`` names).

    ``placements`` say which side carries the evidence (``in_prompt``: the base;
    ``privileged``: the counterfactual), which matters for ``kl``. The groups are replayed in the
    passes of :func:`plan_passes` (``micro_batch``: at most that many completions per pass;
    ``groups_per_pass``: at most that many groups, ``None``: all), each pass in the three forward
    calls of :func:`pass_context_logits`, so the calls per step do not grow with the groups that
    share a pass. The logits held at a time scale with a pass's rows: 2 (bf16) or 4 (fp32) bytes ×
    Σ contexts × completions × T × V, plus the kernels' fp32 chunks. The maps are built on the
    model's device without a host copy per context; ``on_device`` returns them there (a caller
    that keeps replaying copies once at the end), else on the CPU. ``packed``: each pass in one
    forward call with every context's completions packed behind it (:mod:`mrtpo.packing`).
    """
    device = next(underlying_model(model).parameters()).device
    results, masks = [], []
    for group in groups:
        if len(group.placements) != len(group.contexts) - 1:
            raise ValueError(f"need one placement per counterfactual: {len(group.contexts) - 1}, "
                             f"got {len(group.placements)}")
        if group.bases is not None and (len(group.bases) != len(group.placements)
                                        or not all(0 <= b < len(group.contexts) for b in group.bases)):
            raise ValueError(f"need one base context index per counterfactual, got {list(group.bases)}")
        g, t = group.completions.shape
        lengths = group.lengths.to(group.completions.device)
        masks.append(torch.arange(t, device=lengths.device).unsqueeze(0) < lengths.view(-1, 1))
        results.append(GroupRelevance(maps=torch.zeros(len(group.contexts) - 1, g, t, device=device),
                                      entropy=torch.zeros(g, t, device=device) if with_entropy else None))
    for members in plan_passes([group.completions.shape[0] for group in groups], micro_batch, groups_per_pass):
        pieces = [(groups[index].contexts, groups[index].completions[rows]) for index, rows in members]
        if packed:
            from mrtpo.packing import packed_pass_logits

            out = packed_pass_logits(model, pieces, [groups[index].lengths[rows] for index, rows in members], counter)
        else:
            out = pass_context_logits(model, pieces, counter)
        start = time.perf_counter()
        t = out.logits.shape[1]
        # every (member, counterfactual) pair of the pass in one kernel call: rows of `out.logits`
        with_rows, without_rows, ids, pair_masks, targets = [], [], [], [], []
        base_rows, base_masks = [], []
        for m, (group_index, rows) in enumerate(members):
            group = groups[group_index]
            completions = torch.nn.functional.pad(pieces[m][1], (0, t - out.widths[m]))
            mask = torch.nn.functional.pad(masks[group_index][rows], (0, t - out.widths[m]))
            base = torch.arange(out.sizes[m]) + out.blocks[m][0]  # row indices: host-built, copied once below
            base_rows.append(base)
            base_masks.append(mask)
            for c, placement in enumerate(group.placements, start=1):
                other = torch.arange(out.sizes[m]) + out.blocks[m][c]
                reference = base if group.bases is None else base - out.blocks[m][0] + out.blocks[m][group.bases[c - 1]]
                with_rows.append(reference if placement == "in_prompt" else other)
                without_rows.append(other if placement == "in_prompt" else reference)
                ids.append(completions)
                pair_masks.append(mask)
                targets.append((group_index, c - 1, rows, out.widths[m]))
        if with_rows:
            with_rows, without_rows, ids, pair_masks = (torch.cat(x).to(device, non_blocking=True) for x in
                                                        (with_rows, without_rows, ids, pair_masks))
            values = paired_relevance(kind, out.logits, with_rows, without_rows, ids, pair_masks, chunk_size,
                                      temperature, top_k)
            first = 0
            for group_index, c, rows, width in targets:
                n = rows.stop - rows.start
                results[group_index].maps[c, rows] = values[first:first + n, :width]
                first += n
        if with_entropy:
            values = paired_entropy(out.logits, torch.cat(base_rows).to(device, non_blocking=True),
                                    torch.cat(base_masks).to(device, non_blocking=True), chunk_size, temperature)
            first = 0
            for m, (group_index, rows) in enumerate(members):
                results[group_index].entropy[rows] = values[first:first + out.sizes[m], :out.widths[m]]
                first += out.sizes[m]
        if counter is not None:
            counter.kernel_s += time.perf_counter() - start
    if not on_device:
        results = [GroupRelevance(maps=r.maps.cpu(), entropy=r.entropy.cpu() if r.entropy is not None else None)
                   for r in results]
    return results


def group_relevance(model: Any, contexts: Sequence[Sequence[int]], placements: Sequence[str], completions: Tensor,
                    lengths: Tensor, **kwargs: Any) -> GroupRelevance:
    """:func:`batch_relevance` of one group (same keywords): ``maps`` ``(C − 1, G, T)``."""
    return batch_relevance(model, [ReplayGroup(contexts, placements, completions, lengths)], **kwargs)[0]


@dataclass
class ReplayResult:
    """Relevance of one completion. ``relevance`` ``(K, T)``: 0 rows where a reward has no evidence."""

    relevance: Tensor
    has_evidence: list[bool]  # the rewards whose own map was replayed
    joint: Tensor | None = None  # (T,) all evidence at once (needs "joint"; 0 where no reward has evidence)
    entropy: Tensor | None = None  # (T,) the policy's own entropy (needs "entropy")
    decoy: Tensor | None = None  # (K, T) each reward's map under a decoy (needs "contrastive"; 0: no decoy)


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
    needs: str | Sequence[str] = "per_reward",
) -> ReplayResult:
    """Replay one completion ``(T,)`` of ``example`` under the contexts that the credit ``needs``
    kinds ask for (:mod:`mrtpo.replay_plan`: ``per_reward`` the ``1 + K_e`` contexts, ``joint`` one
    more, ``entropy`` the original's entropy), through :func:`batch_relevance`. ``render`` turns an
    example into its prompt string (default :func:`default_render_prompt`); it must be the renderer
    used for generation.
    """
    render = render or (lambda ex: default_render_prompt(ex, tokenizer))
    names = list(verifiers) if verifiers is not None else [f"reward_{k}" for k in range(len(evidences))]

    def ids_of(prompt: str) -> list[int]:
        return list(tokenizer(prompt, add_special_tokens=False)["input_ids"])

    completion_ids = completion_ids.to(torch.long).cpu()
    t = completion_ids.numel()
    plan = plan_replays([[0]], [list(evidences)], [t], needs)
    replays = [ReplayGroup(example_contexts(group, example, names, render, ids_of, header=header), group.placements,
                           completion_ids.unsqueeze(0), torch.tensor([t]), group.bases) for group in plan.replayed]
    results = batch_relevance(model, replays, kind=kind, temperature=temperature, chunk_size=chunk_size, top_k=top_k,
                              with_entropy=plan.entropy)
    maps = plan.scatter(results, t)
    relevance = maps["relevance"]
    return ReplayResult(relevance=(relevance[0] if relevance is not None else torch.zeros(len(evidences), t)).float(),
                        has_evidence=maps["has_evidence"][0].tolist(),
                        joint=None if maps["joint_relevance"] is None else maps["joint_relevance"][0],
                        entropy=None if maps["entropy"] is None else maps["entropy"][0],
                        decoy=None if maps["decoy_relevance"] is None else maps["decoy_relevance"][0])


__all__ = [
    "ForwardCounter", "GroupRelevance", "PassLogits", "ReplayGroup", "ReplayResult", "autocast_outputs",
    "batch_relevance", "common_prefix_length",
    "completion_logits", "group_context_logits", "group_forward_calls", "group_relevance", "pass_context_logits",
    "pass_forward_calls", "plan_passes", "replay_completion", "replay_forward_calls", "shared_lengths",
    "underlying_model",
]
