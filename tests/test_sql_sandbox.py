"""The SQLite sandbox against hostile SQL, on the real world_1 database.

Most checks run on a *writable* temporary copy of world_1 (in pytest's tmp_path, outside the
repo): the shared data folder is read-only at the OS level, so only a writable copy shows that
the sandbox itself, and not file permissions, keeps the file unchanged. A final test replays
everything on the shared read-only file too and checks its README hash.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sqlite3
import stat
import time
from pathlib import Path

import pytest

from mrtpo.tasks.sql.loader import SHA256, db_path, find_spider_dir
from mrtpo.tasks.sql.sandbox import ErrorKind, SandboxLimits, execute, open_readonly

DEADLINE = 0.5
MARGIN = 0.5  # generous for 2 shared cores; the deadline itself is checked every 1000 VM steps
LIMITS = SandboxLimits(timeout_s=DEADLINE)


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def real_world() -> Path:
    return db_path(find_spider_dir(), "world_1")


@pytest.fixture()
def world(tmp_path: Path, real_world: Path) -> Path:
    """A writable copy of world_1 in its own folder (so side files would be visible)."""
    d = tmp_path / "db"
    d.mkdir()
    p = d / "world_1.sqlite"
    shutil.copyfile(real_world, p)
    p.chmod(stat.S_IRUSR | stat.S_IWUSR)
    assert os.access(p, os.W_OK)
    return p


def _assert_untouched(path: Path, before: str) -> None:
    assert _sha(path) == before
    # No journal, WAL, shm or any other file appeared next to the database.
    assert sorted(x.name for x in path.parent.iterdir()) == [path.name]


def test_ok_query_gives_known_rows(world: Path) -> None:
    r = execute(world, "SELECT Name, Population FROM city ORDER BY Population DESC LIMIT 2", LIMITS)
    assert r.ok and r.error is None
    assert r.columns == ("Name", "Population")
    assert r.rows == (("Mumbai (Bombay)", 10500000), ("Seoul", 9981619))
    assert execute(world, "SELECT count(*) FROM city", LIMITS).rows == ((4079,),)


HOSTILE_WRITES = [
    # statement keyword gate (layer 1)
    "INSERT INTO city (Name) VALUES ('x')",
    "UPDATE city SET Population = 0",
    "DELETE FROM city",
    "REPLACE INTO city (ID, Name) VALUES (1, 'x')",
    "DROP TABLE city",
    "ALTER TABLE city ADD COLUMN x",
    "CREATE TABLE t (x)",
    "CREATE TEMP TABLE t (x)",
    "CREATE INDEX i ON city (Name)",
    "CREATE VIEW v AS SELECT 1",
    "CREATE TRIGGER tr AFTER INSERT ON city BEGIN DELETE FROM city; END",
    "CREATE VIRTUAL TABLE v USING fts5(x)",
    "PRAGMA journal_mode = WAL",
    "PRAGMA writable_schema = 1",
    "PRAGMA query_only = 0",
    "PRAGMA table_info(city)",
    "BEGIN",
    "SAVEPOINT s",
    "VACUUM",
    "ANALYZE",
    "REINDEX",
    "EXPLAIN SELECT 1",
    # pass the gate (start with WITH/SELECT): the authorizer must deny them (layer 3)
    "WITH x AS (SELECT 1) INSERT INTO city (Name) SELECT 'x' FROM x",
    "WITH x AS (SELECT 1) UPDATE city SET Population = 0",
    "WITH x AS (SELECT 1) DELETE FROM city",
    "SELECT load_extension('/tmp/evil.so')",
    "SELECT * FROM pragma_table_info('city')",
    "SELECT random()",
    "SELECT randomblob(10)",
    "SELECT sqlite_version()",
    "SELECT zeroblob(1000000000)",
]


@pytest.mark.parametrize("sql", HOSTILE_WRITES)
def test_writes_and_side_effects_are_forbidden(world: Path, sql: str) -> None:
    before = _sha(world)
    t0 = time.monotonic()
    r = execute(world, sql, LIMITS)
    assert time.monotonic() - t0 < 0.2
    assert not r.ok and r.rows == ()
    assert r.error.kind is ErrorKind.FORBIDDEN, r.error
    _assert_untouched(world, before)


def test_attach_and_vacuum_into_create_no_file(world: Path, tmp_path: Path) -> None:
    before = _sha(world)
    target = tmp_path / "stolen.db"
    for sql in (
        f"ATTACH DATABASE '{target}' AS x",
        f"VACUUM INTO '{target}'",
        "DETACH DATABASE main",
    ):
        r = execute(world, sql, LIMITS)
        assert r.error is not None and r.error.kind is ErrorKind.FORBIDDEN, (sql, r.error)
    assert not target.exists()
    _assert_untouched(world, before)


def test_connection_layer_alone_denies_writes(world: Path, tmp_path: Path) -> None:
    """Layers 2-3 without the keyword gate: raw statements on the hardened connection fail."""
    before = _sha(world)
    target = tmp_path / "copy.db"
    con, guard = open_readonly(world, LIMITS)
    try:
        for sql in (
            "INSERT INTO city (Name) VALUES ('x')",
            "DELETE FROM city",
            "DROP TABLE city",
            "CREATE TEMP TABLE t (x)",
            "CREATE TEMP VIEW v AS SELECT 1",
            "CREATE TEMP TRIGGER tr AFTER INSERT ON city BEGIN SELECT 1; END",
            f"ATTACH DATABASE '{target}' AS x",
            f"VACUUM INTO '{target}'",
            "PRAGMA query_only = 0",
            "PRAGMA journal_mode = WAL",
            "BEGIN IMMEDIATE",
            "SAVEPOINT s",
            "ANALYZE",
            "VACUUM",
        ):
            with pytest.raises(sqlite3.Error):
                con.execute(sql)
        # reading still works afterwards
        assert con.execute("SELECT count(*) FROM country").fetchone() == (239,)
        assert guard.denied  # the authorizer, not only mode=ro, refused them
    finally:
        con.close()
    assert not target.exists()
    _assert_untouched(world, before)


def test_mode_ro_without_authorizer_cannot_write(world: Path) -> None:
    """Layer 2 alone: the URI mode=ro connection refuses writes even on a writable file."""
    before = _sha(world)
    con, _ = open_readonly(world, LIMITS)
    con.set_authorizer(None)
    try:
        with pytest.raises(sqlite3.OperationalError, match="readonly|read-only"):
            con.execute("DELETE FROM city")
    finally:
        con.close()
    _assert_untouched(world, before)


SLOW_QUERIES = [
    # never-ending recursive CTEs
    "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT count(*) FROM c",
    "WITH RECURSIVE c(x) AS (SELECT 1 UNION SELECT x + 1 FROM c) SELECT max(x) FROM c",
    # 4-way cartesian product of world_1's city table (4079^4 ≈ 2.8e14 rows)
    "SELECT count(*) FROM city a, city b, city c, city d",
    "SELECT a.Name FROM city a, city b, city c, city d ORDER BY a.Name || b.Name || c.Name || d.Name LIMIT 1",
    "SELECT a.Name || b.Name, count(*) FROM city a, city b, city c GROUP BY 1 ORDER BY 2 DESC LIMIT 1",
    "SELECT count(*) FROM city a JOIN city b ON a.Name LIKE '%' || b.Name || '%'",
]


@pytest.mark.parametrize("sql", SLOW_QUERIES)
def test_never_ending_queries_stop_at_the_deadline(world: Path, sql: str) -> None:
    before = _sha(world)
    t0 = time.monotonic()
    r = execute(world, sql, LIMITS)
    elapsed = time.monotonic() - t0
    assert r.error is not None and r.error.kind is ErrorKind.TIMEOUT, r.error
    assert DEADLINE * 0.9 <= elapsed < DEADLINE + MARGIN
    _assert_untouched(world, before)


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT * FROM city a, city b",  # 16.6M rows
        "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT x FROM c",
        "WITH RECURSIVE c(x) AS (SELECT 'a' UNION ALL SELECT x || x FROM c) SELECT length(x) FROM c",
        "SELECT replace(printf('%.*c', 900000, 'x'), 'x', 'xx')",  # 1.8 MB > SQLITE_LIMIT_LENGTH
        "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 100000) "
        "SELECT group_concat(x) || group_concat(x) || group_concat(x) FROM c",
    ],
)
def test_huge_results_are_capped(world: Path, sql: str) -> None:
    before = _sha(world)
    t0 = time.monotonic()
    r = execute(world, sql, LIMITS)
    assert time.monotonic() - t0 < DEADLINE + MARGIN
    assert r.error is not None and r.error.kind in (ErrorKind.TOO_LARGE, ErrorKind.TIMEOUT), r.error
    assert r.rows == ()
    _assert_untouched(world, before)


def test_row_and_byte_caps_are_exact(world: Path) -> None:
    lim = SandboxLimits(timeout_s=DEADLINE, max_rows=4079)
    assert len(execute(world, "SELECT ID FROM city", lim).rows) == 4079
    r = execute(world, "SELECT ID FROM city", SandboxLimits(timeout_s=DEADLINE, max_rows=4078))
    assert r.error.kind is ErrorKind.TOO_LARGE
    r = execute(world, "SELECT * FROM city", SandboxLimits(timeout_s=DEADLINE, max_result_bytes=10_000))
    assert r.error.kind is ErrorKind.TOO_LARGE and "bytes" in r.error.message


@pytest.mark.parametrize(
    "sql, kind",
    [
        ("SELECT 1; DROP TABLE city", ErrorKind.MULTIPLE_STATEMENTS),
        ("SELECT 1; SELECT 2", ErrorKind.MULTIPLE_STATEMENTS),
        ("SELECT 1 /* ; */; DELETE FROM city -- ;", ErrorKind.MULTIPLE_STATEMENTS),
        ("SELECT Name FROM city WHERE Name = 'x'; -- ok\nDELETE FROM city", ErrorKind.MULTIPLE_STATEMENTS),
        ("SELECT 'it''s; DROP TABLE city' AS s; DROP TABLE city", ErrorKind.MULTIPLE_STATEMENTS),
        ("", ErrorKind.EMPTY),
        ("  -- only a comment\n ;; /* and this */ ;", ErrorKind.EMPTY),
        ("SELECT '\ud800'", ErrorKind.ENCODING),
        ("SELECT 1\x00; DROP TABLE city", ErrorKind.ENCODING),
        (b"SELECT '\xff\xfe'", ErrorKind.ENCODING),
        ("SELECT 1 " + "-" * 100_000, ErrorKind.TOO_LONG),
        ("SELECT " + " + ".join(["1"] * 50_000), ErrorKind.TOO_LONG),
        ("selec Name from city", ErrorKind.SYNTAX),
        ("SELECT Name FROM city WHERE", ErrorKind.SYNTAX),
        ("SELECT 'unterminated FROM city", ErrorKind.SYNTAX),
        ("SELECT nope FROM city", ErrorKind.RUNTIME),
        ("SELECT * FROM nowhere", ErrorKind.RUNTIME),
        ("SELECT * FROM city WHERE ID = ?", ErrorKind.RUNTIME),
        ("SELECT " + "(" * 400 + "1" + ")" * 400, ErrorKind.TOO_LARGE),
        (12345, ErrorKind.ENCODING),
        (None, ErrorKind.ENCODING),
    ],
)
def test_malformed_input_gives_typed_errors(world: Path, sql: object, kind: ErrorKind) -> None:
    before = _sha(world)
    t0 = time.monotonic()
    r = execute(world, sql, LIMITS)
    assert time.monotonic() - t0 < 0.3
    assert r.error is not None and r.error.kind is kind, r.error
    _assert_untouched(world, before)


@pytest.mark.parametrize(
    "sql, rows",
    [
        ("SELECT 'a;b' AS s;", (("a;b",),)),
        ("SELECT 'x' -- ; DROP TABLE city\n;", (("x",),)),
        ("SELECT 1 /* ; DROP TABLE city; */ ;;  ", ((1,),)),
        ('SELECT count(*) FROM "city" WHERE "Name" = \'Kabul\'', ((1,),)),
        ("SELECT count(*) FROM [city] WHERE `Name` = 'Kabul'", ((1,),)),
        ("VALUES (1, 'é'), (2, '北京')", ((1, "é"), (2, "北京"))),
        ("SELECT x'00ff'", ((b"\x00\xff",),)),
        ("WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 5) SELECT sum(x) FROM c", ((15,),)),
    ],
)
def test_tricky_but_valid_single_queries_run(world: Path, sql: str, rows: tuple) -> None:
    r = execute(world, sql, LIMITS)
    assert r.ok, r.error
    assert r.rows == rows


def test_missing_database_is_a_typed_error(tmp_path: Path) -> None:
    r = execute(tmp_path / "nope.sqlite", "SELECT 1", LIMITS)
    assert r.error.kind is ErrorKind.DB_UNAVAILABLE
    assert not (tmp_path / "nope.sqlite").exists()  # mode=ro never creates a file


def test_invalid_utf8_stored_text_does_not_crash(tmp_path: Path) -> None:
    p = tmp_path / "bad.sqlite"
    con = sqlite3.connect(p)
    con.execute("CREATE TABLE t (x TEXT)")
    con.execute("INSERT INTO t VALUES (CAST(x'66ff6f' AS TEXT))")
    con.commit()
    con.close()
    r = execute(p, "SELECT x FROM t", LIMITS)
    assert r.ok and r.rows == (("f\ufffdo",),)


def test_everything_on_the_shared_readonly_file(real_world: Path) -> None:
    """The same hostile inputs against the shared file: it keeps the README's sha256."""
    before = _sha(real_world)
    assert before == SHA256["database/world_1/world_1.sqlite"]
    lim = SandboxLimits(timeout_s=0.2)
    t0 = time.monotonic()
    for sql in HOSTILE_WRITES + SLOW_QUERIES[:3]:
        assert not execute(real_world, sql, lim).ok
    assert time.monotonic() - t0 < 3 * (0.2 + MARGIN)
    assert _sha(real_world) == before


