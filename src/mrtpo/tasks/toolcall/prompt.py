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

from mrtpo.verifiers import Example

FORMAT_INSTRUCTION = (
    "Respond with the function call(s) inside one <tool_call></tool_call> block, one JSON object "
    '{"name": <function-name>, "arguments": <args-json-object>} per line, and nothing else. '
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
        raise TypeError(
            f"apply_chat_template returned {type(out).__name__}, expected str (tokenize=False)"
        )
    return out


__all__ = [
    "FORMAT_INSTRUCTION",
    "build_messages",
    "plain_prompt",
    "render_prompt",
    "system_prompt",
    "with_python_hint",
]
