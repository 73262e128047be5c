"""Evidence replays: teacher-force a completion with and without a reward's evidence (SPEC §1 step 4).

For each reward with evidence, the policy sees two contexts that differ only in that evidence:

- ``in_prompt``: the original prompt (*with*) and the prompt with the evidence span removed
  (*without*);
- ``privileged``: the original prompt (*without*) and the prompt with the evidence appended to the
  last user turn under a fixed header (*with*).

The same completion tokens are scored under both contexts with plain no-grad forwards (full
logits, never a fused log-prob head), both through the same code path, dtype and padding, so
identical contexts give a relevance of exactly 0. This module returns relevance; which method
uses it is decided in :mod:`mrtpo.credit`.
"""

from __future__ import annotations

import copy
import inspect
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import Tensor

from mrtpo.credit import entropy as entropy_map
from mrtpo.credit import relevance as relevance_fn
from mrtpo.verifiers import Evidence, Example

#: Header under which privileged evidence is appended to the last user turn.
DEFAULT_PRIVILEGED_HEADER = "Reference information for checking the answer:"


class EvidenceNotFoundError(ValueError):
    """An ``in_prompt`` evidence span does not occur exactly once in the rendered prompt."""


PromptRenderer = Callable[[Example], str]


def default_render_prompt(example: Example, tokenizer: Any) -> str:
    """The prompt string for ``example``: its chat template (with ``example.tools``) and the
    generation prompt. Tasks that render differently provide ``render_prompt(example, tokenizer)``;
    tokenizers without a chat template get a plain ``role: content`` transcript."""
    if getattr(tokenizer, "chat_template", None):
        kwargs = {"tools": example.tools} if example.tools else {}
        return tokenizer.apply_chat_template(example.messages, tokenize=False, add_generation_prompt=True, **kwargs)
    lines = [f"{m['role']}: {m['content']}" for m in example.messages]
    return "\n".join([*lines, "assistant:"])


def prompt_renderer(task: Any, tokenizer: Any) -> PromptRenderer:
    """``example -> prompt string``: the task's own ``render_prompt`` if it has one, else the default."""
    own = getattr(task, "render_prompt", None)
    if own is not None:
        return lambda example: own(example, tokenizer)
    return lambda example: default_render_prompt(example, tokenizer)


def _strength(separator: str) -> tuple[int, int]:
    return separator.count("\n"), len(separator)


def cut(text: str, start: int, end: int) -> str:
    """``text`` without ``text[start:end]`` and the separator that went with it.

    The whitespace runs on either side of the cut collapse into the stronger one (more newlines,
    then longer): ``"A\nS\nB" -> "A\nB"``, ``"A\n\nS\nB" -> "A\n\nB"``, ``"A. S B" -> "A. B"``. At
    the start or end of ``text`` the whitespace towards the cut goes entirely: ``"A\n\nS" -> "A"``.
    """
    before, after = text[:start], text[end:]
    core_before, core_after = before.rstrip(), after.lstrip()
    if not core_before:
        return core_after
    if not core_after:
        return core_before
    separator = max(before[len(core_before):], after[: len(after) - len(core_after)], key=_strength)
    return core_before + separator + core_after


def _require_once(text: str, span: str, verifier: str, example_id: str) -> None:
    count = text.count(span)
    if count != 1:
        where = "does not occur" if count == 0 else f"occurs {count} times"
        raise EvidenceNotFoundError(
            f"in_prompt evidence of verifier {verifier!r} for example {example_id!r} {where} in the "
            f"rendered prompt (it must occur exactly once): {span[:120]!r}"
        )


def remove_span(prompt: str, span: str, *, verifier: str = "?", example_id: str = "?") -> str:
    """``prompt`` without ``span``, which must occur exactly once, and its separator (:func:`cut`)."""
    _require_once(prompt, span, verifier, example_id)
    start = prompt.index(span)
    return cut(prompt, start, start + len(span))


def append_privileged(messages: list[dict[str, Any]], text: str, header: str = DEFAULT_PRIVILEGED_HEADER) -> list[dict]:
    """Copy of ``messages`` with ``text`` appended to the last user turn under ``header``."""
    out = [dict(m) for m in messages]
    for message in reversed(out):
        if message.get("role") == "user":
            message["content"] = f"{message['content']}\n\n{header}\n{text}"
            return out
    raise ValueError("privileged evidence needs a user message to append to; the prompt has none")


