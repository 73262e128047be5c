"""Structured-call family (the tool shape): one call ``name ( arg = value , … )`` against a listed schema.

Prompt: ``tools : order ( food , count ) ; find ( city , day ) . request : 3 pie . format : wrap call
in <call> </call> .`` The request gives only the values, shuffled; the function is the one whose
argument types they fit. Gold response: ``<call> order ( food = pie , count = 3 ) </call>``.

===========  ====================================  =============================  ====================================
reward       checks                                evidence                       relevant positions
===========  ====================================  =============================  ====================================
format       ``<call>`` + a well-formed call +     the format clause (in prompt)  first and last word, any stray
             ``</call>``                                                          wrapper word
correctness  partial credit in [0, 1]: (name       the gold call (privileged)     the wrong name / argument / value
             right + share of gold arguments                                      words; if all right, the name and
             named + share with the right value)                                  every value
             / 3, read from the first ``name (``
             call
===========  ====================================  =============================  ====================================
"""

from __future__ import annotations

import random

from mrtpo.gym.base import GymVerifier, Words, occurrences, user_prompt
from mrtpo.gym.vocab import CATEGORIES
from mrtpo.verifiers import Evidence, Example

OPEN, CLOSE = "<call>", "</call>"
FORMAT_CLAUSE = f"format : wrap call in {OPEN} {CLOSE} ."
TYPES: dict[str, tuple[str, ...]] = {
    "place": CATEGORIES["place"],
    "food": CATEGORIES["food"],
    "animal": CATEGORIES["animal"],
    "color": CATEGORIES["color"],
    "day": ("mon", "tue", "wed", "thu", "fri"),
    "number": tuple(str(i) for i in range(1, 10)),
}
#: name -> [(argument, type)]; the type sets of any two functions differ, so the values name the function.
FUNCTIONS: dict[str, list[tuple[str, str]]] = {
    "find": [("city", "place"), ("day", "day")],
    "book": [("city", "place"), ("day", "day"), ("size", "number")],
    "order": [("food", "food"), ("count", "number")],
    "send": [("pet", "animal"), ("color", "color")],
}


def call_words(name: str, args: list[tuple[str, str]]) -> Words:
    """``name ( k = v , k = v )`` as words."""
    body: Words = []
    for i, (k, v) in enumerate(args):
        body += ([","] if i else []) + [k, "=", v]
    return [name, "(", *body, ")"]


def parse_call(words: Words) -> tuple[int, str, list[tuple[int, str, int, str]], int | None] | None:
    """The first ``name ( … )`` in ``words``, leniently: ``(name position, name, [(key position, key,
    value position, value)], position of ")" or None)``; ``None`` without any ``word (``."""
    for i in range(len(words) - 1):
        if words[i + 1] == "(" and words[i] not in (OPEN, CLOSE, "("):
            args, j = [], i + 2
            while j + 2 < len(words) and words[j + 1] == "=" and words[j] not in (")", ","):
                args.append((j, words[j], j + 2, words[j + 2]))
                j += 3
                if j < len(words) and words[j] == ",":
                    j += 1
            close = j if j < len(words) and words[j] == ")" else None
            return i, words[i], args, close
    return None


def format_ok(words: Words) -> bool:
    """``<call>`` first, ``</call>`` last, once each, and exactly one well-formed call between them."""
    if len(words) < 4 or words[0] != OPEN or words[-1] != CLOSE:
        return False
    if len(occurrences(words, OPEN)) != 1 or len(occurrences(words, CLOSE)) != 1:
        return False
    parsed = parse_call(words[1:-1])
    if parsed is None or parsed[0] != 0 or parsed[3] is None:
        return False
    name, args = parsed[1], [(k, v) for _, k, _, v in parsed[2]]
    return call_words(name, args) == words[1:-1]


def correctness(words: Words, gold: dict) -> float:
    """(name right + share of gold arguments present + share with the right value) / 3."""
    parsed = parse_call(words)
    if parsed is None:
        return 0.0
    _, name, args, _ = parsed
    found = {k: v for _, k, _, v in args}
    gold_args = gold["args"]
    named = sum(k in found for k, _ in gold_args) / len(gold_args)
    right = sum(found.get(k) == v for k, v in gold_args) / len(gold_args)
    return ((name == gold["name"]) + named + right) / 3


