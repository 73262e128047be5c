"""Which constraint classes training draws from, which it leaves out (and why), and conflicts.

Every class of both registries is either in a training pool or in :data:`EXCLUDED` with its reason
(a test checks the two partition the registries exactly). Pools:

* ``"ifeval"`` (default) — 24 of IFEval's 25 classes. Keeps IFBench out-of-distribution, as its
  authors intend (IFBench's constraints are held out from training by design).
* ``"ifbench"`` — 23 IFBench classes that compose with an open-ended writing task.
* ``"all"`` — both. Training on IFBench classes makes ``eval_ifbench`` in-distribution.

Conflicts (two constraints never drawn together): IFEval's own table (``INSTRUCTION_CONFLICTS``
made symmetric by its ``conflict_make``), plus :data:`EXTRA_CONFLICTS` for pairs the library does
not cover (IFBench has no table) and two argument-level rules in :func:`kwargs_conflict`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from mrtpo.tasks.instructions import checkers

__all__ = [
    "POOLS",
    "EXCLUDED",
    "EXTRA_CONFLICTS",
    "LOCAL_CLASSES",
    "expand_classes",
    "pool",
    "class_conflict",
    "kwargs_conflict",
    "conflicts",
]

Key = tuple[str, str]  # (benchmark, instruction id)

IFEVAL_POOL: tuple[str, ...] = (
    "keywords:existence",
    "keywords:frequency",
    "keywords:forbidden_words",
    "keywords:letter_frequency",
    "language:response_language",
    "length_constraints:number_sentences",
    "length_constraints:number_paragraphs",
    "length_constraints:number_words",
    "length_constraints:nth_paragraph_first_word",
    "detectable_content:number_placeholders",
    "detectable_content:postscript",
    "detectable_format:number_bullet_lists",
    "detectable_format:number_highlighted_sections",
    "detectable_format:multiple_sections",
    "detectable_format:json_format",
    "detectable_format:title",
    "combination:two_responses",
    "combination:repeat_prompt",
    "startend:end_checker",
    "change_case:capital_word_frequency",
    "change_case:english_capital",
    "change_case:english_lowercase",
    "punctuation:no_comma",
    "startend:quotation",
)

IFBENCH_POOL: tuple[str, ...] = (
    "count:word_count_range",
    "count:unique_word_count",
    "ratio:stop_words",
    "count:conjunctions",
    "count:person_names",
    "count:numbers",
    "count:pronouns",
    "count:keywords_multiple",
    "sentence:keyword",
    "words:repeats",
    "format:emoji",
    "format:list",
    "format:thesis",
    "format:sub-bullets",
    "format:no_bullets_bullets",
    "format:output_template",
    "format:title_case",
    "format:parentheses",
    "format:quotes",
    "count:punctuation",
    "ratio:sentence_type",
    "ratio:sentence_balance",
    "words:paragraph_last_first",
)

POOLS: dict[str, tuple[Key, ...]] = {
    "ifeval": tuple(("ifeval", i) for i in IFEVAL_POOL),
    "ifbench": tuple(("ifbench", i) for i in IFBENCH_POOL),
}
POOLS["all"] = POOLS["ifeval"] + POOLS["ifbench"]

_SELF_CONTAINED = (
    "a self-contained task with a fixed question or output (not a constraint that composes with a base task)"
)
_REPEAT = "rewrites or replaces the request itself (repeat or copy the prompt)"
_EVERY_WORD = (
    "constrains every word of the answer: near-zero pass rate for small models, and it "
    "conflicts with most content constraints"
)
_LAYOUT = "rewrites the layout of every word or line; conflicts with nearly every other constraint"
_PUZZLE = "a sentence-chaining or word-position puzzle with near-zero pass rate for small models"

EXCLUDED: dict[Key, str] = {
    ("ifeval", "detectable_format:constrained_response"): (
        "the answer is one fixed phrase ('My answer is yes.'): needs a yes/no question, a "
        "degenerate output satisfies it, and IFEval marks it as conflicting with everything"
    ),
    ("ifbench", "words:start_verb"): checkers.UNVERIFIABLE[("ifbench", "words:start_verb")],
    ("ifbench", "ratio:overlap"): "needs a reference text in the prompt; base tasks have none",
    ("ifbench", "format:options"): (
        "the answer is one fixed option phrase: a degenerate output satisfies it and it "
        "conflicts with every other constraint"
    ),
    ("ifbench", "format:no_whitespace"): _LAYOUT,
    ("ifbench", "format:newline"): _LAYOUT,
    ("ifbench", "format:line_indent"): _LAYOUT,
    ("ifbench", "format:quote_unquote"): (
        "every quoted phrase must be followed by an explanation: conflicts with quotation and nested-quote constraints"
    ),
    ("ifbench", "words:alphabet"): _EVERY_WORD,
    ("ifbench", "words:vowel"): _EVERY_WORD,
    ("ifbench", "words:consonants"): _EVERY_WORD,
    ("ifbench", "words:prime_lengths"): _EVERY_WORD,
    ("ifbench", "words:odd_even_syllables"): _EVERY_WORD,
    ("ifbench", "words:no_consecutive"): _EVERY_WORD,
    ("ifbench", "count:words_japanese"): _EVERY_WORD,
    ("ifbench", "words:palindrome"): "needs ten 5+-letter palindromes: near-zero pass rate",
    ("ifbench", "ratio:sentence_words"): "fixes the answer to three equal-length sentences",
    ("ifbench", "sentence:alliteration_increment"): _PUZZLE,
    ("ifbench", "sentence:increment"): _PUZZLE,
    ("ifbench", "words:last_first"): _PUZZLE,
    ("ifbench", "words:keywords_specific_position"): _PUZZLE,
    ("ifbench", "words:words_position"): _PUZZLE,
    ("ifbench", "repeat:repeat_change"): _REPEAT,
    ("ifbench", "repeat:repeat_simple"): _REPEAT,
    ("ifbench", "repeat:repeat_span"): _REPEAT,
    **{
        ("ifbench", f"custom:{name}"): _SELF_CONTAINED
        for name in (
            "multiples",
            "mcq_count_length",
            "reverse_newline",
            "word_reverse",
            "character_reverse",
            "sentence_alphabet",
            "european_capitals_sort",
            "csv_city",
            "csv_special_character",
            "csv_quotes",
            "date_format_list",
        )
    },
}


def _ifeval(*ids: str) -> list[Key]:
    return [("ifeval", i) for i in ids]


def _ifbench(*ids: str) -> list[Key]:
    return [("ifbench", i) for i in ids]


def _pairwise(group: Iterable[Key]) -> set[frozenset[Key]]:
    items = list(group)
    return {frozenset((a, b)) for i, a in enumerate(items) for b in items[i + 1 :]}


def _cross(left: Iterable[Key], right: Iterable[Key]) -> set[frozenset[Key]]:
    return {frozenset((a, b)) for a in left for b in right if a != b}


_ALL_IFBENCH = [("ifbench", i) for i in IFBENCH_POOL]

# Symmetric class-level conflicts beyond IFEval's table; each line says why.
EXTRA_CONFLICTS: set[frozenset[Key]] = set().union(
    # one length constraint per prompt (floors and ranges would contradict each other)
    _pairwise(
        _ifeval("length_constraints:number_words") + _ifbench("count:word_count_range", "count:unique_word_count")
    ),
    # one bullet-style constraint per prompt (IFEval counts both '*' and '-' lines as bullets)
    _pairwise(
        _ifeval("detectable_format:number_bullet_lists")
        + _ifbench("format:sub-bullets", "format:no_bullets_bullets", "format:list")
    ),
    # IFEval constraints that own the whole response (JSON, two answers, a repeated request,
    # another language) against every IFBench constraint (IFBench's checkers are English-only)
    _cross(
        _ifeval(
            "detectable_format:json_format",
            "combination:two_responses",
            "combination:repeat_prompt",
            "language:response_language",
            "detectable_format:constrained_response",
        ),
        _ALL_IFBENCH,
    ),
    # case rules against case-sensitive markers ("SECTION 1"/"Section 1", "My Answer:", names)
    _cross(
        _ifeval("change_case:english_lowercase", "change_case:english_capital"),
        _ifeval("detectable_format:multiple_sections")
        + _ifbench("format:output_template", "count:person_names", "format:title_case"),
    ),
    {
        # every standard punctuation mark includes the comma
        frozenset((("ifeval", "punctuation:no_comma"), ("ifbench", "count:punctuation"))),
        # "SECTION 1" etc. are numbers too
        frozenset((("ifbench", "count:numbers"), ("ifeval", "detectable_format:multiple_sections"))),
        # a keyword repeated 5-7 times (or "at least N times") against a per-word repeat cap
        frozenset((("ifbench", "words:repeats"), ("ifbench", "count:keywords_multiple"))),
        frozenset((("ifbench", "words:repeats"), ("ifeval", "keywords:frequency"))),
        # one sentence-type ratio per prompt
        frozenset((("ifbench", "ratio:sentence_type"), ("ifbench", "ratio:sentence_balance"))),
        # keyword in the N-th sentence against a sentence-count cap
        frozenset((("ifbench", "sentence:keyword"), ("ifeval", "length_constraints:number_sentences"))),
        # an emoji after every sentence against a fixed final phrase or a closing quote
        frozenset((("ifbench", "format:emoji"), ("ifeval", "startend:end_checker"))),
        frozenset((("ifbench", "format:emoji"), ("ifeval", "startend:quotation"))),
    },
    # each line must start and end with the same word: fixed end phrases, P.S. lines, titles,
    # section markers, '***' dividers, HTML italics and the answer template break that
    _cross(
        _ifbench("words:paragraph_last_first"),
        _ifeval(
            "startend:end_checker",
            "detectable_content:postscript",
            "detectable_format:title",
            "detectable_format:multiple_sections",
            "length_constraints:number_paragraphs",
        )
        + _ifbench("format:thesis", "format:output_template"),
    ),
    # the answer template against paragraph/section layouts
    _cross(
        _ifbench("format:output_template"),
        _ifeval(
            "length_constraints:number_paragraphs",
            "length_constraints:nth_paragraph_first_word",
            "detectable_format:multiple_sections",
        ),
    ),
)


#: IFEval classes whose checker reads the answer at a few positions (its start and end, a keyword's
#: occurrences, a ``<<title>>``, a P.S. block), not the whole answer (counts, case, layout): the
#: classes where token credit has a local span to find. ``classes: local`` names them.
LOCAL_CLASSES: tuple[str, ...] = (
    "startend:end_checker",
    "startend:quotation",
    "keywords:existence",
    "keywords:frequency",
    "keywords:forbidden_words",
    "detectable_format:title",
    "detectable_content:postscript",
)


def expand_classes(classes: Iterable[str] | str | None) -> tuple[str, ...]:
    """Instruction ids from a ``classes`` setting: a list of ids, one id, or ``"local"``
    (:data:`LOCAL_CLASSES`); ``()`` (no restriction) for none. Duplicates are an error."""
    if not classes:
        return ()
    names = [classes] if isinstance(classes, str) else list(classes)
    out = [cid for name in names for cid in (LOCAL_CLASSES if name == "local" else (name,))]
    if len(set(out)) != len(out):
        raise ValueError(f"classes repeat an instruction id: {names!r}")
    return tuple(out)


def pool(name: str) -> tuple[Key, ...]:
    """The classes of training pool ``name`` ("ifeval", "ifbench" or "all")."""
    if name not in POOLS:
        raise ValueError(f"unknown constraint pool {name!r}; expected one of {sorted(POOLS)}")
    return POOLS[name]


def class_conflict(a: Key, b: Key) -> bool:
    """Whether two constraint classes may not share a prompt (symmetric; a class with itself)."""
    if a == b:
        return True
    if a[0] == b[0] == "ifeval":
        table = checkers.ifeval_conflicts()
        if b[1] in table.get(a[1], ()) or a[1] in table.get(b[1], ()):
            return True
    return frozenset((a, b)) in EXTRA_CONFLICTS


_KEYWORD_ARGS = ("keywords", "keyword", "first_word", "word") + tuple(f"keyword{i}" for i in range(1, 6))


def _words(value: Any) -> set[str]:
    if value is None:
        return set()
    if isinstance(value, (list, tuple)):
        return set().union(*(_words(v) for v in value)) if value else set()
    return {w.lower() for w in re.findall(r"[A-Za-z']+", str(value))}


def _required_keywords(kwargs: Mapping[str, Any]) -> set[str]:
    return set().union(*(_words(kwargs.get(k)) for k in _KEYWORD_ARGS))


def kwargs_conflict(a: Mapping[str, Any], b: Mapping[str, Any], base_task: str = "") -> bool:
    """Argument-level conflicts between two drawn constraints (dicts with id/kwargs/sentence).

    1. A forbidden word that the other constraint's arguments require (its keywords, end
       phrase, postscript marker, section marker, ...) — or that the base task contains when the
       request must be repeated.
    2. Two constraints that require the same keyword (e.g. "include 'land'" and "'land' five
       times"): satisfiable at best by accident, so never drawn together.
    """
    for x, y in ((a, b), (b, a)):
        forbidden = _words((x.get("kwargs") or {}).get("forbidden_words"))
        if forbidden:
            shown = _words(list((y.get("kwargs") or {}).values()))
            if y.get("id") == "combination:repeat_prompt":
                shown |= _words(base_task)
            if forbidden & shown:
                return True
    ka = _required_keywords(a.get("kwargs") or {})
    kb = _required_keywords(b.get("kwargs") or {})
    return bool(ka & kb)


def conflicts(a: Mapping[str, Any], b: Mapping[str, Any], base_task: str = "") -> bool:
    """Class-level or argument-level conflict between two drawn constraints."""
    ka = (a["benchmark"], a["id"])
    kb = (b["benchmark"], b["id"])
    return class_conflict(ka, kb) or kwargs_conflict(a, b, base_task)
