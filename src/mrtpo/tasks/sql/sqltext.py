"""A small SQLite-faithful lexer for SQL *text*: statement splitting and top-level clause checks.

It follows SQLite's own tokenizer rules for the constructs that can hide a ``;`` or a keyword:
``'...'`` strings (``''`` escapes a quote), ``"..."``, ```...``` and ``[...]`` identifiers,
``-- ...`` line comments and ``/* ... */`` block comments (an unterminated block comment runs to
the end of the text, as in SQLite). It never evaluates SQL; the sandbox uses it to reject
multi-statement input before SQLite sees it, and the comparison uses it to find a top-level
``ORDER BY``. Naively splitting on ``;`` would break on ``'a;b'`` or ``-- ;``.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

_WS = " \t\n\r\f\v"


@dataclass(frozen=True)
class Token:
    """One lexical token: ``kind`` is ws, comment, string, ident, word, semi, lparen, rparen or other."""

    kind: str
    text: str
    start: int
    end: int


def _is_word_char(ch: str) -> bool:
    # SQLite treats every character >= 0x80 as an identifier character.
    return ch.isalnum() or ch in "_$" or ord(ch) >= 0x80


def tokenize(sql: str) -> Iterator[Token]:
    """Yield the tokens of ``sql`` in order; every character belongs to exactly one token."""
    i, n = 0, len(sql)
    while i < n:
        ch = sql[i]
        start = i
        if ch in _WS:
            while i < n and sql[i] in _WS:
                i += 1
            kind = "ws"
        elif sql.startswith("--", i):
            j = sql.find("\n", i)
            i = n if j < 0 else j + 1
            kind = "comment"
        elif sql.startswith("/*", i):
            j = sql.find("*/", i + 2)
            i = n if j < 0 else j + 2
            kind = "comment"
        elif ch in "'\"`":
            # Quoted string or identifier; a doubled quote character escapes itself.
            i += 1
            while True:
                j = sql.find(ch, i)
                if j < 0:
                    i = n
                    break
                if j + 1 < n and sql[j + 1] == ch:
                    i = j + 2
                    continue
                i = j + 1
                break
            kind = "string" if ch == "'" else "ident"
        elif ch == "[":
            j = sql.find("]", i + 1)
            i = n if j < 0 else j + 1
            kind = "ident"
        elif ch == ";":
            i += 1
            kind = "semi"
        elif ch == "(":
            i += 1
            kind = "lparen"
        elif ch == ")":
            i += 1
            kind = "rparen"
        elif _is_word_char(ch):
            while i < n and _is_word_char(sql[i]):
                i += 1
            kind = "word"
        else:
            i += 1
            kind = "other"
        yield Token(kind, sql[start:i], start, i)


def _significant(tok: Token) -> bool:
    return tok.kind not in ("ws", "comment")


def split_statements(sql: str) -> list[str]:
    """The non-empty statements of ``sql``, each without its terminating ``;``.

    A statement is empty when it holds only whitespace and comments, so ``"SELECT 1;;  -- x"``
    is one statement. Each returned string is an exact slice of ``sql`` (comments inside kept),
    running from the statement's first to its last significant token.
    """
    out: list[str] = []
    first: int | None = None
    last = 0
    for tok in tokenize(sql):
        if tok.kind == "semi":
            if first is not None:
                out.append(sql[first:last])
            first = None
        elif _significant(tok):
            if first is None:
                first = tok.start
            last = tok.end
    if first is not None:
        out.append(sql[first:last])
    return out


def significant_tokens(sql: str) -> list[Token]:
    """Tokens other than whitespace and comments."""
    return [t for t in tokenize(sql) if _significant(t)]


def first_keyword(sql: str) -> str | None:
    """The first significant token, upper-cased, when it is a bare word (else ``None``)."""
    for tok in tokenize(sql):
        if _significant(tok):
            return tok.text.upper() if tok.kind == "word" else None
    return None


def has_top_level_order_by(sql: str) -> bool:
    """True when ``ORDER BY`` appears outside every parenthesis (CTE bodies, subqueries and
    window specifications are inside parentheses, so they do not count)."""
    depth = 0
    prev_order = False
    for tok in significant_tokens(sql):
        if tok.kind == "lparen":
            depth += 1
        elif tok.kind == "rparen":
            depth = max(0, depth - 1)
        if tok.kind == "word" and depth == 0:
            word = tok.text.upper()
            if prev_order and word == "BY":
                return True
            prev_order = word == "ORDER"
        else:
            prev_order = False
    return False


__all__ = [
    "Token",
    "first_keyword",
    "has_top_level_order_by",
    "significant_tokens",
    "split_statements",
    "tokenize",
]
