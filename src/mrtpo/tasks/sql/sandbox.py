"""A hardened, read-only SQLite executor for model-written SQL.

:func:`execute` runs one query against one database file and returns a :class:`QueryResult`:
the columns and rows, or a typed :class:`SandboxError`. It never raises (an unexpected Python
exception becomes ``ErrorKind.INTERNAL``), never writes to the database file and never answers
later than ``kill_grace_s`` (0.25 s) after its deadline, whatever the SQL. The guarantees come in
layers, so that one mistake does not open the file or stall the trainer:

1. **Text checks** before SQLite sees anything: the text must be valid UTF-8 without NUL bytes,
   at most ``max_sql_chars`` long, exactly one non-empty statement (SQLite-faithful lexer, so a
   ``;`` inside a string literal or a comment does not count), starting with SELECT, WITH or
   VALUES.
2. **The connection** (:func:`open_readonly`): URI ``mode=ro`` (SQLite opens the file
   read-only and can never write or create it), ``PRAGMA query_only=1``, ``trusted_schema=0``,
   extension loading disabled, ``SQLITE_LIMIT_ATTACHED = 0`` (no ATTACH, no ``VACUUM INTO``,
   which attaches its target internally), small limits on string length, SQL length, columns,
   expression depth, compound selects, function arguments, LIKE patterns and variables.
   ``printf``/``format`` are replaced by :func:`~mrtpo.tasks.sql.printf_cap.capped_printf`:
   the same output, but a width or precision above ``max_value_bytes`` is TOO_LARGE.
3. **The authorizer**: only SELECT, READ, RECURSIVE and an allow-list of deterministic built-in
   functions are permitted. Everything else is denied: INSERT/UPDATE/DELETE, CREATE/DROP/ALTER
   (tables, temp tables, indexes, triggers, views, virtual tables), ATTACH/DETACH, every PRAGMA,
   transactions and savepoints, ANALYZE, REINDEX, and functions such as ``load_extension``,
   ``random``/``randomblob`` (non-deterministic rewards), ``zeroblob`` and the ``sqlite_*``
   introspection functions. Table-valued functions (``pragma_table_info``, ``json_each``) are
   denied as a side effect (SQLite asks for UPDATE on the schema table when it instantiates
   them).
4. **Bounded execution**: a progress handler aborts the statement once the wall-clock deadline
   has passed (SQLite calls it every ``progress_steps`` virtual-machine instructions), and rows
   are fetched in batches with caps on the number of rows and on the result's size. Inside one
   function call SQLite never calls the handler, so single calls are kept small:
   ``max_value_bytes`` (100 KB) bounds every string, blob and row, and with it the builders
   (``replace``, ``hex``, ``quote``, ``upper``, json, ``||`` in recursive CTEs,
   ``group_concat``) and the quadratic ones (``instr``, ``replace``); their cost at that size is in
   docs/tasks/sql.md.
5. **A killable process**: layers 2-4 run in a pooled worker process
   (:mod:`~mrtpo.tasks.sql.workers`), which the caller kills ``kill_grace_s`` after the
   deadline when it has not answered (e.g. a costly call repeated on every row, between two
   progress checks): TIMEOUT. This is the hard bound; layers 2-4 make it rare, since a kill
   costs a process start (overlapped with the caller's next work).

``immutable=1`` is deliberately *not* used: the SQLite docs say it disables locking and change
detection and that setting it on a file that does change "can result in incorrect query results
and/or SQLITE_CORRUPT errors". ``mode=ro`` alone already guarantees this connection never writes;
``immutable`` would only save the shared lock, and would make results silently wrong if a user
points the loader at a copy of Spider that is being rebuilt.
"""

from __future__ import annotations

import dataclasses
import enum
import os
import sqlite3
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mrtpo.tasks.sql.printf_cap import PrintfTooLarge, capped_printf
from mrtpo.tasks.sql.sqltext import first_keyword, split_statements
from mrtpo.tasks.sql.workers import WorkerPool


class ErrorKind(str, enum.Enum):
    """Why a query produced no result. The value is a short stable string (JSON-friendly)."""

    EMPTY = "empty"  # no SQL at all (only whitespace, comments or semicolons)
    ENCODING = "encoding"  # not valid UTF-8, lone surrogates, or a NUL character
    TOO_LONG = "too_long"  # the SQL text itself exceeds max_sql_chars
    MULTIPLE_STATEMENTS = "multiple_statements"
    FORBIDDEN = "forbidden"  # not a read-only query, or denied by the authorizer
    SYNTAX = "syntax"  # SQLite could not parse it
    TIMEOUT = "timeout"  # ran past the wall-clock deadline
    TOO_LARGE = "too_large"  # result exceeds the row or byte cap, or a value exceeds the length limit
    RUNTIME = "runtime"  # any other SQLite error (no such table/column, datatype mismatch, ...)
    DB_UNAVAILABLE = "db_unavailable"  # the database file is missing or cannot be opened
    INTERNAL = "internal"  # an unexpected Python exception (a sandbox bug; still never raised)


