"""Tool calling on BFCL v4 (``mrtpo --task toolcall``); see docs/tasks/toolcall.md.

Splits: **train** = ``live_simple`` + ``live_multiple``; **eval** = ``simple_python``, ``multiple``,
``parallel``, ``parallel_multiple``, ``irrelevance`` (BFCL's non-live categories). Train items
whose user question also occurs (whitespace- and case-normalised) in an eval category are dropped,
so no question is in both splits.

Order (deterministic): within a category, file order; categories are interleaved by relative
position: item ``i`` of a category of size ``n`` sorts by ``(i / n, category order)``. Every prefix
(``limit=k``) is therefore a proportional sample of all the split's categories.

Modules: ``data`` (reading BFCL files), ``prompt`` (system prompt, :func:`render_prompt`),
``parse`` (completion → calls), ``verifiers`` (``format``, ``correctness``), ``evaluate`` (BFCL's
AST checker), ``bfcl_shim`` (importing the checker without vendor SDKs).
"""

from __future__ import annotations

from typing import Any

from mrtpo.task_base import Task
from mrtpo.tasks import register_task
from mrtpo.tasks.toolcall import spans as _spans
from mrtpo.tasks.toolcall.data import (
    EVAL_CATEGORIES,
    SUPPORTED_CATEGORIES,
    TRAIN_CATEGORIES,
    expects_no_call,
    load_category,
    to_openai_tools,
    user_text,
)
from mrtpo.tasks.toolcall.evaluate import check_item, evaluate_outputs
from mrtpo.tasks.toolcall.parse import ParseResult, ToolCall, parse_completion
from mrtpo.tasks.toolcall.prompt import (
    FORMAT_INSTRUCTION,
    FormatInstructionError,
    build_messages,
    check_format_instruction,
    render_checked,
    render_prompt,
    with_python_hint,
)
from mrtpo.tasks.toolcall.verifiers import (
    CorrectnessVerifier,
    FormatVerifier,
    canonical_gold,
    gold_calls,
    render_tool_calls,
    toolrl_score,
)
from mrtpo.verifiers import Example, Verifier

SPLITS = ("train", "eval")


def _interleave(groups: list[list[Any]]) -> list[Any]:
    keyed = [((i / len(group), g), item) for g, group in enumerate(groups) for i, item in enumerate(group)]
    return [item for _, item in sorted(keyed, key=lambda pair: pair[0])]


def make_example(entry: dict[str, Any], split: str) -> Example:
    """One BFCL entry (from :func:`~mrtpo.tasks.toolcall.data.load_category`) as an Example."""
    tools = with_python_hint(to_openai_tools(entry["functions"]))
    category = entry["category"]
    return Example(
        id=entry["id"],
        split=split,
        messages=build_messages(entry["messages"], tools),
        gold={"ground_truth": entry["ground_truth"], "expects_call": not expects_no_call(category)},
        tools=tools,
        meta={
            "category": category,
            "functions": entry["functions"],  # BFCL's original docs, for its checker
            "format_instruction": FORMAT_INSTRUCTION,
            "tools_in_system_prompt": True,
        },
    )


