"""Find the SQL in a model completion.

Code fences are found line by line (linear time, no backtracking regex): a fence opens on a line
whose first non-blank characters are three or more backticks, optionally followed by a language
tag (``sql``, ``SQL``, ``sqlite``, none, ...), and closes on a line that starts with at least as
many backticks, or on a code line that ends with them (``SELECT 1;```). A fence that is never
closed (generation cut at ``max_new_tokens``) runs to the end of the text and is marked unclosed.
``"```sql SELECT 1```"`` on one line counts as a closed block.

Which SQL counts (:func:`extract_sql`):

1. the first block tagged ``sql`` (any case), closed or not;
2. else the first fenced block of any other tag or none;
3. else *bare SQL*: from the first line that starts with SELECT or WITH up to the first ``;``
   outside strings and comments, or the first blank line, whichever comes first (a trailing
   explanation after a blank line is not part of the query).

The first block, not the last, counts: a completion cannot hedge by offering several answers.

Format (:func:`format_ok`): exactly one fenced block in the whole completion, tagged ``sql``
(any case), closed, with non-blank content. Prose before or after it is allowed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from mrtpo.tasks.sql.sqltext import tokenize


@dataclass(frozen=True)
class CodeBlock:
    """One fenced block: its language tag (lower-cased, may be empty), content, and whether closed."""

    tag: str
    content: str
    closed: bool


_BARE_START = re.compile(r"^\s*(SELECT|WITH)\b", re.IGNORECASE)


def _fence_len(s: str) -> int:
    n = 0
    while n < len(s) and s[n] == "`":
        n += 1
    return n


def code_blocks(text: str) -> list[CodeBlock]:
    """All fenced code blocks of ``text``, in order."""
    blocks: list[CodeBlock] = []
    lines = text.split("\n")
    i = 0
    while i < len(lines):
        stripped = lines[i].lstrip()
        ticks = _fence_len(stripped)
        if ticks < 3:
            i += 1
            continue
        info = stripped[ticks:]
        fence = "`" * ticks
        # One-line block: ```sql SELECT 1```
        inline = info.rstrip()
        if inline.endswith(fence) and len(inline) > ticks:
            body = inline[:-ticks].strip()
            word, _, rest = body.partition(" ")
            if word.lower() in ("sql", "sqlite"):
                tag, content = word, rest
            else:
                tag, content = "", body
            blocks.append(CodeBlock(tag.lower(), content.strip(), True))
            i += 1
            continue
        tag = info.strip().split(" ", 1)[0].lower() if info.strip() else ""
        body_lines: list[str] = []
        closed = False
        i += 1
        while i < len(lines):
            line = lines[i]
            if _fence_len(line.lstrip()) >= ticks:
                closed = True
                i += 1
                break
            trimmed = line.rstrip()
            if trimmed.endswith(fence):
                body_lines.append(trimmed[:-ticks])
                closed = True
                i += 1
                break
            body_lines.append(line)
            i += 1
        blocks.append(CodeBlock(tag, "\n".join(body_lines).strip(), closed))
    return blocks


def _bare_sql(text: str) -> str | None:
    lines = text.split("\n")
    for k, line in enumerate(lines):
        if _BARE_START.match(line):
            rest = "\n".join(lines[k:])
            # Cut at the first blank line (outside nothing: a blank line ends bare SQL).
            blank = re.search(r"\n[ \t]*\n", rest)
            if blank:
                rest = rest[: blank.start()]
            for tok in tokenize(rest):
                if tok.kind == "semi":
                    rest = rest[: tok.start]
                    break
            return rest.strip() or None
    return None


def extract_sql(completion: str) -> str | None:
    """The SQL that counts in ``completion`` (rules in the module docstring), or ``None``."""
    if not isinstance(completion, str) or not completion.strip():
        return None
    blocks = code_blocks(completion)
    for b in blocks:
        if b.tag == "sql" and b.content:
            return b.content
    for b in blocks:
        if b.content:
            return b.content
    if blocks:
        return None
    return _bare_sql(completion)


def format_ok(completion: str) -> bool:
    """Exactly one closed ```sql block with non-blank content (prose around it allowed)."""
    if not isinstance(completion, str):
        return False
    blocks = code_blocks(completion)
    return len(blocks) == 1 and blocks[0].tag == "sql" and blocks[0].closed and bool(blocks[0].content)


__all__ = ["CodeBlock", "code_blocks", "extract_sql", "format_ok"]