def _message_holding(messages: Sequence[dict[str, Any]], span: str) -> int | None:
    """Index of the one message whose text content holds ``span`` exactly once (else ``None``)."""
    holders = [i for i, m in enumerate(messages) if isinstance(m.get("content"), str) and span in m["content"]]
    if len(holders) == 1 and messages[holders[0]]["content"].count(span) == 1:
        return holders[0]
    return None


def counterfactual_text(
    prompt: str | list[dict[str, Any]],
    evidences: Sequence[Evidence],
    render: Callable[[list[dict[str, Any]]], str],
    header: str = DEFAULT_PRIVILEGED_HEADER,
    *,
    verifiers: Sequence[str] | None = None,
    example_id: str = "?",
) -> str:
    """The prompt string with every ``in_prompt`` evidence removed and every ``privileged`` one appended.

    ``prompt``: chat messages (rendered by ``render``) or a plain string. Each ``in_prompt`` span
    must occur exactly once in the rendered prompt. A span inside one message is cut from that
    message's content before rendering (:func:`cut`), so the result is the prompt rendered as if
    the message had been written without it; a span across messages (or in text the template adds)
    is cut from the rendered string. Privileged evidence goes to the last user turn under ``header``
    (appended to a plain string). Several rewards may share one evidence (the same span, or the same
    reference); the joint counterfactual removes or appends it once.
    """
    names = list(verifiers) if verifiers is not None else ["?"] * len(evidences)
    unique = dict(zip(evidences, names))  # Evidence is frozen: equal text and placement collapse
    evidences, names = list(unique), list(unique.values())
    privileged = [ev.text for ev in evidences if ev.placement == "privileged"]
    removed = [(ev.text, name) for ev, name in zip(evidences, names) if ev.placement == "in_prompt"]
    if isinstance(prompt, str):
        text = prompt + "".join(f"\n\n{header}\n{t}" for t in privileged)
        for span, name in removed:
            text = remove_span(text, span, verifier=name, example_id=example_id)
        return text
    messages = [dict(m) for m in prompt]
    for t in privileged:
        messages = append_privileged(messages, t, header)
    rendered = render(messages)
    in_rendered = []
    for span, name in removed:
        _require_once(rendered, span, name, example_id)
        index = _message_holding(messages, span)
        if index is None:
            in_rendered.append((span, name))
        else:
            content = messages[index]["content"]
            at = content.index(span)
            messages[index] = {**messages[index], "content": cut(content, at, at + len(span))}
    text = render(messages) if len(in_rendered) < len(removed) else rendered
    for span, name in in_rendered:
        text = remove_span(text, span, verifier=name, example_id=example_id)
    return text


def counterfactual_prompt(
    example: Example,
    evidences: Sequence[Evidence],
    render: PromptRenderer,
    header: str = DEFAULT_PRIVILEGED_HEADER,
    *,
    verifiers: Sequence[str] | None = None,
) -> str:
    """The prompt with every ``in_prompt`` evidence removed and every ``privileged`` one appended
    (:func:`counterfactual_text` on ``example.messages``).

    One evidence gives a reward's counterfactual; all of a prompt's evidence at once gives the
    joint counterfactual of the ``contrast`` baseline.
    """
    return counterfactual_text(example.messages, evidences, lambda msgs: render(replace(example, messages=msgs)),
                               header, verifiers=verifiers, example_id=example.id)


def replay_contexts(
    example: Example,
    evidences: Sequence[Evidence | None],
    render: PromptRenderer,
    ids_of: Callable[[str], list[int]],
    *,
    names: Sequence[str],
    per_reward: bool = True,
    joint: bool = False,
    header: str = DEFAULT_PRIVILEGED_HEADER,
) -> tuple[list[list[int]], list[str], list[str]]:
    """Token ids of one example's replay contexts, for :func:`group_relevance`.

    Order: the original prompt; with ``per_reward`` one counterfactual per reward that has
    evidence; with ``joint`` one counterfactual with all the evidence at once (``contrast``).
    Returns ``(contexts, placements, names of the rewards with evidence)``; a joint context's
    placement is ``in_prompt`` (the original carries the evidence, as for a removed span).
    """
    present = [(ev, n) for ev, n in zip(evidences, names) if ev is not None]
    contexts = [ids_of(render(example))]
    placements: list[str] = []
    if per_reward:
        for ev, n in present:
            contexts.append(ids_of(counterfactual_prompt(example, [ev], render, header, verifiers=[n])))
            placements.append(ev.placement)
    if joint and present:
        contexts.append(ids_of(counterfactual_prompt(example, [e for e, _ in present], render, header,
                                                     verifiers=[n for _, n in present])))
        placements.append("in_prompt")
    return contexts, placements, [n for _, n in present]


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


