"""Prompt construction for the tool-calling task, and the exact prompt string the policy sees.

Design choice (documented in docs/tasks/toolcall.md): the function schemas and the output-format
instruction are written into **our own system message**, and the chat template is applied to the
messages *without* its ``tools=`` argument. Reason: templates with a tools section (Qwen2.5's, for
one) add their own hard-coded ``<tool_call>`` instruction outside any message. Then removing our
format sentence (the ``format`` reward's in_prompt evidence) would leave the template's instruction
in place, and the counterfactual would not be "the prompt without the format instruction". Here
:data:`FORMAT_INSTRUCTION` is the only format instruction, it sits inside the system message's
content exactly once, and removing it leaves a well-formed prompt.

The system message mirrors the layout Qwen2.5 models were trained on (tool signatures as JSON lines
inside ``<tools></tools>``), so models see a familiar prompt. The format instruction comes last, after
the (long) tool list, so the with/without-evidence contexts share the longest possible prefix.
Function descriptions get BFCL's own Python hint (" Note that the provided function is in Python 3
syntax."), as BFCL adds it when generating for these categories.
"""

from __future__ import annotations

import json
from typing import Any

from mrtpo.verifiers import DEFAULT_PRIVILEGED_HEADER, Example

#: The call-format instruction, example included: the ``format`` reward's in-prompt evidence. It is
#: the only text of the rendered prompt that mentions ``<tool_call>`` (checked by
#: :func:`check_format_instruction`); removing it leaves a prompt without any format instruction.
FORMAT_INSTRUCTION = (
    "Respond only with the function call(s): each call is one JSON object "
    '{"name": <function-name>, "arguments": <args-json-object>} on its own line inside '
    "<tool_call></tool_call> tags, and nothing else. For example:\n"
    "<tool_call>\n"
    '{"name": "lookup_word", "arguments": {"word": "harbor", "language": "en"}}\n'
    "</tool_call>\n"
    "If none of the functions can be used, say so in plain text without a <tool_call> block."
)
PERSONA = (
    "You are an expert in composing function calls. You are given a question and a set of possible "
    "functions. Based on the question, make one or more function calls to achieve the purpose."
)
PYTHON_HINT = " Note that the provided function is in Python 3 syntax."


def system_prompt(tools: list[dict[str, Any]]) -> str:
    """The system message: persona, the tool signatures, then :data:`FORMAT_INSTRUCTION`."""
    lines = [json.dumps(tool, ensure_ascii=False) for tool in tools]
    return (
        f"{PERSONA}\n\n# Tools\n\n"
        "You are provided with function signatures within <tools></tools> XML tags:\n"
        "<tools>\n" + "\n".join(lines) + "\n</tools>\n\n" + FORMAT_INSTRUCTION
    )


