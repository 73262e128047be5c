"""Privileged-answer family (the SQL shape): transform the prompt's items, inside a required wrapper.

Prompt: ``items : owl red pie rome . op : reverse . format : answer inside <ans> </ans> .``
Gold response: ``<ans> rome pie red owl </ans>``. Operations: ``copy``, ``reverse``, ``keep
<category>`` (the items of one category, in order).

======  ========================================  =============================  ====================================
reward  checks                                    evidence                       relevant positions
======  ========================================  =============================  ====================================
format  one ``<ans>`` first, one ``</ans>`` last  the format clause (in prompt)  first and last word, any stray
                                                                                 wrapper word
valid   every answer word is one of the items     the items clause (in prompt)   the non-item words; if none, every
                                                                                 answer word
result  the answer equals the gold list           the gold answer (privileged)   the first wrong position; if right,
                                                                                 every answer word
======  ========================================  =============================  ====================================

``valid`` plays the role of SQL's ``executes`` (its evidence, the item list, is like the schema) and
``result`` that of the gold-result match. The answer words are the words that are not wrapper words
(``<ans>``, ``</ans>``, ``[``, ``]``).
"""

from __future__ import annotations

import random

from mrtpo.gym.base import GymVerifier, Words, occurrences, user_prompt
from mrtpo.gym.vocab import CATEGORIES, CONTENT
from mrtpo.verifiers import Evidence, Example

OPEN, CLOSE = "<ans>", "</ans>"
FORMAT_CLAUSE = f"format : answer inside {OPEN} {CLOSE} ."
OPS: tuple[str, ...] = ("copy", "reverse", "keep")


def gold_answer(items: list[str], op: str, category: str | None = None) -> list[str]:
    """The gold list of an operation."""
    if op == "copy":
        return list(items)
    if op == "reverse":
        return list(reversed(items))
    if op == "keep":
        return [w for w in items if w in CATEGORIES[category]]
    raise ValueError(f"unknown op {op!r}")


#: Words that wrap an answer (the required pair and the demonstrator's wrong bracket style).
WRAPPERS = (OPEN, CLOSE, "[", "]")


def answer_words(words: Words) -> list[tuple[int, str]]:
    """``(position, word)`` of every word that is not a wrapper word: ``valid`` and ``result`` read
    the answer whatever its wrapping, as SQL's ``executes`` reads the query whatever its fence."""
    return [(i, w) for i, w in enumerate(words) if w not in WRAPPERS]


def _op_text(gold: dict) -> str:
    return f"op : {gold['op']}" + (f" {gold['category']} ." if gold["op"] == "keep" else " .")


def make_example(rng: random.Random, example_id: str, split: str, *, num_items: int) -> Example:
    """``num_items`` distinct content words and an operation (``keep`` keeps at least one item)."""
    op = rng.choice(OPS)
    category = rng.choice(sorted(CATEGORIES)) if op == "keep" else None
    while True:
        items = rng.sample(CONTENT, num_items)
        if category is None or any(w in CATEGORIES[category] for w in items):
            break
    gold = {"items": items, "op": op, "category": category, "answer": gold_answer(items, op, category)}
    gold["items_text"] = f"items : {' '.join(items)} ."
    messages = user_prompt(gold["items_text"], _op_text(gold), FORMAT_CLAUSE)
    return Example(id=example_id, split=split, messages=messages, gold=gold)


def format_ok(words: Words) -> bool:
    return (
        len(words) >= 2
        and words[0] == OPEN
        and words[-1] == CLOSE
        and len(occurrences(words, OPEN)) == 1
        and len(occurrences(words, CLOSE)) == 1
    )


def valid_ok(words: Words, items: list[str]) -> bool:
    inner = answer_words(words)
    return bool(inner) and all(w in items for _, w in inner)