@dataclass(frozen=True)
class SandboxError:
    """A typed failure: ``kind`` for counting and rewards, ``message`` for humans."""

    kind: ErrorKind
    message: str


@dataclass(frozen=True)
class SandboxLimits:
    """Resource limits of one execution. The defaults fit every Spider gold query with room."""

    timeout_s: float = 2.0
    max_rows: int = 10_000
    max_result_bytes: int = 8 * 1024 * 1024
    max_sql_chars: int = 20_000
    # SQLITE_LIMIT_LENGTH (longest string, blob or row; Spider's longest row has 168 bytes) and
    # the printf width/precision cap. Quadratic built-ins (instr, replace) cost ~this squared.
    max_value_bytes: int = 100_000
    progress_steps: int = 1_000  # VM instructions between deadline checks
    fetch_batch: int = 256
    kill_grace_s: float = 0.25  # the worker process is killed this long after the deadline


DEFAULT_LIMITS = SandboxLimits()


@dataclass(frozen=True)
class QueryResult:
    """The outcome of :func:`execute`: columns and rows when ``error`` is ``None``."""

    columns: tuple[str, ...] = ()
    rows: tuple[tuple[Any, ...], ...] = ()
    error: SandboxError | None = None
    elapsed_s: float = 0.0
    result_bytes: int = field(default=0, compare=False)

    @property
    def ok(self) -> bool:
        return self.error is None


# Deterministic, side-effect-free built-ins (core, aggregate, window, date, math, JSON).
# Anything not listed is denied, including load_extension, random, randomblob, zeroblob,
# changes/total_changes/last_insert_rowid, sqlite_version/sqlite_source_id/sqlite_offset/
# sqlite_compileoption_*, fts3_tokenizer and any function a later SQLite version adds.
ALLOWED_FUNCTIONS: frozenset[str] = frozenset(
    """
    abs char coalesce concat concat_ws format glob hex ifnull iif instr length like likelihood
    likely lower ltrim max min nullif octet_length printf quote replace round rtrim sign soundex
    substr substring trim typeof unhex unicode unlikely upper
    avg count group_concat string_agg sum total
    row_number rank dense_rank percent_rank cume_dist ntile lag lead first_value last_value
    nth_value
    date time datetime julianday unixepoch strftime timediff
    acos acosh asin asinh atan atan2 atanh ceil ceiling cos cosh degrees exp floor ln log log10
    log2 mod pi pow power radians sin sinh sqrt tan tanh trunc
    json json_array json_array_length json_extract json_insert json_object json_patch
    json_remove json_replace json_set json_type json_valid json_quote json_group_array
    json_group_object -> ->>
    """.split()
)

_KILLED = "query ran past the deadline where SQLite could not stop it; its worker process was killed"
_WORKERS = WorkerPool(f"{__name__}:run_statement")
_ALLOWED_ACTIONS = frozenset({sqlite3.SQLITE_SELECT, sqlite3.SQLITE_READ, sqlite3.SQLITE_RECURSIVE})
_QUERY_KEYWORDS = frozenset({"SELECT", "WITH", "VALUES"})
# Statement keywords of SQLite that are not queries: rejected as FORBIDDEN before SQLite sees them.
_NON_QUERY_KEYWORDS = frozenset(
    "ALTER ANALYZE ATTACH BEGIN COMMIT CREATE DELETE DETACH DROP END EXPLAIN INSERT PRAGMA REINDEX "
    "RELEASE REPLACE ROLLBACK SAVEPOINT UPDATE UPSERT VACUUM".split()
)