def correctness_positions(words: Words, gold: dict) -> list[int]:
    """The wrong name, wrong keys and wrong values; a missing argument points at ``)``; all right:
    the name and every value."""
    parsed = parse_call(words)
    if parsed is None:
        return []
    at, name, args, close = parsed
    gold_values = dict(gold["args"])
    wrong = [at] if name != gold["name"] else []
    for kp, k, vp, v in args:
        if k not in gold_values:
            wrong.append(kp)
        elif v != gold_values[k]:
            wrong.append(vp)
    if any(k not in {key for _, key, _, _ in args} for k in gold_values) and close is not None:
        wrong.append(close)
    return wrong or [at, *(vp for _, _, vp, _ in args)]


def make_example(rng: random.Random, example_id: str, split: str, *, num_tools: int = 3) -> Example:
    """A target function with random values, listed among ``num_tools`` functions in random order."""
    name = rng.choice(sorted(FUNCTIONS))
    args = [(k, rng.choice(TYPES[t])) for k, t in FUNCTIONS[name]]
    listed = [name, *rng.sample([f for f in sorted(FUNCTIONS) if f != name], num_tools - 1)]
    rng.shuffle(listed)
    schema = " ; ".join(f"{f} ( {' , '.join(k for k, _ in FUNCTIONS[f])} )" for f in listed)
    values = [v for _, v in args]
    rng.shuffle(values)
    gold = {"name": name, "args": args, "tools_text": f"tools : {schema} .", "call": " ".join(call_words(name, args))}
    messages = user_prompt(gold["tools_text"], f"request : {' '.join(values)} .", FORMAT_CLAUSE)
    return Example(id=example_id, split=split, messages=messages, gold=gold)


def verifiers() -> list[GymVerifier]:
    return [
        GymVerifier(
            "format",
            lambda w, ex: float(format_ok(w)),
            lambda ex: Evidence(FORMAT_CLAUSE, "in_prompt"),
            lambda w, ex: [0, max(len(w) - 1, 0), *occurrences(w, OPEN), *occurrences(w, CLOSE)],
        ),
        GymVerifier(
            "correctness",
            lambda w, ex: correctness(w, ex.gold),
            lambda ex: Evidence(ex.gold["call"], "privileged"),
            lambda w, ex: correctness_positions(w, ex.gold),
        ),
    ]


def demonstrate(
    example: Example, rng: random.Random, p_follow: float, show_format: bool = True, reference: bool = False
) -> Words:
    """The noisy demonstrator: the name right with probability ``(1 + p_follow) / 2``, each value with
    ``p_follow`` (else another value of its type), the wrapper with ``p_follow`` when the format clause
    is shown; with the gold call shown as a reference everything but the wrapper is right."""
    gold = example.gold
    name, args = gold["name"], list(gold["args"])
    if not reference:
        if rng.random() >= (1 + p_follow) / 2:
            name = rng.choice([f for f in FUNCTIONS if f != name])
        types = dict(FUNCTIONS[gold["name"]])
        args = [
            (k, v if rng.random() < p_follow else rng.choice([x for x in TYPES[types[k]] if x != v])) for k, v in args
        ]
    words = call_words(name, args)
    if show_format and rng.random() < p_follow:
        return [OPEN, *words, CLOSE]
    style = rng.random()
    return words if style < 0.5 else (["[", *words, "]"] if style < 0.75 else [OPEN, *words])


def hidden_messages(example: Example) -> list[dict]:
    """The prompt without its format clause (warm-start prompts like the format replay's)."""
    content = example.messages[0]["content"]
    return user_prompt(content.replace(" " + FORMAT_CLAUSE, ""))


__all__ = [
    "CLOSE",
    "FORMAT_CLAUSE",
    "FUNCTIONS",
    "OPEN",
    "call_words",
    "correctness",
    "correctness_positions",
    "demonstrate",
    "format_ok",
    "hidden_messages",
    "make_example",
    "parse_call",
    "verifiers",
]
