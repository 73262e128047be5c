"""The warm start's data: ``(prompt, completion)`` text pairs for TRL's ``SFTTrainer``, from a task's
training pairs (prompts rendered exactly as RL renders them) or from the user's JSONL file, one
object per line, either

* ``{"messages": [..., {"role": "assistant", "content": answer}]}`` (the chat template renders it),
* ``{"prompt": [messages], "completion": answer or [assistant message]}``, or
* ``{"prompt": "<rendered prompt string>", "completion": "<answer string>"}`` (used as given).

Every malformed line fails with its file and line number; pairs longer than ``max_length`` tokens
are left out (TRL would cut the answer off) and none left is an error.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

__all__ = ["WarmStartError", "completion_for", "file_rows", "fit_rows", "task_rows", "text_token_ids"]


class WarmStartError(ValueError):
    """Bad warm-start settings or data; the message says what to fix."""


def completion_for(tokenizer: Any, messages: list[dict[str, Any]], prompt: str, answer: str) -> str:
    """The text that follows ``prompt`` when the chat template renders ``messages`` plus the assistant
    turn ``answer``: the answer and the template's end-of-turn (e.g. ``answer<|im_end|>``), trailing
    whitespace after the end-of-turn token dropped. Without a chat template: ``answer`` + eos."""
    eos = getattr(tokenizer, "eos_token", None) or ""
    if not getattr(tokenizer, "chat_template", None):
        return answer + eos
    full = tokenizer.apply_chat_template([*messages, {"role": "assistant", "content": answer}], tokenize=False)
    if not full.startswith(prompt):
        at = next((i for i, (a, b) in enumerate(zip(full, prompt)) if a != b), min(len(full), len(prompt)))
        raise WarmStartError(
            "the chat template does not render the prompt as the start of prompt + answer (first difference "
            f"at character {at}: {prompt[at : at + 40]!r} vs {full[at : at + 40]!r}); give rendered strings instead: "
            '{"prompt": "<rendered prompt>", "completion": "<answer>"}'
        )
    completion = full[len(prompt) :]
    if eos and completion.rstrip().endswith(eos):
        completion = completion.rstrip()
    if answer not in completion:
        raise WarmStartError("the chat template changed the answer text when rendering it; give rendered strings")
    return completion


def task_rows(task: Any, tokenizer: Any, limit: int | None = None) -> list[dict[str, str]]:
    """``[{"id", "prompt", "completion"}]`` from ``task.warm_start_pairs()`` (training split only),
    prompts rendered exactly as RL renders them (the task's ``render_prompt``)."""
    from mrtpo.counterfactual import prompt_renderer
    from mrtpo.task_base import implements

    if not implements(task, "warm_start_pairs"):
        raise WarmStartError(
            f"task {getattr(task, 'name', task)!r} has no warm start pairs of its own; "
            "give a JSONL file (warm_start: {data: <file>} or mrtpo sft --data <file>)"
        )
    render = prompt_renderer(task, tokenizer)
    rows = []
    for example, answer in task.warm_start_pairs(limit):
        if example.split != "train":
            raise WarmStartError(
                f"warm start pair {example.id!r} is from split {example.split!r}; only training items may be used"
            )
        prompt = render(example)
        rows.append(
            {
                "id": example.id,
                "prompt": prompt,
                "completion": completion_for(tokenizer, example.messages, prompt, answer),
            }
        )
    return rows


def _messages_ok(value: Any) -> bool:
    return (
        isinstance(value, list)
        and bool(value)
        and all(
            isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str) for m in value
        )
    )


def file_rows(path: str | os.PathLike, tokenizer: Any, limit: int | None = None) -> list[dict[str, str]]:
    """Rows from the user's JSONL file (the three shapes of the module docstring); clear errors."""
    path = Path(path)
    if not path.is_file():
        raise WarmStartError(f"warm start data {path} does not exist")
    rows: list[dict[str, str]] = []
    with open(path, encoding="utf-8") as fh:
        for number, line in enumerate(fh, 1):
            if not line.strip():
                continue
            where = f"{path}, line {number}"
            try:
                item = json.loads(line)
            except ValueError as exc:
                raise WarmStartError(f"{where}: not valid JSON ({exc})") from None
            if not isinstance(item, dict):
                raise WarmStartError(f"{where}: expected a JSON object, got {type(item).__name__}")
            rows.append(_row(item, tokenizer, where, f"{path.name}:{number}"))
            if limit is not None and len(rows) >= limit:
                break
    if not rows:
        raise WarmStartError(f"warm start data {path} holds no pairs")
    return rows