def _shared_prefix_length(contexts: Sequence[Sequence[int]]) -> int:
    """Tokens of the common prefix :func:`group_context_logits` runs once: the longest common prefix,
    leaving every context at least two tokens of its own when it has them (its own tokens but the
    last run on the prefix's cache, the last one with the completions)."""
    return max(0, min(common_prefix_length(contexts), min(len(c) for c in contexts) - 2))


@torch.no_grad()
def group_context_logits(
    model: Any,
    contexts: Sequence[Sequence[int]],
    completions: Tensor,
    counter: ForwardCounter | None = None,
):
    """For each context, the logits ``(G, T, V)`` predicting every token of ``G`` completions.

    ``contexts``: token ids of the ``C`` prompts (the original one and its counterfactuals);
    ``completions``: ``(G, T)`` right-padded completion ids (padding never influences a valid
    position: attention is causal). Yields ``(context_index, logits)`` in context order; the
    logits are views of one ``(C·G, T, V)`` tensor in the model's dtype (the relevance kernels
    upcast chunk by chunk). Repeated contexts run once and share their logits, so identical
    contexts give identical logits (and a relevance of exactly 0).

    At most three forward calls, whatever ``C`` and ``G``: the common prefix of all contexts once;
    every context's own tokens but its last as one left-padded batch on the prefix's cache (pads
    masked, positions continuing the prefix); then all ``C × G`` rows ``[last context token,
    completion[:-1]]`` as one batch on that cache, repeated per completion. Every context goes
    through the same path, and the shared prompt is paid once per group.
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
    prefix_len = _shared_prefix_length(contexts)
    cache = None
    if prefix_len > 0:
        prefix = torch.tensor([list(contexts[0][:prefix_len])], dtype=torch.long, device=device)
        cache = _returned_cache(model(input_ids=prefix, use_cache=True))
        counter.calls += 1
        cache.batch_repeat_interleave(c)
    heads = [list(ctx[prefix_len:-1]) for ctx in contexts]
    width = max(map(len, heads))
    past_mask = torch.ones(c, prefix_len, dtype=torch.long, device=device)
    if width > 0:
        ids = torch.zeros(c, width, dtype=torch.long, device=device)
        head_mask = torch.zeros(c, width, dtype=torch.long, device=device)
        positions = torch.zeros(c, width, dtype=torch.long, device=device)
        for row, head in enumerate(heads):
            if head:
                ids[row, width - len(head):] = torch.tensor(head, device=device)
                head_mask[row, width - len(head):] = 1
                positions[row, width - len(head):] = torch.arange(prefix_len, prefix_len + len(head), device=device)
        past_mask = torch.cat([past_mask, head_mask], dim=1)
        kwargs = {key: cache} if cache is not None else {}
        out = model(input_ids=ids, attention_mask=past_mask, position_ids=positions, use_cache=True, **kwargs)
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
    the completions' shape: the common prefix (if any), the contexts' own tokens but the last (if
    any context has more than one of its own), and the completions."""
    prefix = _shared_prefix_length(contexts)
    return (1 if prefix > 0 else 0) + (1 if any(len(ctx) - prefix > 1 for ctx in contexts) else 0) + 1


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
    "DEFAULT_PRIVILEGED_HEADER", "EvidenceNotFoundError", "ForwardCounter", "GroupRelevance", "ReplayResult",
    "append_privileged", "common_prefix_length", "completion_logits", "counterfactual_prompt",
    "counterfactual_text", "cut", "default_render_prompt", "group_context_logits", "group_forward_calls",
    "group_relevance", "prompt_renderer", "remove_span", "replay_completion", "replay_contexts",
    "replay_passes", "underlying_model"
]