def with_python_hint(tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Tools whose descriptions carry BFCL's Python-syntax hint (returns new dicts)."""
    out = []
    for tool in tools:
        fn = dict(tool["function"])
        fn["description"] = str(fn.get("description", "")) + PYTHON_HINT
        out.append({**tool, "function": fn})
    return out


def build_messages(question: list[dict[str, Any]], tools: list[dict[str, Any]]) -> list[dict]:
    """System message (ours, plus any system message BFCL's question carries) and the user turn(s)."""
    system = system_prompt(tools)
    rest = [dict(m) for m in question]
    if rest and rest[0].get("role") == "system":
        system = system + "\n\n" + str(rest.pop(0).get("content", ""))
    return [{"role": "system", "content": system}] + rest


def plain_prompt(messages: list[dict[str, Any]]) -> str:
    """Fallback rendering for tokenizers without a chat template."""
    parts = [f"{str(m.get('role', 'user')).capitalize()}:\n{m.get('content', '')}" for m in messages]
    return "\n\n".join(parts) + "\n\nAssistant:\n"


def _fold_system_into_user(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    if not messages or messages[0].get("role") != "system":
        return messages
    system, rest = messages[0], [dict(m) for m in messages[1:]]
    if rest and rest[0].get("role") == "user":
        rest[0]["content"] = f"{system['content']}\n\n{rest[0].get('content', '')}"
        return rest
    return [{"role": "user", "content": system["content"]}] + rest


def render_prompt(example: Example, tokenizer: Any = None) -> str:
    """The exact prompt string the policy sees for ``example``.

    With a chat template: ``tokenizer.apply_chat_template(messages, tokenize=False,
    add_generation_prompt=True)``, deliberately *without* ``tools=`` (see the module docstring).
    Templates that reject a system role get the system text folded into the first user turn.
    Without a tokenizer or chat template: :func:`plain_prompt`.
    """
    messages = example.messages
    if tokenizer is None or not getattr(tokenizer, "chat_template", None):
        return plain_prompt(messages)
    try:
        out = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    except Exception as first_error:  # noqa: BLE001 - e.g. "System role not supported"
        try:
            out = tokenizer.apply_chat_template(
                _fold_system_into_user(messages), tokenize=False, add_generation_prompt=True
            )
        except Exception as exc:
            raise ValueError(
                f"the tokenizer's chat template cannot render example {example.id!r}: "
                f"{first_error}; with the system message folded into the user turn: {exc}"
            ) from exc
    if not isinstance(out, str):
        raise TypeError(f"apply_chat_template returned {type(out).__name__}, expected str (tokenize=False)")
    return out


class FormatInstructionError(ValueError):
    """The rendered prompt lacks the call-format instruction, holds it twice, or holds another
    ``<tool_call>`` instruction besides it (the ``format`` replay would then be wrong)."""


def check_format_instruction(
    rendered: str, instruction: str, example_id: str = "?", expected: int = 1, references: tuple[str, ...] = ()
) -> None:
    """Raise :class:`FormatInstructionError` unless ``instruction`` occurs ``expected`` times (1, or 0
    for a prompt with the instruction removed) in ``rendered`` and no ``<tool_call>`` /
    ``</tool_call>`` tag is left outside it and the ``references`` (privileged reference blocks a
    counterfactual appended: the gold calls, written in the instructed form).

    This is what makes the ``format`` reward's counterfactual meaningful: the prompt without the
    instruction must carry no other call-format instruction (a chat template given ``tools=`` adds
    its own, for one).
    """
    count = rendered.count(instruction)
    if count != expected:
        where = "does not occur" if count == 0 else f"occurs {count} times"
        raise FormatInstructionError(
            f"example {example_id!r}: the call-format instruction (the format reward's evidence) {where} "
            f"in the rendered prompt; it must occur {'exactly once' if expected == 1 else expected}. Build the "
            f"messages with build_messages() and render without tools= (instruction starts {instruction[:60]!r})"
        )
    rest = rendered.replace(instruction, "")
    for reference in references:
        rest = rest.replace(reference, "")
    for tag in ("<tool_call>", "</tool_call>"):
        if tag in rest:
            at = rest.index(tag)
            raise FormatInstructionError(
                f"example {example_id!r}: the rendered prompt mentions {tag} outside the call-format "
                f"instruction (near {rest[max(0, at - 60) : at + 20]!r}); removing the instruction would "
                "leave another format instruction in place. Render without the chat template's tools= "
                "section and keep every call-format hint inside the instruction"
            )


def render_checked(example: Example, tokenizer: Any = None) -> str:
    """:func:`render_prompt`, checked by :func:`check_format_instruction`: the example's instruction
    (``meta["format_instruction"]``, else :data:`FORMAT_INSTRUCTION`) appears in the rendered text as
    often as in the messages (once; zero in a counterfactual with it removed, never more), and no
    other ``<tool_call>`` text does, except in a reference block appended under
    :data:`~mrtpo.verifiers.DEFAULT_PRIVILEGED_HEADER` (the ``correctness`` counterfactual's gold calls)."""
    instruction = example.meta.get("format_instruction", FORMAT_INSTRUCTION)
    in_messages = sum(m["content"].count(instruction) for m in example.messages if isinstance(m.get("content"), str))
    if in_messages > 1:
        raise FormatInstructionError(
            f"example {example.id!r}: the call-format instruction occurs {in_messages} times in the "
            "messages; it must occur exactly once"
        )
    references = tuple(
        m["content"][m["content"].index(DEFAULT_PRIVILEGED_HEADER) :]
        for m in example.messages
        if isinstance(m.get("content"), str) and DEFAULT_PRIVILEGED_HEADER in m["content"]
    )
    text = render_prompt(example, tokenizer)
    check_format_instruction(text, instruction, example.id, expected=in_messages, references=references)
    return text


__all__ = [
    "FORMAT_INSTRUCTION",
    "FormatInstructionError",
    "check_format_instruction",
    "render_checked",
    "build_messages",
    "plain_prompt",
    "render_prompt",
    "system_prompt",
    "with_python_hint",
]