def _row(item: dict[str, Any], tokenizer: Any, where: str, row_id: str) -> dict[str, str]:
    shapes = (
        '{"messages": [..., {"role": "assistant", "content": ...}]}, {"prompt": [messages], "completion": ...} '
        'or {"prompt": "<rendered prompt>", "completion": "<answer>"}'
    )
    if "messages" in item:
        messages = item["messages"]
        if not _messages_ok(messages) or messages[-1]["role"] != "assistant" or len(messages) < 2:
            raise WarmStartError(
                f"{where}: messages must be a list of {{role, content}} strings ending with an "
                "assistant turn after at least one other turn"
            )
        prompt_messages, answer = messages[:-1], messages[-1]["content"]
    elif "prompt" in item and "completion" in item:
        prompt, answer = item["prompt"], item["completion"]
        if isinstance(answer, list) and _messages_ok(answer) and answer[-1]["role"] == "assistant":
            answer = answer[-1]["content"]
        if not isinstance(answer, str) or not answer.strip():
            raise WarmStartError(f"{where}: completion must be a non-empty string (or one assistant message)")
        if isinstance(prompt, str):
            if not prompt:
                raise WarmStartError(f"{where}: the prompt is empty")
            return {"id": row_id, "prompt": prompt, "completion": answer}
        if not _messages_ok(prompt):
            raise WarmStartError(f"{where}: prompt must be a rendered string or a list of {{role, content}} messages")
        prompt_messages = prompt
    else:
        raise WarmStartError(f"{where}: unknown shape (keys {sorted(item)}); expected {shapes}")
    if not answer.strip():
        raise WarmStartError(f"{where}: the assistant answer is empty")
    if getattr(tokenizer, "chat_template", None):
        prompt = tokenizer.apply_chat_template(prompt_messages, tokenize=False, add_generation_prompt=True)
    else:
        from mrtpo.tasks.toolcall.prompt import plain_prompt

        prompt = plain_prompt(prompt_messages)
    return {"id": row_id, "prompt": prompt, "completion": completion_for(tokenizer, prompt_messages, prompt, answer)}


def fit_rows(rows: list[dict[str, str]], tokenizer: Any, max_length: int) -> tuple[list[dict[str, str]], int]:
    """The rows whose prompt + completion fit ``max_length`` tokens, and how many were left out."""
    kept = [
        r
        for r in rows
        if len(tokenizer(r["prompt"] + r["completion"], add_special_tokens=False)["input_ids"]) <= max_length
    ]
    if not kept:
        raise WarmStartError(
            f"none of the {len(rows)} warm start pairs fits max_length={max_length} tokens; raise max_length"
        )
    return kept, len(rows) - len(kept)


def text_token_ids(tokenizer: Any, text: str, tags: tuple[str, ...] | list[str] = ()) -> list[int]:
    """Token ids of ``text`` with every occurrence of a ``tags`` string spelled with ordinary tokens
    (each tag is encoded as two halves, so no added token matches it); the rest is encoded as usual.
    The ids decode to ``text``."""
    if not tags:
        return tokenizer(text, add_special_tokens=False)["input_ids"]
    ids: list[int] = []
    pattern = "(" + "|".join(re.escape(t) for t in sorted(tags, key=len, reverse=True)) + ")"
    for piece in re.split(pattern, text):
        if not piece:
            continue
        if piece in tags:
            half = len(piece) // 2
            for part in (piece[:half], piece[half:]):
                ids += tokenizer(part, add_special_tokens=False)["input_ids"]
        else:
            ids += tokenizer(piece, add_special_tokens=False)["input_ids"]
    return ids
