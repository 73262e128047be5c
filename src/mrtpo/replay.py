"""Evidence replays: teacher-force a completion with and without a reward's evidence (docs/design.md#step-relevance).

The contexts come from :mod:`mrtpo.counterfactual` (the original prompt and, per reward, the prompt
without its ``in_prompt`` evidence or with its ``privileged`` evidence appended). The same
completion tokens are scored under every context with plain no-grad forwards (full logits, never a
fused log-prob head), all through the same code path, dtype and padding, so identical contexts give
a relevance of exactly 0. This module returns relevance; which method uses it is decided in
:mod:`mrtpo.credit`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from mrtpo.counterfactual import DEFAULT_PRIVILEGED_HEADER, PromptRenderer, default_render_prompt
from mrtpo.credit import paired_entropy, paired_relevance
from mrtpo.model_calls import ForwardCounter, PassLogits, cache_keyword, returned_cache, underlying_model
from mrtpo.replay_passes import plan_passes, shared_lengths
from mrtpo.replay_plan import GroupPlan, ReplayPlan, example_contexts, plan_replays
from mrtpo.verifiers import Evidence, Example


def _left_padded(
    sequences: Sequence[Sequence[int]], starts: Sequence[int], device: Any
) -> tuple[Tensor, Tensor, Tensor]:
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
    context's tokens after its departure from its original (:func:`mrtpo.replay_passes.shared_lengths`) but its last,
    as one left-padded batch on the trunks' cache, each row seeing only the trunk positions of its
    own group it shares (the rest and the pads masked, positions continuing its own prefix); then
    all ``Σ C × G`` rows ``[last context token, completion[:-1]]`` as one batch on that cache,
    repeated per completion. Every context goes through the same path, and each prompt is paid once
    per pass. The first two calls skip the vocabulary head (``logits_to_keep=1``): only their cache
    is read. Inputs and masks are built on the host and copied once per call; nothing is read back.
    """
    key = cache_keyword(model)
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
        ids, mask, positions = _left_padded(
            [contexts[0][:-1] for contexts in member_contexts], [0] * len(members), device
        )
        out = model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True, logits_to_keep=1)
        cache = returned_cache(out)  # only its cache is used
        counter.calls += 1
        cache.reorder_cache(torch.tensor(row_member).to(device, non_blocking=True))
    past_mask = (
        torch.tensor(
            [
                [int(trunk_width - trunk_lens[m] <= j < trunk_width - trunk_lens[m] + s) for j in range(trunk_width)]
                for m, s in zip(row_member, shared)
            ],
            dtype=torch.long,
        )
        .view(len(rows), trunk_width)
        .to(device, non_blocking=True)
    )
    heads = [ctx[s:-1] for ctx, s in zip(rows, shared)]
    if max(map(len, heads)) > 0:
        ids, head_mask, positions = _left_padded(heads, shared, device)
        past_mask = torch.cat([past_mask, head_mask], dim=1)
        kwargs = {key: cache} if cache is not None else {}
        out = model(
            input_ids=ids, attention_mask=past_mask, position_ids=positions, use_cache=True, logits_to_keep=1, **kwargs
        )
        cache = returned_cache(out)
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
    out = model(
        input_ids=inputs, attention_mask=attention, position_ids=positions, use_cache=cache is not None, **kwargs
    )
    counter.calls += 1
    blocks, first_row = [], 0
    for m, member_slots in enumerate(slots):
        blocks.append([first_row + slot * sizes[m] for slot in member_slots])
        first_row += len(member_contexts[m]) * sizes[m]
    return PassLogits(out.logits, blocks, sizes, widths)


