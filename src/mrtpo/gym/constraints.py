"""Constraints family (the instruction-following shape): a topic plus K clauses, one {0,1} reward each.

Prompt: ``topic : fox rice paris . about 12 words . rules : include owl . avoid rice . start with gold . length 12 .``
Each clause is one reward slot (``c1`` .. ``cK``, clauses in random order); its evidence is the
clause sentence, in the prompt. The clauses of one prompt use distinct words, so a response can
satisfy some and fail others at different places (relevant positions disjoint).

Clause kinds and their ground-truth relevant positions in a response:

=========  ==========================  ===========================================
kind       text                        relevant positions
=========  ==========================  ===========================================
include    ``include X .``             every X (none if X is missing)
avoid      ``avoid Y .``               every Y (none if Y is avoided)
start      ``start with W .``          the first word
end        ``end with Z .``            the last word
before     ``X before Y .``            the first X and the first Y
count      ``X exactly m times .``     every X
length     ``length N .``              the end-of-turn token (where the length is decided)
=========  ==========================  ===========================================

The ``overlap`` control has one clause, ``include X at least twice .``, scored by two rewards
(``once``: X at least once, ``twice``: at least twice) with the same evidence and the same relevant
positions (every X): nothing for reward-specific credit to separate.
"""

from __future__ import annotations

import random
from typing import Any

from mrtpo.gym.base import GymVerifier, Words, occurrences, user_prompt
from mrtpo.gym.vocab import CONTENT, FILLERS
from mrtpo.verifiers import Evidence, Example

KINDS: tuple[str, ...] = ("include", "avoid", "start", "end", "before", "count", "length")


def clause_text(kind: str, args: list) -> str:
    """The sentence of a clause (its evidence): ``include owl .``, ``owl exactly 2 times .`` …"""
    if kind == "include":
        return f"include {args[0]} ."
    if kind == "avoid":
        return f"avoid {args[0]} ."
    if kind == "start":
        return f"start with {args[0]} ."
    if kind == "end":
        return f"end with {args[0]} ."
    if kind == "before":
        return f"{args[0]} before {args[1]} ."
    if kind == "count":
        return f"{args[0]} exactly {args[1]} times ."
    if kind == "length":
        return f"length {args[0]} ."
    if kind == "twice":
        return f"include {args[0]} at least twice ."
    raise ValueError(f"unknown clause kind {kind!r}")


def satisfied(kind: str, args: list, words: Words) -> bool:
    """Whether ``words`` satisfy one clause."""
    if kind == "include":
        return args[0] in words
    if kind == "avoid":
        return args[0] not in words
    if kind == "start":
        return bool(words) and words[0] == args[0]
    if kind == "end":
        return bool(words) and words[-1] == args[0]
    if kind == "before":
        a, b = occurrences(words, args[0]), occurrences(words, args[1])
        return bool(a) and bool(b) and a[0] < b[0]
    if kind == "count":
        return len(occurrences(words, args[0])) == args[1]
    if kind == "length":
        return len(words) == args[0]
    raise ValueError(f"unknown clause kind {kind!r}")


def relevant_positions(kind: str, args: list, words: Words) -> list[int]:
    """Ground-truth positions of one clause in ``words`` (see the module table)."""
    if kind in ("include", "avoid", "count", "twice"):
        return occurrences(words, args[0])
    if kind == "start":
        return [0] if words else []
    if kind == "end":
        return [len(words) - 1] if words else []
    if kind == "before":
        return [found[0] for found in (occurrences(words, args[0]), occurrences(words, args[1])) if found]
    if kind == "length":
        return [len(words)]
    raise ValueError(f"unknown clause kind {kind!r}")


def _topic_text(topic: list[str], length: int) -> str:
    """The base task: the topic words and the typical length (a ``length`` clause then asks for exactly N)."""
    return f"topic : {' '.join(topic)} . about {length} words ."


def make_example(
    rng: random.Random,
    example_id: str,
    split: str,
    *,
    num_clauses: int,
    length: int,
    kinds: tuple[str, ...] = KINDS,
    overlap: bool = False,
) -> Example:
    """One prompt: a 3-word topic and ``num_clauses`` clauses of distinct kinds over distinct words.

    ``length``: the typical response length in words (a ``length`` clause asks for length ± 2).
    """
    pool = list(CONTENT)
    rng.shuffle(pool)
    topic, free = pool[:3], pool[3:]
    if overlap:
        clauses = [{"kind": "twice", "args": [free.pop()]}]
    else:
        if num_clauses > len(kinds):
            raise ValueError(f"num_clauses={num_clauses} exceeds the {len(kinds)} clause kinds {kinds}")
        clauses = []
        for kind in rng.sample(list(kinds), num_clauses):
            if kind == "avoid":
                args = [topic[rng.randrange(3)]]  # a topic word: the natural answer would use it
            elif kind == "before":
                args = [free.pop(), free.pop()]
            elif kind == "count":
                args = [free.pop(), rng.choice((2, 3))]
            elif kind == "length":
                args = [length + rng.randint(-2, 2)]
            else:
                args = [free.pop()]
            clauses.append({"kind": kind, "args": args})
    for c in clauses:
        c["text"] = clause_text(c["kind"], c["args"])
    messages = user_prompt(_topic_text(topic, length), "rules :", *(c["text"] for c in clauses))
    return Example(
        id=example_id, split=split, messages=messages, gold={"topic": topic, "clauses": clauses, "length": length}
    )