# Action code -> name, for messages (only the authorizer action codes, 1..33).
_ACTION_NAMES = {
    getattr(sqlite3, name): name[len("SQLITE_") :]
    for name in (
        "SQLITE_CREATE_INDEX SQLITE_CREATE_TABLE SQLITE_CREATE_TEMP_INDEX SQLITE_CREATE_TEMP_TABLE "
        "SQLITE_CREATE_TEMP_TRIGGER SQLITE_CREATE_TEMP_VIEW SQLITE_CREATE_TRIGGER SQLITE_CREATE_VIEW "
        "SQLITE_DELETE SQLITE_DROP_INDEX SQLITE_DROP_TABLE SQLITE_DROP_TEMP_INDEX "
        "SQLITE_DROP_TEMP_TABLE SQLITE_DROP_TEMP_TRIGGER SQLITE_DROP_TEMP_VIEW SQLITE_DROP_TRIGGER "
        "SQLITE_DROP_VIEW SQLITE_INSERT SQLITE_PRAGMA SQLITE_READ SQLITE_SELECT SQLITE_TRANSACTION "
        "SQLITE_UPDATE SQLITE_ATTACH SQLITE_DETACH SQLITE_ALTER_TABLE SQLITE_REINDEX SQLITE_ANALYZE "
        "SQLITE_CREATE_VTABLE SQLITE_DROP_VTABLE SQLITE_FUNCTION SQLITE_SAVEPOINT SQLITE_RECURSIVE"
    ).split()
    if hasattr(sqlite3, name)
}


def _limits_table(limits: SandboxLimits) -> list[tuple[int, int]]:
    return [
        (sqlite3.SQLITE_LIMIT_ATTACHED, 0),
        (sqlite3.SQLITE_LIMIT_LENGTH, limits.max_value_bytes),
        (sqlite3.SQLITE_LIMIT_SQL_LENGTH, max(1_000, 4 * limits.max_sql_chars)),
        (sqlite3.SQLITE_LIMIT_COLUMN, 200),
        (sqlite3.SQLITE_LIMIT_EXPR_DEPTH, 200),
        (sqlite3.SQLITE_LIMIT_COMPOUND_SELECT, 50),
        (sqlite3.SQLITE_LIMIT_FUNCTION_ARG, 32),
        (sqlite3.SQLITE_LIMIT_LIKE_PATTERN_LENGTH, 1_000),
        (sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER, 0),
        (sqlite3.SQLITE_LIMIT_TRIGGER_DEPTH, 1),
        (sqlite3.SQLITE_LIMIT_WORKER_THREADS, 0),
    ]


class _Guard:
    """Per-connection state shared by the authorizer and the progress handler."""

    def __init__(self, max_value_bytes: int) -> None:
        self.denied: list[str] = []
        self.too_large: list[str] = []
        self.deadline = float("inf")
        self.timed_out = False
        self.max_value_bytes = max_value_bytes

    def authorize(self, action: int, arg1: Any, arg2: Any, dbname: Any, source: Any) -> int:
        if action in _ALLOWED_ACTIONS:
            return sqlite3.SQLITE_OK
        if action == sqlite3.SQLITE_FUNCTION and str(arg2).lower() in ALLOWED_FUNCTIONS:
            return sqlite3.SQLITE_OK
        what = _ACTION_NAMES.get(action, str(action))
        detail = arg2 if action == sqlite3.SQLITE_FUNCTION else arg1
        self.denied.append(f"{what}({detail})" if detail else what)
        return sqlite3.SQLITE_DENY

    def printf(self, *args: Any) -> Any:
        """SQLite's printf/format with width and precision capped at ``max_value_bytes``."""
        try:
            return capped_printf(self.max_value_bytes, *args)
        except PrintfTooLarge as exc:
            self.too_large.append(str(exc))
            raise

    def progress(self) -> int:
        if time.monotonic() > self.deadline:
            self.timed_out = True
            return 1  # non-zero interrupts the running statement
        return 0


def _decode_text(raw: bytes) -> str:
    # Stored TEXT that is not valid UTF-8 must not crash a fetch.
    return raw.decode("utf-8", errors="replace")


def open_readonly(db_path: str | Path, limits: SandboxLimits = DEFAULT_LIMITS) -> tuple[sqlite3.Connection, _Guard]:
    """Open ``db_path`` read-only with every protection of layers 2 and 3 installed.

    Raises ``FileNotFoundError`` when the file does not exist (SQLite would otherwise report a
    generic "unable to open"). The caller owns the connection and must close it.
    """
    path = Path(db_path).resolve()
    if not path.is_file():
        raise FileNotFoundError(f"database file not found: {path}")
    uri = path.as_uri() + "?mode=ro"
    con = sqlite3.connect(uri, uri=True, isolation_level=None, check_same_thread=False)
    try:
        con.text_factory = _decode_text
        if hasattr(con, "enable_load_extension"):
            con.enable_load_extension(False)
        # Set before the authorizer exists, which then denies every later PRAGMA.
        con.execute("PRAGMA query_only = 1")
        con.execute("PRAGMA trusted_schema = 0")
        for limit_id, value in _limits_table(limits):
            con.setlimit(limit_id, value)
        guard = _Guard(limits.max_value_bytes)
        for name in ("printf", "format"):
            con.create_function(name, -1, guard.printf, deterministic=True)
        con.set_authorizer(guard.authorize)
        con.set_progress_handler(guard.progress, max(1, limits.progress_steps))
    except BaseException:
        con.close()
        raise
    return con, guard


