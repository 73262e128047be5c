"""Counterfactual prompts: a reward's evidence removed from, or appended to, the rendered prompt.

For each reward with evidence the replay (:mod:`mrtpo.replay`) needs two contexts that differ only
in that evidence:

- ``in_prompt``: the original prompt (*with*) and the prompt with the evidence span removed
  (*without*), cut so that the rest of the prompt reads as if written without it (:func:`cut`);
- ``privileged``: the original prompt (*without*) and the prompt with the evidence appended to the
  last user turn under a fixed header (*with*).

Pure text bookkeeping: no model here; which counterfactuals a replay needs is decided in
:mod:`mrtpo.replay_plan`. An ``in_prompt`` span that is not in the rendered
prompt exactly once is an error (:class:`EvidenceNotFoundError`), never a silent no-op.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from mrtpo.verifiers import DEFAULT_PRIVILEGED_HEADER, Evidence, Example


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
    separator = max(before[len(core_before) :], after[: len(after) - len(core_after)], key=_strength)
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


def decoy_text(
    prompt: str | list[dict[str, Any]],
    own: Evidence,
    decoy: Evidence,
    render: Callable[[list[dict[str, Any]]], str],
    header: str = DEFAULT_PRIVILEGED_HEADER,
    *,
    verifier: str = "?",
    example_id: str = "?",
) -> str:
    """The prompt as if its reward's evidence were ``decoy`` (another example's evidence for that reward).

    ``in_prompt``: the ``own`` span (which must occur exactly once in the rendered prompt) replaced
    by the decoy's text, inside its message when one message holds it; ``privileged``: the decoy
    appended under ``header`` where the own evidence would be. The contrastive relevance compares the
    response's reaction to this context with its reaction to its own evidence (:mod:`mrtpo.replay_plan`).
    """
    if own.placement == "privileged":
        return counterfactual_text(
            prompt, [Evidence(decoy.text, "privileged")], render, header, verifiers=[verifier], example_id=example_id
        )
    if isinstance(prompt, str):
        _require_once(prompt, own.text, verifier, example_id)
        return prompt.replace(own.text, decoy.text)
    messages = [dict(m) for m in prompt]
    rendered = render(messages)
    _require_once(rendered, own.text, verifier, example_id)
    index = _message_holding(messages, own.text)
    if index is None:
        return rendered.replace(own.text, decoy.text)
    messages[index] = {**messages[index], "content": messages[index]["content"].replace(own.text, decoy.text)}
    return render(messages)


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
    return counterfactual_text(
        example.messages,
        evidences,
        lambda msgs: render(replace(example, messages=msgs)),
        header,
        verifiers=verifiers,
        example_id=example.id,
    )


__all__ = [
    "DEFAULT_PRIVILEGED_HEADER",
    "EvidenceNotFoundError",
    "PromptRenderer",
    "append_privileged",
    "counterfactual_prompt",
    "counterfactual_text",
    "cut",
    "decoy_text",
    "default_render_prompt",
    "prompt_renderer",
    "remove_span",
]
