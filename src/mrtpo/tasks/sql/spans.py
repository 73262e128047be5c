"""The part of a response each SQL reward's checker reads, for the credit lift (docs/design.md#measurement).

Half-open character ranges of the response:

* ``format`` — the code fences (every run of three or more backticks with its language tag):
  the format check reads the fences and their tag, not the query inside;
* ``executes`` and ``result`` — the query that counts (:func:`~mrtpo.tasks.sql.parse.extract_sql`):
  both run it and ignore the prose around it. None when the response is nothing but that query.
"""

from __future__ import annotations

import re

from mrtpo.tasks.sql.parse import extract_sql
from mrtpo.verifiers import Example

_FENCE = re.compile(r"`{3,}[A-Za-z]*")


def checked_spans(
    example: Example, text: str, verifier_names: list[str]
) -> list[tuple[str, str, list[tuple[int, int]]]]:
    """``[(verifier name, span kind, character spans)]`` for the rewards with a span in ``text``."""
    found = []
    fences = [(m.start(), m.end()) for m in _FENCE.finditer(text)]
    if fences and "format" in verifier_names:
        found.append(("format", "code fence", fences))
    sql = extract_sql(text)
    start = text.find(sql) if sql else -1
    if start >= 0:
        for name in ("executes", "result"):
            if name in verifier_names:
                found.append((name, "SQL query", [(start, start + len(sql))]))
    return found


__all__ = ["checked_spans"]
