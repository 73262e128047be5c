"""Completion parsing (which SQL counts, the format rule) and the SQL lexer."""

from __future__ import annotations

import sqlite3
import time

import pytest
from hypothesis import given, settings, strategies as st

from mrtpo.tasks.sql.parse import code_blocks, extract_sql, format_ok
from mrtpo.tasks.sql.sqltext import first_keyword, has_top_level_order_by, split_statements, tokenize

# ---------------------------------------------------------------- extract_sql / format_ok


@pytest.mark.parametrize(
    "completion, sql, fmt",
    [
        ("```sql\nSELECT count(*) FROM pets\n```", "SELECT count(*) FROM pets", True),
        ("Here is the query:\n\n```sql\nSELECT 1;\n```\n\nIt counts rows.", "SELECT 1;", True),
        ("```SQL\nSELECT 1\n```", "SELECT 1", True),
        ("  ```sql\n  SELECT 1\n  ```", "SELECT 1", True),  # indented fences
        ("```sql\nSELECT 1;```", "SELECT 1;", True),  # closing fence on the code line
        ("```sql SELECT 1 ```", "SELECT 1", True),  # one-line block
        ("```sql\r\nSELECT 1\r\n```\r\n", "SELECT 1", True),  # CRLF
        # unclosed (cut at max_new_tokens): SQL still extracted, format fails
        ("```sql\nSELECT name FROM city WHERE", "SELECT name FROM city WHERE", False),
        # several blocks: the first sql block counts, format fails
        ("```sql\nSELECT 1\n```\nor\n```sql\nSELECT 2\n```", "SELECT 1", False),
        ("```python\nprint(1)\n```\n```sql\nSELECT 2\n```", "SELECT 2", False),
        # untagged or other tag: used as SQL, but not the instructed format
        ("```\nSELECT 1\n```", "SELECT 1", False),
        ("```sqlite\nSELECT 1\n```", "SELECT 1", False),
        # bare SQL: up to the first ';' or blank line
        ("SELECT name FROM city;\nThis returns names.", "SELECT name FROM city", False),
        ("SELECT name\nFROM city\n\nThis query returns all names.", "SELECT name\nFROM city", False),
        ("The answer is:\nWITH t AS (SELECT 1) SELECT * FROM t", "WITH t AS (SELECT 1) SELECT * FROM t", False),
        ("SELECT 'a;b' FROM t; trailing", "SELECT 'a;b' FROM t", False),
        # nothing usable
        ("I don't know.", None, False),
        ("", None, False),
        ("```sql\n\n```", None, False),
    ],
)
def test_extract_and_format(completion: str, sql: str | None, fmt: bool) -> None:
    assert extract_sql(completion) == sql
    assert format_ok(completion) is fmt


def test_non_string_completions_are_handled() -> None:
    for bad in (None, 3, b"```sql\nSELECT 1\n```"):
        assert extract_sql(bad) is None  # type: ignore[arg-type]
        assert format_ok(bad) is False  # type: ignore[arg-type]


def test_code_blocks_report_tags_and_closure() -> None:
    blocks = code_blocks("a\n```sql\nX\n```\nb\n```\nY\n```\n````md\nZ\n")
    assert [(b.tag, b.content, b.closed) for b in blocks] == [
        ("sql", "X", True),
        ("", "Y", True),
        ("md", "Z", False),
    ]


def test_parser_is_linear_on_enormous_completions() -> None:
    text = "```sql\n" * 20_000 + "SELECT 1 " * 100_000
    t0 = time.monotonic()
    extract_sql(text)
    format_ok(text)
    extract_sql("x\n" * 200_000 + "SELECT 1")
    assert time.monotonic() - t0 < 2.0


# ---------------------------------------------------------------- lexer


@pytest.mark.parametrize(
    "sql, statements",
    [
        ("SELECT 1", ["SELECT 1"]),
        ("SELECT 1;", ["SELECT 1"]),
        ("SELECT 1;;; -- done\n", ["SELECT 1"]),
        ("SELECT 'a;b'", ["SELECT 'a;b'"]),
        ("SELECT 'it''s;' ; SELECT 2", ["SELECT 'it''s;'", "SELECT 2"]),
        ('SELECT "a;b" FROM t', ['SELECT "a;b" FROM t']),
        ("SELECT `a;b`, [c;d] FROM t", ["SELECT `a;b`, [c;d] FROM t"]),
        ("SELECT 1 -- ; DROP\n", ["SELECT 1"]),
        ("SELECT 1 /* ; */ + 2", ["SELECT 1 /* ; */ + 2"]),
        ("SELECT 1; -- x\nDROP TABLE t", ["SELECT 1", "DROP TABLE t"]),
        ("SELECT 1 /* unterminated ; DROP", ["SELECT 1"]),
        ("/* c */ ; -- d\n ;", []),
        ("", []),
    ],
)
def test_split_statements(sql: str, statements: list[str]) -> None:
    assert split_statements(sql) == statements


def test_tokens_cover_the_text_exactly() -> None:
    sql = "SELECT 'a''b', \"c\" /* x */ -- y\n FROM [t] WHERE `u` = 1;"
    toks = list(tokenize(sql))
    assert "".join(t.text for t in toks) == sql
    assert [t.kind for t in toks if t.kind not in ("ws",)][:4] == ["word", "string", "other", "ident"]


@given(st.text(alphabet="SELCT 1;'\"-/*\n[]`ab", max_size=40))
@settings(max_examples=300, deadline=None, derandomize=True)
def test_statement_completeness_agrees_with_sqlite(sql: str) -> None:
    """SQLite's own tokenizer: text ending in ';' outside strings/comments is 'complete'.

    Whenever our lexer sees a terminating ';' as the last significant token, SQLite must also
    consider the text a complete statement, and vice versa. One documented difference:
    sqlite3_complete() calls a text ending inside an unterminated ``/*`` comment incomplete,
    while SQLite's execution tokenizer (which the sandbox follows) reads it as a comment to the
    end of the text.
    """
    toks = list(tokenize(sql))
    sig = [t for t in toks if t.kind not in ("ws", "comment")]
    ours = bool(sig) and sig[-1].kind == "semi" and sig[-1].text == ";"
    last = toks[-1] if toks else None
    if last is not None and last.kind == "comment" and last.text.startswith("/*"):
        if len(last.text) < 4 or not last.text.endswith("*/"):
            ours = False
    assert ours == sqlite3.complete_statement(sql)


@pytest.mark.parametrize(
    "sql, ordered",
    [
        ("SELECT name FROM t ORDER BY age", True),
        ("select name from t order\n  by age desc limit 1", True),
        ("SELECT a FROM t UNION SELECT b FROM u ORDER BY 1", True),
        ("SELECT name FROM t", False),
        ("SELECT name FROM (SELECT name FROM t ORDER BY age)", False),
        ("WITH x AS (SELECT * FROM t ORDER BY a) SELECT * FROM x", False),
        ("SELECT row_number() OVER (ORDER BY a) FROM t", False),
        ("SELECT 'ORDER BY' FROM t", False),
        ('SELECT "order" FROM t -- ORDER BY x', False),
        ("SELECT border, by FROM t", False),
    ],
)
def test_top_level_order_by(sql: str, ordered: bool) -> None:
    assert has_top_level_order_by(sql) is ordered


def test_first_keyword() -> None:
    assert first_keyword("  -- c\n /* d */ select 1") == "SELECT"
    assert first_keyword("(SELECT 1)") is None
    assert first_keyword("") is None