def verifiers(num_clauses: int, overlap: bool = False) -> list[GymVerifier]:
    """One verifier per clause slot (``c1`` ..), or the two rewards of the ``overlap`` control."""
    if overlap:

        def at_least(n: int):
            return lambda words, ex: float(len(occurrences(words, ex.gold["clauses"][0]["args"][0])) >= n)

        evidence = lambda ex: Evidence(ex.gold["clauses"][0]["text"], "in_prompt")  # noqa: E731
        positions = lambda words, ex: occurrences(words, ex.gold["clauses"][0]["args"][0])  # noqa: E731
        return [
            GymVerifier("once", at_least(1), evidence, positions),
            GymVerifier("twice", at_least(2), evidence, positions),
        ]

    def slot(i: int) -> GymVerifier:
        def score(words: Words, ex: Example) -> float | None:
            c = ex.gold["clauses"][i]
            return float(satisfied(c["kind"], c["args"], words))

        def evidence(ex: Example) -> Evidence:
            return Evidence(ex.gold["clauses"][i]["text"], "in_prompt")

        def positions(words: Words, ex: Example) -> list[int]:
            c = ex.gold["clauses"][i]
            return relevant_positions(c["kind"], c["args"], words)

        return GymVerifier(f"c{i + 1}", score, evidence, positions)

    return [slot(i) for i in range(num_clauses)]


def _draft(example: Example, follow: list[bool], visible: list[bool], rng: random.Random) -> Words:
    """One candidate response: topic and filler words, then each visible clause followed or broken."""
    gold = example.gold
    clauses = gold["clauses"]
    n = gold["length"] + rng.randint(-2, 2)
    for c, f, v in zip(clauses, follow, visible):
        if c["kind"] == "length" and v:
            n = c["args"][0] if f else c["args"][0] + rng.choice((-3, -2, -1, 1, 2, 3))
    n = max(n, 4)
    # The base text cycles through the topic words with a few fillers: predictable, so the warm start
    # spends its capacity on the clauses, the only choices a response makes.
    words = [gold["topic"][i % 3] if rng.random() < 0.85 else rng.choice(FILLERS) for i in range(n)]
    reserved = set()
    for c, f, v in zip(clauses, follow, visible):
        if v and f and c["kind"] in ("start", "end"):
            at = 0 if c["kind"] == "start" else n - 1
            words[at] = c["args"][0]
            reserved.add(at)
    free = [i for i in range(n) if i not in reserved]

    def put(word: str, count: int) -> None:
        for i in rng.sample(free, min(count, len(free))):
            words[i] = word
            free.remove(i)

    for c, f, v in zip(clauses, follow, visible):
        kind, args = c["kind"], c["args"]
        if not v:
            continue
        if kind == "include" and f:
            put(args[0], 1)
        elif kind == "avoid":
            words[:] = [rng.choice(FILLERS) if w == args[0] else w for w in words]
            if not f:
                put(args[0], 1)
        elif kind == "before" and len(free) >= 2:
            i, j = sorted(rng.sample(free, 2))
            first, second = (args[0], args[1]) if f else (args[1], args[0])
            words[i], words[j] = first, second
            free.remove(i)
            free.remove(j)
        elif kind == "count":
            put(args[0], args[1] if f else max(1, args[1] + rng.choice((-1, 1))))
        elif kind == "twice":
            put(args[0], rng.choice((2, 3)) if f else rng.choice((0, 1)))
    return words


def _met(clause: dict, words: Words) -> bool:
    if clause["kind"] == "twice":
        return len(occurrences(words, clause["args"][0])) >= 2
    return satisfied(clause["kind"], clause["args"], words)


def demonstrate(
    example: Example,
    rng: random.Random,
    p_follow: float,
    visible: list[bool] | None = None,
    follow: list[bool] | None = None,
) -> Words:
    """The noisy demonstrator: each visible clause followed with probability ``p_follow``, else broken
    (``follow``: which to follow, given instead).

    Clauses missing from the prompt (``visible`` False: a warm-start prompt without that clause)
    are ignored, as a writer who never read them would. Rejection sampling makes the realised
    rewards match the intended pattern whenever a draft allows it.
    """
    clauses = example.gold["clauses"]
    visible = visible or [True] * len(clauses)
    follow = follow if follow is not None else [rng.random() < p_follow for _ in clauses]
    words: Words = []
    for _ in range(50):
        words = _draft(example, follow, visible, rng)
        ok = all(_met(c, words) == f for c, f, v in zip(clauses, follow, visible) if v)
        if ok:
            break
    return words


def without_clauses(example: Example, hidden: list[bool]) -> list[dict[str, Any]]:
    """The prompt's messages with the ``hidden`` clauses removed (warm-start prompts like a replay's)."""
    gold = example.gold
    kept = [c["text"] for c, h in zip(gold["clauses"], hidden) if not h]
    return user_prompt(_topic_text(gold["topic"], gold["length"]), "rules :", *kept)


__all__ = [
    "KINDS",
    "clause_text",
    "demonstrate",
    "make_example",
    "relevant_positions",
    "satisfied",
    "verifiers",
    "without_clauses",
]