def test_connection_limits_are_set(world: Path) -> None:
    con, _ = open_readonly(world, SandboxLimits(max_value_bytes=123_456))
    try:
        assert con.getlimit(sqlite3.SQLITE_LIMIT_ATTACHED) == 0
        assert con.getlimit(sqlite3.SQLITE_LIMIT_LENGTH) == 123_456
        assert con.getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER) == 0
        assert con.getlimit(sqlite3.SQLITE_LIMIT_COMPOUND_SELECT) == 50
    finally:
        con.close()


def test_concurrent_executions_are_independent(world: Path) -> None:
    """Threads (e.g. a trainer scoring a batch in parallel) get their own connections."""
    from concurrent.futures import ThreadPoolExecutor

    queries = [f"SELECT count(*) FROM city WHERE ID <= {n}" for n in range(1, 41)]
    queries.append(SLOW_QUERIES[2])  # one timeout in the middle must not disturb the others
    limits = SandboxLimits(timeout_s=4 * DEADLINE)  # room for a fast query on 2 loaded cores; the slow one never ends
    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(lambda q: execute(world, q, limits), queries))
    assert [r.rows for r in results[:-1]] == [((n,),) for n in range(1, 41)]
    assert results[-1].error.kind is ErrorKind.TIMEOUT


