"""The verifier protocol shared by every task.

A verifier scores one completion for one example and may declare its *evidence*: the information
its check depends on. The trainer replays the completion with and without that evidence to learn
which tokens the reward is about (docs/design.md#step-relevance). Verifiers never raise on model output: a
malformed completion scores low (or ``None`` when the reward does not apply).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

Placement = Literal["in_prompt", "privileged"]
PLACEMENTS: tuple[str, ...] = ("in_prompt", "privileged")


@dataclass(frozen=True)
class Evidence:
    """What a verifier checks, and how the counterfactual context is built from it.

    ``in_prompt``: ``text`` occurs verbatim in the prompt the policy saw; the counterfactual
    removes it. ``privileged``: ``text`` was never shown; the counterfactual appends it under a
    fixed header.
    """

    text: str
    placement: Placement

    def __post_init__(self) -> None:
        if self.placement not in PLACEMENTS:
            raise ValueError(f"Evidence placement must be one of {PLACEMENTS}, got {self.placement!r}")
        if not isinstance(self.text, str) or not self.text.strip():
            raise ValueError("Evidence text must be a non-empty string")


#: Header under which privileged evidence is appended to the last user turn (the counterfactual's
#: reference block; a task's prompt checks may set that block aside).
DEFAULT_PRIVILEGED_HEADER = "Reference information for checking the answer:"


@dataclass
class Example:
    """One prompt of a task.

    ``messages`` are the chat messages the policy sees (system/user turns; tool schemas live in
    ``tools`` when the chat template supports them). ``gold`` holds whatever the task's verifiers
    need (gold calls, constraint arguments, gold SQL); ``meta`` is free-form provenance.
    """

    id: str
    split: str
    messages: list[dict[str, Any]]
    gold: dict[str, Any] = field(default_factory=dict)
    tools: list[dict[str, Any]] | None = None
    meta: dict[str, Any] = field(default_factory=dict)


@runtime_checkable
class Verifier(Protocol):
    """A reward: ``name``, a score ``(completion, example) -> float | None``, and its evidence."""

    name: str

    def __call__(self, completion: str, example: Example) -> float | None: ...

    def evidence(self, example: Example) -> Evidence | None: ...


__all__ = ["DEFAULT_PRIVILEGED_HEADER", "Evidence", "Example", "Placement", "PLACEMENTS", "Verifier"]