def first_wrong(words: Words, gold: list[str]) -> int | None:
    """Position of the first answer word that differs from the gold list (or where the answer should
    have continued or stopped); ``None`` when the answer is right."""
    inner = answer_words(words)
    for (i, w), g in zip(inner, gold):
        if w != g:
            return i
    if len(inner) == len(gold):
        return None
    if len(inner) > len(gold):
        return inner[len(gold)][0]
    return inner[-1][0] + 1 if inner else 0  # the word after the last answer word (or the start)


def verifiers() -> list[GymVerifier]:
    def fmt_positions(words: Words, ex: Example) -> list[int]:
        return [0, max(len(words) - 1, 0), *occurrences(words, OPEN), *occurrences(words, CLOSE)]

    def valid_positions(words: Words, ex: Example) -> list[int]:
        inner = answer_words(words)
        bad = [i for i, w in inner if w not in ex.gold["items"]]
        return bad or [i for i, _ in inner]

    def result_positions(words: Words, ex: Example) -> list[int]:
        at = first_wrong(words, ex.gold["answer"])
        return [at] if at is not None else [i for i, _ in answer_words(words)]

    return [
        GymVerifier(
            "format", lambda w, ex: float(format_ok(w)), lambda ex: Evidence(FORMAT_CLAUSE, "in_prompt"), fmt_positions
        ),
        GymVerifier(
            "valid",
            lambda w, ex: float(valid_ok(w, ex.gold["items"])),
            lambda ex: Evidence(ex.gold["items_text"], "in_prompt"),
            valid_positions,
        ),
        GymVerifier(
            "result",
            lambda w, ex: float(first_wrong(w, ex.gold["answer"]) is None),
            lambda ex: Evidence(" ".join(ex.gold["answer"]), "privileged"),
            result_positions,
        ),
    ]


def demonstrate(
    example: Example,
    rng: random.Random,
    p_follow: float,
    show_format: bool = True,
    show_items: bool = True,
    reference: bool = False,
) -> Words:
    """The noisy demonstrator. Each of format / valid / result is kept with probability ``p_follow``;
    a hidden clause is not followed (no wrapper without the format clause, guesses without the items);
    with the gold answer shown as a reference (``reference``) the answer is always right."""
    gold = example.gold
    answer = list(gold["answer"])
    if not show_items:
        answer = rng.sample(CONTENT, len(gold["items"]))
    elif not reference and rng.random() >= p_follow:  # a wrong answer: valid with probability p_follow
        if rng.random() < p_follow:
            others = [w for w in gold["items"] if w not in answer]
            if len(answer) >= 2 and rng.random() < 0.5:
                i = rng.randrange(len(answer) - 1)
                answer[i], answer[i + 1] = answer[i + 1], answer[i]
            elif others:
                answer.insert(rng.randrange(len(answer) + 1), rng.choice(others))
            else:
                answer.pop(rng.randrange(len(answer)))
        else:
            outside = [w for w in CONTENT if w not in gold["items"]]
            answer[rng.randrange(len(answer))] = rng.choice(outside)
    if not answer:
        answer = [rng.choice(gold["items"])]
    if show_format and rng.random() < p_follow:
        return [OPEN, *answer, CLOSE]
    style = rng.random()
    if style < 0.4:
        return answer
    if style < 0.7:
        return ["[", *answer, "]"]
    return [OPEN, *answer]  # an unclosed wrapper


def hidden_messages(example: Example, show_format: bool, show_items: bool) -> list[dict]:
    """The prompt with the format and/or items clause removed (warm-start prompts like a replay's)."""
    gold = example.gold
    return user_prompt(gold["items_text"] if show_items else "", _op_text(gold), FORMAT_CLAUSE if show_format else "")


__all__ = [
    "CLOSE",
    "FORMAT_CLAUSE",
    "OPEN",
    "OPS",
    "answer_words",
    "demonstrate",
    "first_wrong",
    "format_ok",
    "gold_answer",
    "hidden_messages",
    "make_example",
    "valid_ok",
    "verifiers",
]