def group_context_logits(
    model: Any, contexts: Sequence[Sequence[int]], completions: Tensor, counter: ForwardCounter | None = None
):
    """:func:`pass_context_logits` for one group: yields ``(context_index, logits (G, T, V))``."""
    result = pass_context_logits(model, [(contexts, completions)], counter)
    for index in range(len(contexts)):
        yield index, result.of(0, index)


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
    passes of :func:`mrtpo.replay_passes.plan_passes` (``micro_batch``: at most that many completions per pass;
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
            raise ValueError(
                f"need one placement per counterfactual: {len(group.contexts) - 1}, got {len(group.placements)}"
            )
        if group.bases is not None and (
            len(group.bases) != len(group.placements) or not all(0 <= b < len(group.contexts) for b in group.bases)
        ):
            raise ValueError(f"need one base context index per counterfactual, got {list(group.bases)}")
        g, t = group.completions.shape
        lengths = group.lengths.to(group.completions.device)
        masks.append(torch.arange(t, device=lengths.device).unsqueeze(0) < lengths.view(-1, 1))
        results.append(
            GroupRelevance(
                maps=torch.zeros(len(group.contexts) - 1, g, t, device=device),
                entropy=torch.zeros(g, t, device=device) if with_entropy else None,
            )
        )
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
            with_rows, without_rows, ids, pair_masks = (
                torch.cat(x).to(device, non_blocking=True) for x in (with_rows, without_rows, ids, pair_masks)
            )
            values = paired_relevance(
                kind, out.logits, with_rows, without_rows, ids, pair_masks, chunk_size, temperature, top_k
            )
            first = 0
            for group_index, c, rows, width in targets:
                n = rows.stop - rows.start
                results[group_index].maps[c, rows] = values[first : first + n, :width]
                first += n
        if with_entropy:
            values = paired_entropy(
                out.logits,
                torch.cat(base_rows).to(device, non_blocking=True),
                torch.cat(base_masks).to(device, non_blocking=True),
                chunk_size,
                temperature,
            )
            first = 0
            for m, (group_index, rows) in enumerate(members):
                results[group_index].entropy[rows] = values[first : first + out.sizes[m], : out.widths[m]]
                first += out.sizes[m]
        if counter is not None:
            counter.kernel_s += time.perf_counter() - start
    if not on_device:
        results = [
            GroupRelevance(maps=r.maps.cpu(), entropy=r.entropy.cpu() if r.entropy is not None else None)
            for r in results
        ]
    return results


def group_relevance(
    model: Any,
    contexts: Sequence[Sequence[int]],
    placements: Sequence[str],
    completions: Tensor,
    lengths: Tensor,
    **kwargs: Any,
) -> GroupRelevance:
    """:func:`batch_relevance` of one group (same keywords): ``maps`` ``(C − 1, G, T)``."""
    return batch_relevance(model, [ReplayGroup(contexts, placements, completions, lengths)], **kwargs)[0]


def run_replay_plan(
    model: Any,
    plan: ReplayPlan,
    contexts_of: Callable[[GroupPlan], Sequence[Sequence[int]]],
    completions: Tensor,
    lengths: Tensor,
    *,
    device: Any = None,
    on_replays: Callable[[list[ReplayGroup]], None] | None = None,
    **relevance: Any,
) -> dict[str, Tensor | None]:
    """Carry out ``plan`` (:func:`mrtpo.replay_plan.plan_replays`): the maps of every credit field, ``(B, K, T)`` /
    ``(B, T)`` as :meth:`mrtpo.replay_plan.ReplayPlan.scatter` gives them.

    ``contexts_of(group)``: the token ids of a replayed group's contexts (the original prompt first; e.g.
    :func:`mrtpo.replay_plan.example_contexts`); ``completions`` ``(B, T)`` right-padded ids and ``lengths``
    ``(B,)`` of the whole batch, rows as the plan numbers them. ``on_replays`` sees the groups before any forward
    call (the trainer agrees on the call count across ranks there); ``relevance``: :func:`batch_relevance`'s
    keywords (``with_entropy`` comes from the plan). Every caller that replays goes through here.
    """
    replays = [
        ReplayGroup(
            contexts_of(group),
            group.placements,
            completions[group.rows, : group.width],
            lengths[group.rows],
            group.bases,
        )
        for group in plan.replayed
    ]
    if on_replays is not None:
        on_replays(replays)
    results = batch_relevance(model, replays, with_entropy=plan.entropy, **relevance)
    return plan.scatter(results, completions.shape[1], device)


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
    maps = run_replay_plan(
        model,
        plan,
        lambda group: example_contexts(group, example, names, render, ids_of, header=header),
        completion_ids.unsqueeze(0),
        torch.tensor([t]),
        kind=kind,
        temperature=temperature,
        chunk_size=chunk_size,
        top_k=top_k,
    )
    relevance = maps["relevance"]
    return ReplayResult(
        relevance=(relevance[0] if relevance is not None else torch.zeros(len(evidences), t)).float(),
        has_evidence=maps["has_evidence"][0].tolist(),
        joint=None if maps["joint_relevance"] is None else maps["joint_relevance"][0],
        entropy=None if maps["entropy"] is None else maps["entropy"][0],
        decoy=None if maps["decoy_relevance"] is None else maps["decoy_relevance"][0],
    )


__all__ = [
    "GroupRelevance",
    "ReplayGroup",
    "ReplayResult",
    "batch_relevance",
    "group_context_logits",
    "group_relevance",
    "pass_context_logits",
    "replay_completion",
    "run_replay_plan",
]