@register_task("toolcall")
class ToolCallTask(Task):
    """BFCL v4 tool calling: ``format`` and ``correctness`` rewards, BFCL AST evaluation."""

    name = "toolcall"

    def __init__(
        self,
        train_categories: tuple[str, ...] | list[str] = TRAIN_CATEGORIES,
        eval_categories: tuple[str, ...] | list[str] = EVAL_CATEGORIES,
        call_when_none_expected: float = 0.0,
    ) -> None:
        self.train_categories = tuple(train_categories)
        self.eval_categories = tuple(eval_categories)
        for cat in self.train_categories + self.eval_categories:
            if cat not in SUPPORTED_CATEGORIES:
                raise ValueError(f"unknown BFCL category {cat!r}; supported: {', '.join(SUPPORTED_CATEGORIES)}")
        both = set(self.train_categories) & set(self.eval_categories)
        if both:
            raise ValueError(f"categories in both train and eval: {sorted(both)}")
        self.call_when_none_expected = call_when_none_expected
        self._cache: dict[str, list[Example]] = {}

    def _build(self, split: str) -> list[Example]:
        categories = self.train_categories if split == "train" else self.eval_categories
        groups = [load_category(cat) for cat in categories]
        if split == "train":
            held_out = {user_text(e["messages"]) for cat in self.eval_categories for e in load_category(cat)}
            groups = [[e for e in g if user_text(e["messages"]) not in held_out] for g in groups]
        return [make_example(entry, split) for entry in _interleave(groups)]

    def load(self, split: str, limit: int | None = None) -> list[Example]:
        """Examples of ``split`` ("train" or "eval") in the documented order; first ``limit``.

        The Example objects are built once per task instance and shared between calls: copy one
        before modifying it.
        """
        if split not in SPLITS:
            raise ValueError(f"unknown split {split!r}; the toolcall task has {SPLITS}")
        if limit is not None and (not isinstance(limit, int) or limit < 0):
            raise ValueError(f"limit must be a non-negative int or None, got {limit!r}")
        if split not in self._cache:
            self._cache[split] = self._build(split)
        examples = self._cache[split]
        return list(examples if limit is None else examples[:limit])

    def verifiers(self) -> list[Verifier]:
        """``[format, correctness]``, the columns of R[N, K] in this order."""
        return [FormatVerifier(), CorrectnessVerifier(self.call_when_none_expected)]

    def evaluate(self, outputs: list[str], examples: list[Example]) -> dict[str, Any]:
        """BFCL AST accuracy per category, overall, and the format rate (JSON-serialisable)."""
        return evaluate_outputs(outputs, examples)

    def warm_start_pairs(self, limit: int | None = None) -> list[tuple[Example, str]]:
        """``(example, answer)`` pairs for the supervised warm start (:mod:`mrtpo.warm_start`): training
        split only, items with a gold call, the answer being one correct call set in the instructed
        ``<tool_call>`` form (first acceptable value of each parameter). Eval items never appear."""
        pairs = []
        for example in self.load("train"):
            calls = canonical_gold(example.gold.get("ground_truth", []), example.meta.get("functions"))
            if calls:
                pairs.append((example, render_tool_calls(calls)))
            if limit is not None and len(pairs) >= limit:
                break
        return pairs

    def warm_start_identity(self) -> dict[str, Any]:
        """What the warm start's pairs depend on (part of its cache key)."""
        import hashlib

        from mrtpo.tasks.toolcall import prompt as _prompt

        text = _prompt.FORMAT_INSTRUCTION + _prompt.PERSONA + _prompt.PYTHON_HINT + _prompt.system_prompt([])
        return {
            "train_categories": list(self.train_categories),
            "eval_categories": list(self.eval_categories),
            "prompt_sha256": hashlib.sha256(text.encode()).hexdigest(),
        }

    def may_have_checked_spans(self, example: Example) -> bool:
        """Items with a gold call: their argument values can be checked spans (``mrtpo bench lift``)."""
        return bool(gold_calls(example.gold.get("ground_truth", [])))

    def checked_spans(self, example: Example, text: str) -> list[tuple[str, str, list[tuple[int, int]]]]:
        """Where ``correctness`` reads ``text`` (:mod:`.spans`), for ``mrtpo bench lift``."""
        return _spans.checked_spans(example, text, [v.name for v in self.verifiers()])

    @staticmethod
    def render_prompt(example: Example, tokenizer: Any = None) -> str:
        """The exact prompt string for ``example`` (see :func:`prompt.render_prompt`), checked to hold
        the call-format instruction once and no other ``<tool_call>`` instruction
        (:func:`prompt.check_format_instruction`; :class:`FormatInstructionError` otherwise).

        Training (TRL's rendering is compared with this one), the replays, ``mrtpo eval`` and the
        warm start's data all render through here."""
        return render_checked(example, tokenizer)


__all__ = [
    "EVAL_CATEGORIES",
    "FORMAT_INSTRUCTION",
    "TRAIN_CATEGORIES",
    "FormatInstructionError",
    "check_format_instruction",
    "CorrectnessVerifier",
    "FormatVerifier",
    "ParseResult",
    "ToolCall",
    "ToolCallTask",
    "canonical_gold",
    "check_item",
    "evaluate_outputs",
    "make_example",
    "parse_completion",
    "render_prompt",
    "render_tool_calls",
    "toolrl_score",
]