# Statements whose work happens inside single SQLite calls, where the progress handler never
# runs: with the default limits (2 s deadline) each must fail with the given kind well within
# 2.5 s (issue 31). Before the hard bound, the first ran 6.6-7.4 s and the quadratic ones too.
HOSTILE_SINGLE_CALLS = [
    # printf/format width and precision (the %.*c one loops once per unit of precision)
    ("SELECT printf('%.*c', 1000000000, 'x')", ErrorKind.TOO_LARGE),
    ("SELECT format('%.*c', 1000000000, 'x')", ErrorKind.TOO_LARGE),
    ("SELECT printf('%1000000000d', 1)", ErrorKind.TOO_LARGE),
    ("SELECT printf('%*s', 1000000000, 'x')", ErrorKind.TOO_LARGE),
    ("SELECT printf('%.1000000000f', 1.0)", ErrorKind.TOO_LARGE),
    ("SELECT printf(CAST('%.*c' AS BLOB), 1000000000, 'x')", ErrorKind.TOO_LARGE),
    ("SELECT printf('%.*c', '1000000000', 'x')", ErrorKind.TOO_LARGE),
    # builders growing one value past the length limit
    (
        "WITH RECURSIVE c(x) AS (SELECT 'x' UNION ALL SELECT replace(x, 'x', 'xxxxxxxxxx') FROM c) "
        "SELECT length(x) FROM c",
        ErrorKind.TOO_LARGE,
    ),
    ("SELECT length(hex(hex(hex(printf('%.*c', 50000, 'x')))))", ErrorKind.TOO_LARGE),
    ("SELECT length(zeroblob(1000000000))", ErrorKind.FORBIDDEN),
    (
        "WITH RECURSIVE c(x) AS (SELECT char(120) UNION ALL SELECT substr(x || x || x, 1) FROM c) "
        "SELECT length(x) FROM c",
        ErrorKind.TOO_LARGE,
    ),
    (
        "WITH RECURSIVE c(x) AS (SELECT 'a' UNION ALL SELECT upper(lower(trim(x || x))) FROM c) "
        "SELECT length(x) FROM c",
        ErrorKind.TOO_LARGE,
    ),
    (
        "WITH RECURSIVE c(x) AS (SELECT '''' UNION ALL SELECT quote(x) FROM c) SELECT length(x) FROM c",
        ErrorKind.TOO_LARGE,
    ),
    (
        "WITH RECURSIVE c(x) AS (SELECT json_array(1) UNION ALL SELECT json_array(x, x) FROM c) "
        "SELECT length(x) FROM c",
        ErrorKind.TOO_LARGE,
    ),
    ("WITH RECURSIVE c(x) AS (SELECT 'a' UNION ALL SELECT x || x FROM c) SELECT length(x) FROM c", ErrorKind.TOO_LARGE),
    # group_concat over a cross join: which bound answers first depends on the CPU (the value reaches
    # the length limit in ~1.8 s on a fast core; on a slower one the deadline comes first)
    ("SELECT length(group_concat(a.Name || b.Name)) FROM city a, city b", (ErrorKind.TIMEOUT, ErrorKind.TOO_LARGE)),
    # a quadratic call (~0.1 s) on every row, ~1000 VM steps between progress checks: only the
    # worker kill stops these in time
    (
        "WITH s(a) AS (SELECT printf('%.*c', 90000, 'x')) "
        "SELECT sum(instr(a || Name, substr(a, 1, 45000) || 'y')) FROM s, city",
        ErrorKind.TIMEOUT,
    ),
    (
        "WITH s(a) AS (SELECT printf('%.*c', 90000, 'x')) "
        "SELECT count(*) FROM s, city WHERE replace(a || Name, substr(a, 1, 45000) || 'y', '') = ''",
        ErrorKind.TIMEOUT,
    ),
    (
        "WITH s(a) AS (SELECT printf('%.*c', 90000, 'x')) "
        "SELECT count(*) FROM s, city WHERE a || Name GLOB '*' || printf('%.*c', 990, 'x') || 'y'",
        ErrorKind.TIMEOUT,
    ),
]
HARD_BOUND_S = 2.5