def _value_bytes(value: Any) -> int:
    if isinstance(value, str):
        return len(value) + 1
    if isinstance(value, bytes):
        return len(value) + 1
    return 9


def _classify(exc: sqlite3.Error, guard: _Guard) -> SandboxError:
    msg = str(exc)
    low = msg.lower()
    if guard.timed_out or low == "interrupted":
        return SandboxError(ErrorKind.TIMEOUT, "query ran past the deadline and was interrupted")
    if guard.too_large:
        return SandboxError(ErrorKind.TOO_LARGE, "; ".join(dict.fromkeys(guard.too_large)))
    if guard.denied or "not authorized" in low or "prohibited" in low:
        what = ", ".join(dict.fromkeys(guard.denied)) or msg
        return SandboxError(ErrorKind.FORBIDDEN, f"read-only sandbox denied: {what}")
    if "one statement at a time" in low:
        return SandboxError(ErrorKind.MULTIPLE_STATEMENTS, msg)
    if "readonly" in low or "read-only" in low or "attach" in low:
        return SandboxError(ErrorKind.FORBIDDEN, msg)
    if "syntax error" in low or "unrecognized token" in low or "incomplete input" in low:
        return SandboxError(ErrorKind.SYNTAX, msg)
    if "variable" in low or "bindings" in low:
        return SandboxError(ErrorKind.RUNTIME, f"{msg} (query parameters are not supported)")
    if "too big" in low or "too large" in low or "too many" in low or "stack overflow" in low:
        return SandboxError(ErrorKind.TOO_LARGE, msg)
    return SandboxError(ErrorKind.RUNTIME, msg)


def _check_text(sql: Any, limits: SandboxLimits) -> tuple[str | None, SandboxError | None]:
    """Layer 1: returns the single statement to run, or the reason there is none."""
    if isinstance(sql, (bytes, bytearray, memoryview)):
        if len(sql) > 4 * limits.max_sql_chars:
            return None, SandboxError(ErrorKind.TOO_LONG, f"SQL text longer than {limits.max_sql_chars} characters")
        try:
            sql = bytes(sql).decode("utf-8")
        except UnicodeDecodeError as exc:
            return None, SandboxError(ErrorKind.ENCODING, f"SQL bytes are not valid UTF-8: {exc}")
    if not isinstance(sql, str):
        return None, SandboxError(ErrorKind.ENCODING, f"SQL must be str or bytes, got {type(sql).__name__}")
    if len(sql) > limits.max_sql_chars:
        return None, SandboxError(
            ErrorKind.TOO_LONG, f"SQL text has {len(sql)} characters (limit {limits.max_sql_chars})"
        )
    try:
        sql.encode("utf-8")
    except UnicodeEncodeError as exc:
        return None, SandboxError(ErrorKind.ENCODING, f"SQL text is not encodable as UTF-8 (lone surrogate?): {exc}")
    if "\x00" in sql:
        return None, SandboxError(ErrorKind.ENCODING, "SQL text contains a NUL character")
    statements = split_statements(sql)
    if not statements:
        return None, SandboxError(ErrorKind.EMPTY, "no SQL statement (only whitespace, comments or ';')")
    stmt = statements[0]
    keyword = first_keyword(stmt)
    # A non-query first statement is FORBIDDEN even when it looks like several statements
    # (a CREATE TRIGGER body holds semicolons).
    if len(statements) > 1 and keyword not in _NON_QUERY_KEYWORDS:
        return None, SandboxError(
            ErrorKind.MULTIPLE_STATEMENTS, f"{len(statements)} statements; exactly one query is allowed"
        )
    if keyword in _NON_QUERY_KEYWORDS:
        return None, SandboxError(
            ErrorKind.FORBIDDEN, f"only SELECT / WITH / VALUES queries are allowed, got {keyword}"
        )
    if keyword not in _QUERY_KEYWORDS:
        return None, SandboxError(
            ErrorKind.SYNTAX, f"a query must start with SELECT, WITH or VALUES, got {stmt[:20]!r}"
        )
    return stmt, None


