"""What every gym family shares: a verifier that also knows its ground truth, and the task shape.

A :class:`GymVerifier` is an ordinary :class:`mrtpo.verifiers.Verifier` (name, score, evidence)
plus ``positions(words, example)``: the *ground-truth relevant positions* of a response — the token
indices where the reward is decided (where a required word occurs, the first word, the first wrong
item, a wrong argument value, the end-of-turn token for a length rule). Gym responses are word
sequences and gym tokens are words, so these are token indices of the completion; index
``len(words)`` is the end-of-turn token.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from mrtpo.verifiers import Evidence, Example

Words = list[str]


@dataclass(frozen=True)
class GymVerifier:
    """One reward of a gym family: ``score(words, example)``, its evidence and its ground truth."""

    name: str
    score_words: Callable[[Words, Example], float | None]
    evidence_of: Callable[[Example], Evidence | None]
    positions_of: Callable[[Words, Example], list[int]]

    def __call__(self, completion: str, example: Example) -> float | None:
        return self.score_words(completion.split(), example)

    def evidence(self, example: Example) -> Evidence | None:
        return self.evidence_of(example)

    def positions(self, words: Words, example: Example) -> list[int]:
        """Ground-truth relevant token positions of ``words`` (index ``len(words)`` = end of turn)."""
        return sorted(set(self.positions_of(words, example)))


def occurrences(words: Sequence[str], word: str) -> list[int]:
    """Indices of ``word`` in ``words``."""
    return [i for i, w in enumerate(words) if w == word]


def user_prompt(*parts: str) -> list[dict[str, str]]:
    """One user message made of clause strings joined by single spaces."""
    return [{"role": "user", "content": " ".join(p for p in parts if p)}]


def example_rng(seed: int, split: str, index: int) -> random.Random:
    """A private RNG per (seed, split, index): examples do not depend on how many were drawn before."""
    return random.Random(f"{seed}/{split}/{index}")


__all__ = ["GymVerifier", "Words", "example_rng", "occurrences", "user_prompt"]