@pytest.mark.parametrize("sql, kind", HOSTILE_SINGLE_CALLS)
def test_single_call_builders_fail_within_the_hard_bound(
    world: Path, sql: str, kind: ErrorKind | tuple[ErrorKind, ...]
) -> None:
    allowed = kind if isinstance(kind, tuple) else (kind,)
    before = _sha(world)
    t0 = time.monotonic()
    r = execute(world, sql)  # the default limits: 2 s deadline
    elapsed = time.monotonic() - t0
    assert r.error is not None and r.error.kind in allowed, r.error
    assert r.rows == ()
    assert elapsed < HARD_BOUND_S
    _assert_untouched(world, before)


def test_a_worker_that_overruns_is_killed_and_replaced(world: Path) -> None:
    sql = HOSTILE_SINGLE_CALLS[-3][0]
    t0 = time.monotonic()
    r = execute(world, sql, LIMITS)
    elapsed = time.monotonic() - t0
    assert r.error is not None and r.error.kind is ErrorKind.TIMEOUT
    assert "killed" in r.error.message  # the progress handler could not stop it
    assert DEADLINE + LIMITS.kill_grace_s <= elapsed < DEADLINE + LIMITS.kill_grace_s + MARGIN
    # the next query runs on a fresh worker and gets its rows
    assert execute(world, "SELECT count(*) FROM city", LIMITS).rows == ((4079,),)


