"""The part of a response each constraint's checker reads, for the credit lift (docs/design.md#measurement).

Only constraints whose checked text is a visible, local span of the response have one; whole-
response properties (case, length, language, paragraph counts) have none. Spans are half-open
character ranges of the response, found with the same patterns the IFEval checkers use:

========================  ===============================================================
``startend:end_checker``  the response's last ``len(end_phrase)`` characters (after the
                          checker's strip of whitespace and quotes): what ``endswith`` reads
``keywords:existence``    every occurrence of every keyword (``re.search``, ignoring case)
``keywords:frequency``    every occurrence of the keyword
``keywords:forbidden_words``  every occurrence of a forbidden word (``\\bword\\b``); none when the
                          response avoids them all
``detectable_content:postscript``  from the postscript marker to the end of its line
``detectable_format:title``   every ``<<title>>``
========================  ===============================================================
"""

from __future__ import annotations

import re
from typing import Any

from mrtpo.verifiers import Example

#: constraint id -> short label of the span kind (the row of the lift table)
SPAN_KINDS: dict[str, str] = {
    "startend:end_checker": "end phrase",
    "keywords:existence": "keyword",
    "keywords:frequency": "keyword",
    "keywords:forbidden_words": "forbidden word",
    "detectable_content:postscript": "P.S. block",
    "detectable_format:title": "title",
}


def _occurrences(pattern: str, text: str, flags: int = re.IGNORECASE) -> list[tuple[int, int]]:
    return [(m.start(), m.end()) for m in re.finditer(pattern, text, flags) if m.end() > m.start()]


def _end_span(text: str, phrase: str) -> list[tuple[int, int]]:
    stripped = text.strip()
    core = stripped.strip('"')  # what the checker compares: strip whitespace, then quotes
    start = (len(text) - len(text.lstrip())) + (len(stripped) - len(stripped.lstrip('"')))
    n = min(len(phrase.strip()), len(core))
    return [(start + len(core) - n, start + len(core))] if n else []


def _postscript_span(text: str, marker: str) -> list[tuple[int, int]]:
    if marker == "P.P.S":
        pattern = r"p\.\s?p\.\s?s.*$"
    elif marker == "P.S.":
        pattern = r"p\.\s?s\..*$"
    else:
        pattern = re.escape(marker.lower()) + r".*$"
    return _occurrences(pattern, text.lower(), re.MULTILINE)


def constraint_span(constraint: dict[str, Any], text: str) -> list[tuple[int, int]] | None:
    """Character spans of ``text`` that ``constraint``'s checker reads; ``None``: no local span."""
    cid, kw = constraint["id"], constraint.get("kwargs") or {}
    if constraint.get("benchmark") != "ifeval" or cid not in SPAN_KINDS:
        return None
    if cid == "startend:end_checker":
        spans = _end_span(text, kw.get("end_phrase") or "")
    elif cid == "keywords:existence":
        spans = sorted(s for k in kw.get("keywords") or [] for s in _occurrences(k, text))
    elif cid == "keywords:frequency":
        spans = _occurrences(kw.get("keyword") or "", text) if kw.get("keyword") else []
    elif cid == "keywords:forbidden_words":
        spans = sorted(s for w in kw.get("forbidden_words") or [] for s in _occurrences(r"\b" + w + r"\b", text))
    elif cid == "detectable_content:postscript":
        spans = _postscript_span(text, kw.get("postscript_marker") or "P.S.")
    else:  # detectable_format:title
        spans = _occurrences(r"<<[^\n]+>>", text, 0)
    return spans or None


def checked_spans(
    example: Example, text: str, verifier_names: list[str]
) -> list[tuple[str, str, list[tuple[int, int]]]]:
    """``[(verifier name, span kind, character spans)]`` for the slots whose constraint has a span in ``text``."""
    constraints = (example.gold or {}).get("constraints") or []
    found = []
    for name in verifier_names:
        slot = int(name.rsplit("_", 1)[1]) if name.startswith("constraint_") else 0
        if not 1 <= slot <= len(constraints):
            continue
        spans = constraint_span(constraints[slot - 1], text)
        if spans:
            found.append((name, SPAN_KINDS[constraints[slot - 1]["id"]], spans))
    return found


def has_span_constraint(example: Example) -> bool:
    """Whether some constraint of ``example`` can have a span (used to pick prompts for the lift)."""
    return any(
        c.get("benchmark") == "ifeval" and c["id"] in SPAN_KINDS for c in (example.gold or {}).get("constraints") or []
    )


__all__ = ["SPAN_KINDS", "checked_spans", "constraint_span", "has_span_constraint"]
