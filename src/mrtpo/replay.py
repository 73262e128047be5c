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


def remove_span(prompt: str, span: str, *, verifier: str = "?", example_id: str = "?") -> str:
    """``prompt`` without ``span``, which must occur exactly once; tidies the seam's whitespace."""
    count = prompt.count(span)
    if count != 1:
        where = "does not occur" if count == 0 else f"occurs {count} times"
        raise EvidenceNotFoundError(
            f"in_prompt evidence of verifier {verifier!r} for example {example_id!r} {where} in the "
            f"rendered prompt (it must occur exactly once): {span[:120]!r}"
        )
    start = prompt.index(span)
    before, after = prompt[:start], prompt[start + len(span) :]
    # The span's separator goes with it: the space after it, else the space before it, else one
    # of the two newlines around it.
    if after.startswith(" "):
        after = after[1:]
    elif before.endswith(" "):
        before = before[:-1]
    elif before.endswith("\n") and after.startswith("\n"):
        after = after[1:]
    return before + after


def append_privileged(messages: list[dict[str, Any]], text: str, header: str = DEFAULT_PRIVILEGED_HEADER) -> list[dict]:
    """Copy of ``messages`` with ``text`` appended to the last user turn under ``header``."""
    out = [dict(m) for m in messages]
    for message in reversed(out):
        if message.get("role") == "user":
            message["content"] = f"{message['content']}\n\n{header}\n{text}"
            return out
    raise ValueError("privileged evidence needs a user message to append to; the prompt has none")


def counterfactual_prompt(
    example: Example,
    evidences: Sequence[Evidence],
    render: PromptRenderer,
    header: str = DEFAULT_PRIVILEGED_HEADER,
    *,
    verifiers: Sequence[str] | None = None,
) -> str:
    """The prompt with every ``in_prompt`` evidence removed and every ``privileged`` one appended.

    One evidence gives a reward's counterfactual; all of a prompt's evidence at once gives the
    joint counterfactual of the ``contrast`` baseline.
    """
    names = list(verifiers) if verifiers is not None else ["?"] * len(evidences)
    messages = example.messages
    for ev in evidences:
        if ev.placement == "privileged":
            messages = append_privileged(messages, ev.text, header)
    prompt = render(replace(example, messages=messages))
    for ev, name in zip(evidences, names):
        if ev.placement == "in_prompt":
            prompt = remove_span(prompt, ev.text, verifier=name, example_id=example.id)
    return prompt


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

    ``1 + K_e`` forwards (plus one for ``with_joint``). ``render`` turns an example into its prompt
    string (default :func:`default_render_prompt`); it must be the renderer used for generation.
    """
    render = render or (lambda ex: default_render_prompt(ex, tokenizer))
    names = list(verifiers) if verifiers is not None else [f"reward_{k}" for k in range(len(evidences))]

    def ids_of(prompt: str) -> Tensor:
        return torch.tensor(tokenizer(prompt, add_special_tokens=False)["input_ids"], dtype=torch.long)

    completion_ids = completion_ids.to(torch.long).cpu()
    t = completion_ids.numel()
    base = completion_logits(model, ids_of(render(example)), completion_ids).unsqueeze(0)
    token_ids = completion_ids.unsqueeze(0).to(base.device)

    def counterfactual_logits(evs: list[Evidence], evs_names: list[str]) -> Tensor:
        prompt = counterfactual_prompt(example, evs, render, header, verifiers=evs_names)
        return completion_logits(model, ids_of(prompt), completion_ids).unsqueeze(0)

    def score(with_ev: Tensor, without_ev: Tensor) -> Tensor:
        return relevance_fn(kind, with_ev, without_ev, token_ids, None, chunk_size, temperature, top_k)[0]

    rows, has = [], []
    for ev, name in zip(evidences, names):
        has.append(ev is not None)
        if ev is None:
            rows.append(torch.zeros(t, device=base.device))
            continue
        other = counterfactual_logits([ev], [name])
        # in_prompt: the original prompt has the evidence; privileged: the counterfactual has it.
        rows.append(score(base, other) if ev.placement == "in_prompt" else score(other, base))
    present = [(ev, n) for ev, n in zip(evidences, names) if ev is not None]
    joint = None
    if with_joint and present:
        joint = score(base, counterfactual_logits([e for e, _ in present], [n for _, n in present]))
    ent = entropy_map(base, None, chunk_size, temperature)[0] if with_entropy else None
    relevance = torch.stack(rows) if rows else torch.zeros(0, t)
    return ReplayResult(
        relevance=relevance.float().cpu(),
        has_evidence=has,
        joint=None if joint is None else joint.cpu(),
        entropy=None if ent is None else ent.cpu(),
    )


__all__ = [
    "DEFAULT_PRIVILEGED_HEADER",
    "EvidenceNotFoundError",
    "ReplayResult",
    "append_privileged",
    "completion_logits",
    "counterfactual_prompt",
    "default_render_prompt",
    "prompt_renderer",
    "remove_span",
    "replay_completion",
]