@pytest.mark.parametrize(
    "args",
    [
        ("%d|%5.2f|%-8s|%08.3e|%,d|%x|%q|%Q|%w", 42, 3.14159, "ab", 12345.678, 1234567, 255, "it's", None, 'a"b'),
        ("%n%.*c", 3, "x"),  # %n takes no argument: the 3 is the precision
        ("%%%.*c", 3, "x"),  # nor does %%
        ("%d%.*c", 1_000_000_000, 3, "x"),  # a large value printed, not a large precision
        ("%*d|%-*d|", 4, 7, -4, 7),
        ("%.*c", 100_000 - 1, "x"),  # just under the length limit
        ("%c%s", "héllo", "北京"),
        ("%lld %!.3g %#x", 2**40, 1.0, 255),
        (None, 1),
    ],
)
def test_capped_printf_matches_sqlite_printf(world: Path, args: tuple) -> None:
    """Formats within the cap give exactly SQLite's own printf (run on a plain connection)."""
    plain_con = sqlite3.connect(":memory:")
    try:
        literals = ", ".join(plain_con.execute("SELECT quote(?)", (a,)).fetchone()[0] for a in args)
        sql = f"SELECT printf({literals}), format({literals})"
        plain = plain_con.execute(sql).fetchone()
    finally:
        plain_con.close()
    r = execute(world, sql, LIMITS)
    assert r.ok, r.error
    assert r.rows == (plain,)


