"""One reward per constraint slot: ``constraint_1`` .. ``constraint_5``.

Slot k scores the k-th constraint of the example (in prompt order) with its checker: 1.0 when
followed (strict, as the benchmarks' strict accuracy; ``mode="loose"`` uses the loose variants),
0.0 otherwise, and ``None`` when the example has fewer than k constraints or the constraint
cannot be verified offline (``checkers.UNVERIFIABLE``). Evidence: the constraint's own sentence,
``in_prompt`` (it occurs verbatim once in the prompt; removing it leaves the rest intact).
Benchmark prompts record no sentence, so their slots declare no evidence.
"""

from __future__ import annotations

from typing import Any

from mrtpo.tasks.instructions import checkers
from mrtpo.verifiers import Evidence, Example

__all__ = ["ConstraintVerifier", "slot_verifiers", "MAX_SLOTS", "MODES"]

MAX_SLOTS = 5
MODES = ("strict", "loose")


def _text(completion: Any) -> str | None:
    """The completion's text: a string, or the last message's content of a chat completion."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, list) and completion and isinstance(completion[-1], dict):
        content = completion[-1].get("content")
        return content if isinstance(content, str) else None
    return None


class ConstraintVerifier:
    """The reward of constraint slot ``slot`` (1-based)."""

    def __init__(self, slot: int, mode: str = "strict") -> None:
        if not 1 <= slot <= MAX_SLOTS:
            raise ValueError(f"slot must be in 1..{MAX_SLOTS}, got {slot}")
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        self.slot = slot
        self.mode = mode
        self.name = f"constraint_{slot}"

    def constraint(self, example: Example) -> dict[str, Any] | None:
        """This slot's constraint record, or ``None`` when the example has fewer constraints."""
        constraints = (example.gold or {}).get("constraints")
        if constraints is None:
            raise ValueError(
                f"example {example.id!r} has no gold['constraints']; build examples with "
                "mrtpo.tasks.instructions (generate or data loaders)"
            )
        return constraints[self.slot - 1] if len(constraints) >= self.slot else None

    def __call__(self, completion: Any, example: Example) -> float | None:
        """1.0 / 0.0 / None (see module doc). A bad example (unknown constraint id) raises."""
        c = self.constraint(example)
        if c is None or (c["benchmark"], c["id"]) in checkers.UNVERIFIABLE:
            return None
        text = _text(completion)
        if text is None:
            return 0.0
        prompt = example.gold.get("prompt") or example.messages[-1]["content"]
        check = checkers.check_strict if self.mode == "strict" else checkers.check_loose
        return 1.0 if check(c["benchmark"], c["id"], c["kwargs"], text, prompt) else 0.0

    def evidence(self, example: Example) -> Evidence | None:
        c = self.constraint(example)
        if c is None or not c.get("sentence"):
            return None
        return Evidence(c["sentence"], "in_prompt")

    def __repr__(self) -> str:
        return f"ConstraintVerifier(slot={self.slot}, mode={self.mode!r})"


def slot_verifiers(mode: str = "strict") -> list[ConstraintVerifier]:
    """The five slot verifiers, in order (the reward columns)."""
    return [ConstraintVerifier(k, mode) for k in range(1, MAX_SLOTS + 1)]
