"""Long family (``gym-long``): long responses of high-entropy filler with a few rules, each read at 1–2 tokens.

The regime where token credit should pay (issue 37): a response of 64 or 128 words, almost all of
them *filler* (numbers drawn uniformly from :data:`FILLER`, ln 100 ≈ 4.6 nats a token for the
demonstrator, ≥ 2 nats under the warm start) that no reward reads, and 3–6 rules whose rewards are
each decided at one or two positions. Every filler token adds gradient noise to every reward under
uniform credit; a map that finds the rule tokens removes it.

Prompt: ``about 64 words . rules : include owl . end with rose . fox before rice .``
One {0, 1} reward per rule (``c1`` .. ``cK``, rules in random order, distinct content words), its
evidence the rule's sentence in the prompt. Rule kinds (:data:`KINDS`) and their ground-truth
relevant positions (:func:`mrtpo.gym.constraints.relevant_positions`):

=========  ==========================  =============================================
kind       text                        relevant positions (met / broken)
=========  ==========================  =============================================
include    ``include X .``             the X (1) / none
avoid      ``avoid Y .``               none / every Y (1–2)
start      ``start with W .``          the first word (1)
end        ``end with Z .``            the last word (1)
before     ``X before Y .``            the first X and the first Y (2)
count      ``X exactly 2 times .``     every X (2 / 1 or 3)
=========  ==========================  =============================================
"""

from __future__ import annotations

import random

from mrtpo.gym import constraints
from mrtpo.gym.base import GymVerifier, Words, user_prompt
from mrtpo.gym.vocab import CONTENT, NUMBERS
from mrtpo.verifiers import Example

KINDS: tuple[str, ...] = ("include", "avoid", "start", "end", "before", "count")
#: The filler words: no rule reads them, and the demonstrator draws each one uniformly.
FILLER: tuple[str, ...] = NUMBERS[:100]
#: Typical response lengths (the warm start's mixture) and rules per prompt (its range).
LENGTHS: tuple[int, ...] = (64, 128)
MIN_RULES, MAX_RULES = 3, 6
#: The demonstrator's response length is the typical length ± this.
LENGTH_JITTER = 4


def make_example(rng: random.Random, example_id: str, split: str, *, num_rules: int, length: int) -> Example:
    """One prompt: ``num_rules`` rules of distinct kinds over distinct content words, a typical length."""
    if not 1 <= num_rules <= len(KINDS):
        raise ValueError(f"num_clauses must be in 1..{len(KINDS)} for gym-long, got {num_rules}")
    pool = list(CONTENT)
    rng.shuffle(pool)
    rules = []
    for kind in rng.sample(list(KINDS), num_rules):
        args = [pool.pop(), pool.pop()] if kind == "before" else [pool.pop(), 2] if kind == "count" else [pool.pop()]
        rules.append({"kind": kind, "args": args, "text": constraints.clause_text(kind, args)})
    messages = user_prompt(*_head(length), *(r["text"] for r in rules))
    return Example(id=example_id, split=split, messages=messages, gold={"clauses": rules, "length": length})


def _head(length: int) -> tuple[str, str]:
    return f"about {length} words .", "rules :"


def verifiers(num_rules: int) -> list[GymVerifier]:
    """One verifier per rule slot (``c1`` ..): the constraints family's, on this family's rules."""
    return constraints.verifiers(num_rules)


def draft(example: Example, follow: list[bool], visible: list[bool], rng: random.Random) -> Words:
    """One response: uniform filler, then each visible rule's words placed to meet it or break it."""
    n = max(example.gold["length"] + rng.randint(-LENGTH_JITTER, LENGTH_JITTER), 16)
    words = [rng.choice(FILLER) for _ in range(n)]
    free = list(range(1, n - 1))  # the first and last word are the start and end rules'
    for rule, met, seen in zip(example.gold["clauses"], follow, visible):
        if not seen:
            continue
        kind, args = rule["kind"], rule["args"]
        if kind == "start" and met:
            words[0] = args[0]
        elif kind == "end" and met:
            words[-1] = args[0]
        elif kind in ("include", "avoid", "count", "before"):
            if kind == "include":
                count = 1 if met else 0
            elif kind == "avoid":
                count = 0 if met else rng.choice((1, 2))
            elif kind == "count":
                count = args[1] if met else rng.choice((1, 3))
            else:
                count = 2
            at = sorted(rng.sample(free, count))
            for i in at:
                free.remove(i)
            if kind == "before":
                first, second = (args[0], args[1]) if met else (args[1], args[0])
                words[at[0]], words[at[1]] = first, second
            else:
                for i in at:
                    words[i] = args[0]
    return words


def demonstrate(example: Example, rng: random.Random, p_follow: float, visible: list[bool] | None = None) -> Words:
    """The noisy demonstrator: each visible rule met with probability ``p_follow``, else broken; rules
    missing from the prompt (``visible`` False) are ignored, as a writer who never read them would."""
    rules = example.gold["clauses"]
    visible = visible or [True] * len(rules)
    return draft(example, [rng.random() < p_follow for _ in rules], visible, rng)


def without_rules(example: Example, hidden: list[bool]) -> list[dict]:
    """The prompt's messages with the ``hidden`` rules removed (warm-start prompts like a replay's)."""
    kept = [r["text"] for r, h in zip(example.gold["clauses"], hidden) if not h]
    return user_prompt(*_head(example.gold["length"]), *kept)


__all__ = [
    "FILLER",
    "KINDS",
    "LENGTHS",
    "LENGTH_JITTER",
    "MAX_RULES",
    "MIN_RULES",
    "demonstrate",
    "draft",
    "make_example",
    "verifiers",
    "without_rules",
]