def _internal(exc: Exception, t0: float) -> QueryResult:
    """A sandbox bug as a typed result: it must not reach the trainer."""
    return QueryResult(
        error=SandboxError(ErrorKind.INTERNAL, f"{type(exc).__name__}: {exc}"),
        elapsed_s=time.monotonic() - t0,
    )


def execute(db_path: str | Path, sql: Any, limits: SandboxLimits = DEFAULT_LIMITS) -> QueryResult:
    """Run one read-only query on ``db_path`` within ``limits``. Never raises.

    Layer 1 runs here; layers 2-4 run in a pooled worker process (:func:`run_statement`), which
    is killed when no answer has come ``kill_grace_s`` after the deadline.
    """
    t0 = time.monotonic()
    try:
        stmt, err = _check_text(sql, limits)
        if err is not None:
            return QueryResult(error=err, elapsed_s=time.monotonic() - t0)
        args = (os.path.abspath(db_path), stmt, limits)
        result = _WORKERS.call(args, t0 + limits.timeout_s, limits.kill_grace_s)
        if result is None:
            result = QueryResult(error=SandboxError(ErrorKind.TIMEOUT, _KILLED))
        return dataclasses.replace(result, elapsed_s=time.monotonic() - t0)
    except Exception as exc:
        return _internal(exc, t0)


def run_statement(db_path: str, stmt: str, limits: SandboxLimits, timeout_s: float) -> QueryResult:
    """Layers 2-4 in this process: run ``stmt`` (already through layer 1) for at most about
    ``timeout_s`` seconds, as far as the progress handler can tell. Never raises."""
    t0 = time.monotonic()
    try:
        return _run(db_path, stmt, limits, t0, timeout_s)
    except Exception as exc:
        return _internal(exc, t0)


def _run(db_path: str, stmt: str, limits: SandboxLimits, t0: float, timeout_s: float) -> QueryResult:
    try:
        con, guard = open_readonly(db_path, limits)
    except (OSError, sqlite3.Error) as exc:
        return QueryResult(
            error=SandboxError(ErrorKind.DB_UNAVAILABLE, f"cannot open database {db_path}: {exc}"),
            elapsed_s=time.monotonic() - t0,
        )
    try:
        guard.deadline = t0 + timeout_s
        rows: list[tuple[Any, ...]] = []
        nbytes = 0
        try:
            cur = con.execute(stmt)
            columns = tuple(d[0] for d in (cur.description or ()))
            while True:
                batch = cur.fetchmany(limits.fetch_batch)
                if not batch:
                    break
                for row in batch:
                    nbytes += sum(_value_bytes(v) for v in row) + 8
                rows.extend(batch)
                if len(rows) > limits.max_rows:
                    return QueryResult(
                        error=SandboxError(ErrorKind.TOO_LARGE, f"more than {limits.max_rows} rows"),
                        elapsed_s=time.monotonic() - t0,
                    )
                if nbytes > limits.max_result_bytes:
                    return QueryResult(
                        error=SandboxError(ErrorKind.TOO_LARGE, f"result larger than {limits.max_result_bytes} bytes"),
                        elapsed_s=time.monotonic() - t0,
                    )
                if time.monotonic() > guard.deadline:
                    guard.timed_out = True
                    raise sqlite3.OperationalError("interrupted")
        except sqlite3.Error as exc:
            return QueryResult(error=_classify(exc, guard), elapsed_s=time.monotonic() - t0)
        except (ValueError, OverflowError, MemoryError, UnicodeError) as exc:
            kind = ErrorKind.TOO_LARGE if isinstance(exc, (OverflowError, MemoryError)) else ErrorKind.RUNTIME
            return QueryResult(
                error=SandboxError(kind, f"{type(exc).__name__}: {exc}"), elapsed_s=time.monotonic() - t0
            )
        if cur.description is None:
            # Not a row-returning statement (cannot happen after layer 1; be explicit anyway).
            return QueryResult(
                error=SandboxError(ErrorKind.FORBIDDEN, "statement returns no result columns"),
                elapsed_s=time.monotonic() - t0,
            )
        return QueryResult(columns=columns, rows=tuple(rows), elapsed_s=time.monotonic() - t0, result_bytes=nbytes)
    finally:
        con.close()


__all__ = [
    "ALLOWED_FUNCTIONS",
    "DEFAULT_LIMITS",
    "ErrorKind",
    "QueryResult",
    "SandboxError",
    "SandboxLimits",
    "execute",
    "open_readonly",
    "run_statement",
]