def test_gold_queries_give_the_same_rows_as_plain_sqlite() -> None:
    """All 972 Spider gold queries (train + eval) through the sandbox equal an unsandboxed run."""
    from mrtpo.tasks.sql.loader import load_items

    items = load_items("train") + load_items("eval")
    assert len(items) == 972
    for item in items:
        con = sqlite3.connect(f"{item.db_path.as_uri()}?mode=ro", uri=True)
        con.text_factory = lambda b: b.decode("utf-8", "replace")
        try:
            cur = con.execute(item.query)
            expected = (tuple(d[0] for d in cur.description), tuple(cur.fetchall()))
        finally:
            con.close()
        r = execute(item.db_path, item.query)
        assert r.ok, (item.index, item.query, r.error)
        assert (r.columns, r.rows) == expected, item.index


def test_printf_cap_boundary() -> None:
    """Widths and precisions up to the cap pass; one above is refused, digits or ``*`` alike."""
    from mrtpo.tasks.sql.printf_cap import printf_overflow

    cap = 100_000
    for ok in (("%.*c", cap, "x"), (f"%{cap}d", 1), (f"%.{cap}f", 1.0), ("%*s", -cap, "x")):
        assert printf_overflow(ok, cap) is None, ok
    for bad in (("%.*c", cap + 1, "x"), (f"%{cap + 1}d", 1), (f"%.{cap + 1}f", 1.0), ("%*s", -cap - 1, "x")):
        assert printf_overflow(bad, cap) is not None, bad
