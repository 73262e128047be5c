"""Prompt building: the schema block (the database's own DDL), the question, the format sentence.

The user message is three paragraphs separated by blank lines::

    <schema block>            <- evidence of `executes` (in_prompt)

    Question: <question>

    <FORMAT_INSTRUCTION>      <- evidence of `format` (in_prompt)

Removing the schema block or the format sentence leaves a well-formed message (a question with
or without the instruction). The schema block starts with a header line and then holds, per
table, the ``CREATE TABLE`` statement exactly as stored in ``sqlite_master`` (SQLite's internal
``sqlite_*`` tables excluded) and, optionally, the first ``k`` rows in rowid order as a
``/* ... */`` comment (values over 60 characters are cut).
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

from mrtpo.tasks.sql.sandbox import execute

FORMAT_INSTRUCTION = "Answer with exactly one SQL query in a ```sql code block."
SYSTEM_PROMPT = "You are an expert in SQLite. You write correct queries for the user's database."
SCHEMA_HEADER = "SQLite database schema:"


def _quote_ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _fmt_value(v: Any, width: int = 60) -> str:
    if v is None:
        return "NULL"
    s = v.hex() if isinstance(v, bytes) else str(v)
    s = s.replace("\n", " ").replace("\t", " ")
    return s if len(s) <= width else s[: width - 3] + "..."


@functools.lru_cache(maxsize=64)
def schema_block(db_path: str, sample_rows: int = 3) -> str:
    """The schema block for ``db_path`` (cached: the files are read-only)."""
    res = execute(
        Path(db_path),
        "SELECT name, sql FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite!_%' ESCAPE '!' "
        "AND sql IS NOT NULL ORDER BY rowid",
    )
    if not res.ok:
        raise RuntimeError(f"cannot read the schema of {db_path}: {res.error}")
    parts = [SCHEMA_HEADER]
    for name, ddl in res.rows:
        part = ddl.strip().rstrip(";") + ";"
        if sample_rows > 0:
            rows = execute(Path(db_path), f"SELECT * FROM {_quote_ident(name)} LIMIT {int(sample_rows)}")
            if rows.ok and rows.rows:
                lines = [f"/* {len(rows.rows)} example rows from {name}:", "\t".join(rows.columns)]
                lines += ["\t".join(_fmt_value(v) for v in r) for r in rows.rows]
                part += "\n" + "\n".join(lines) + "\n*/"
        parts.append(part)
    return "\n\n".join(parts)


def user_message(schema: str, question: str) -> str:
    return f"{schema}\n\nQuestion: {question.strip()}\n\n{FORMAT_INSTRUCTION}"


def build_messages(schema: str, question: str) -> list[dict[str, str]]:
    """Chat messages for one question (a system turn and one user turn)."""
    return [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": user_message(schema, question)},
    ]


__all__ = ["FORMAT_INSTRUCTION", "SCHEMA_HEADER", "SYSTEM_PROMPT", "build_messages", "schema_block", "user_message"]
