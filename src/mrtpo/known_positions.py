"""The token positions a task knows each reward reads: what the ``oracle`` credit method weights.

Two sources, per reward:

- a gym verifier's ground truth (``verifier.positions(words, example)``, :class:`mrtpo.gym.base.GymVerifier`):
  gym tokens are words, so its word indices are the indices of the completion's non-special tokens
  (:func:`word_tokens`; ``len(words)`` = the token after the last word, the end of turn);
- a real task's checked spans (``task.checked_spans(example, text)``: the keyword, title, end phrase or
  SQL fence its checker reads, as ``mrtpo bench lift`` finds them): the tokens whose characters
  overlap a span of that reward (:func:`mrtpo.credit.lift.char_spans_to_tokens` over :func:`token_offsets`).

A reward with neither gets no known position (the oracle then weighs it uniformly).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor

from mrtpo.credit.lift import char_spans_to_tokens
from mrtpo.verifiers import Example

#: ``checked_spans(example, text) -> [(reward name, kind, [(start, end), ...]), ...]`` of a task.
SpansOf = Callable[[Example, str], list[tuple[str, str, list[tuple[int, int]]]]]


def token_offsets(tokenizer, ids: list[int]) -> list[tuple[int, int]]:
    """Character range ``[start, end)`` of each token in ``tokenizer.decode(ids, skip_special_tokens=True)``.

    From the lengths of the decoded prefixes (kept non-decreasing: a prefix that ends inside a
    multi-byte character decodes to a replacement character first). Special tokens get empty ranges.
    """
    offsets, previous = [], 0
    for i in range(len(ids)):
        end = max(previous, len(tokenizer.decode(ids[: i + 1], skip_special_tokens=True)))
        offsets.append((previous, end))
        previous = end
    return offsets


def word_tokens(ids: Sequence[int], tokenizer=None) -> list[int]:
    """Token index of each word of a gym completion's decoded text, then of the token after the last
    word (the end of turn): the special tokens a policy may emit mid-response are not in the text the
    verifier reads. Without a tokenizer every token is a word."""
    special = set(getattr(tokenizer, "all_special_ids", ()) or ())
    words = [t for t, i in enumerate(ids) if i not in special]
    return words + [words[-1] + 1 if words else 0]


def knows_positions(verifier: Any, spans_of: SpansOf | None = None) -> bool:
    """Whether a reward's known positions can be found: a gym verifier, or a task with checked spans."""
    return callable(getattr(verifier, "positions", None)) or spans_of is not None


def known_position_mask(
    verifiers: Sequence[Any],
    examples: Sequence[Example],
    texts: Sequence[str],
    ids: Sequence[Sequence[int]],
    width: int,
    tokenizer=None,
    spans_of: SpansOf | None = None,
) -> Tensor:
    """``(B, K, T)`` float32: 1 where completion ``b`` holds a token that reward ``k`` is known to read.

    ``verifiers`` ``K``; per completion ``b``: its prompt's ``examples[b]``, decoded ``texts[b]`` and
    token ``ids[b]`` (with the end-of-turn token, without padding); ``T`` = ``width``. ``tokenizer``:
    tells special tokens from words (gym) and decodes offsets (checked spans, which need ``spans_of``).
    """
    mask = torch.zeros(len(texts), len(verifiers), width)
    for b, (example, text, row) in enumerate(zip(examples, texts, ids)):
        length = min(len(row), width)
        spans = None
        for k, verifier in enumerate(verifiers):
            if verifier is None:
                continue
            if callable(getattr(verifier, "positions", None)):
                at = word_tokens(row[:length], tokenizer)
                for p in verifier.positions(text.split(), example):
                    if p < len(at) and at[p] < length:
                        mask[b, k, at[p]] = 1.0
                continue
            if spans_of is None:
                continue
            if spans is None:
                if tokenizer is None:
                    raise ValueError("known positions from checked spans need the tokenizer")
                spans = spans_of(example, text)
                offsets = token_offsets(tokenizer, list(row[:length]))
            for name, _, char_spans in spans:
                if name == verifier.name:
                    mask[b, k, :length] = torch.maximum(
                        mask[b, k, :length], char_spans_to_tokens(offsets, char_spans).float()
                    )
    return mask


__all__ = ["SpansOf", "known_position_mask", "knows_positions", "token_offsets", "word_tokens"]
