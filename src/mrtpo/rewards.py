"""Reward functions with evidence, in TRL's reward-function interface.

Two ways to give a reward its evidence:

- decorate an ordinary TRL reward function::

      @evidence("constraint_sentence", placement="in_prompt")   # a dataset column, or a callable(row)
      def no_commas(completions, **kwargs):
          return [float("," not in c) for c in completions]

- wrap a task's :class:`~mrtpo.verifiers.Verifier` with :class:`VerifierReward`, which looks the
  example up by the dataset's ``example_id`` column.

The trainer asks :func:`evidence_for` for each (reward, dataset row) pair; a reward without
declared evidence gets uniform token weights.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from mrtpo.verifiers import PLACEMENTS, Evidence, Example, Verifier

EVIDENCE_ATTR = "mrtpo_evidence"


@dataclass(frozen=True)
class EvidenceSpec:
    """Where a reward's evidence comes from: a dataset column name or ``callable(row) -> str | None``."""

    source: str | Callable[[Mapping[str, Any]], str | None]
    placement: str

    def resolve(self, row: Mapping[str, Any]) -> Evidence | None:
        if callable(self.source):
            text = self.source(row)
        else:
            if self.source not in row:
                raise KeyError(
                    f"evidence column {self.source!r} is not in the dataset row (columns: {sorted(row)})"
                )
            text = row[self.source]
        if text is None or (isinstance(text, str) and not text.strip()):
            return None
        return Evidence(str(text), self.placement)  # type: ignore[arg-type]


def evidence(source: str | Callable[[Mapping[str, Any]], str | None], placement: str = "in_prompt"):
    """Decorator declaring a TRL reward function's evidence (see the module docstring)."""
    if placement not in PLACEMENTS:
        raise ValueError(f"placement must be one of {PLACEMENTS}, got {placement!r}")

    def wrap(fn):
        setattr(fn, EVIDENCE_ATTR, EvidenceSpec(source, placement))
        return fn

    return wrap


def completion_text(completion: Any) -> str:
    """TRL passes a completion as a string, or as messages for conversational prompts."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, list) and completion and isinstance(completion[-1], Mapping):
        return str(completion[-1].get("content", ""))
    return str(completion)


class VerifierReward:
    """A task verifier as a TRL reward function; its evidence comes from the verifier itself.

    ``examples`` maps ``example_id`` → :class:`Example`; the dataset must carry that column.
    """

    def __init__(self, verifier: Verifier, examples: Mapping[str, Example]):
        self.verifier = verifier
        self.examples = examples
        self.__name__ = verifier.name

    def _example(self, example_id: str) -> Example:
        try:
            return self.examples[example_id]
        except KeyError:
            raise KeyError(f"reward {self.__name__!r}: no example with id {example_id!r}") from None

    def __call__(self, prompts=None, completions=None, example_id=None, **kwargs) -> list[float | None]:
        if example_id is None:
            raise ValueError(f"reward {self.__name__!r} needs the dataset column 'example_id'")
        return [self.verifier(completion_text(c), self._example(i)) for c, i in zip(completions, example_id)]

    def evidence_for(self, row: Mapping[str, Any]) -> Evidence | None:
        return self.verifier.evidence(self._example(row["example_id"]))


def evidence_for(reward_func: Any, row: Mapping[str, Any]) -> Evidence | None:
    """The evidence ``reward_func`` declares for this dataset row (None: uniform weights)."""
    if isinstance(reward_func, VerifierReward):
        return reward_func.evidence_for(row)
    spec = getattr(reward_func, EVIDENCE_ATTR, None)
    return spec.resolve(row) if spec is not None else None


def declares_evidence(reward_func: Any) -> bool:
    return isinstance(reward_func, VerifierReward) or getattr(reward_func, EVIDENCE_ATTR, None) is not None


__all__ = [
    "EvidenceSpec",
    "VerifierReward",
    "completion_text",
    "declares_evidence",
    "evidence",
    "evidence_for",
]
