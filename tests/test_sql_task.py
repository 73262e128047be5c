"""The SQL task end to end on the real Spider files: loader, split, prompts and evidence, the
three rewards on hand-written answers, and evaluation (gold scored against itself)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from mrtpo.tasks import get_task
from mrtpo.tasks.sql import SqlTask
from mrtpo.tasks.sql.loader import (
    ENV_VAR,
    EVAL_DBS,
    TRAIN_DBS,
    SpiderDataError,
    find_spider_dir,
    load_items,
)
from mrtpo.tasks.sql.prompt import FORMAT_INSTRUCTION
from mrtpo.verifiers import Evidence, Verifier


@pytest.fixture(scope="module")
def task() -> SqlTask:
    t = get_task("sql")
    assert isinstance(t, SqlTask)
    return t


@pytest.fixture(scope="module")
def eval_examples(task: SqlTask):
    return task.load("eval")


@pytest.fixture(scope="module")
def train_examples(task: SqlTask):
    return task.load("train")


def _by_question(examples, question: str):
    hits = [e for e in examples if e.meta["question"] == question]
    assert len(hits) == 1, question
    return hits[0]


def _block(sql: str) -> str:
    return f"```sql\n{sql}\n```"


# ---------------------------------------------------------------- loader and split


def test_split_sizes_databases_and_order(eval_examples, train_examples) -> None:
    assert len(train_examples) == 399 and len(eval_examples) == 573
    assert {e.gold["db_id"] for e in train_examples} == set(TRAIN_DBS)
    assert {e.gold["db_id"] for e in eval_examples} == set(EVAL_DBS)
    assert not set(TRAIN_DBS) & set(EVAL_DBS)
    # dev.json order, ids from the dev.json index
    raw = json.loads((find_spider_dir() / "dev.json").read_text())
    idx = [e.meta["index"] for e in eval_examples]
    assert idx == sorted(idx)
    assert all(e.id == f"spider-dev-{e.meta['index']}" for e in eval_examples)
    first = eval_examples[0]
    assert raw[first.meta["index"]]["query"] == first.gold["sql"]
    assert raw[first.meta["index"]]["question"] == first.meta["question"]
    assert "wta_1" not in {e.gold["db_id"] for e in eval_examples + train_examples}


def test_limit_takes_a_prefix(task: SqlTask, eval_examples) -> None:
    few = task.load("eval", limit=5)
    assert [e.id for e in few] == [e.id for e in eval_examples[:5]]
    assert task.load("eval", limit=0) == []


def test_unknown_split_is_a_clear_error(task: SqlTask) -> None:
    with pytest.raises(ValueError, match="train.*eval"):
        task.load("test")


def test_missing_data_error_names_every_location(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv(ENV_VAR, str(tmp_path / "nowhere"))
    with pytest.raises(SpiderDataError) as err:
        find_spider_dir()
    msg = str(err.value)
    assert ENV_VAR in msg and str(tmp_path / "nowhere") in msg
    assert "data_dir argument" in msg and "../shared/data/spider" in msg
    assert "yale-lily.github.io/spider" in msg
    with pytest.raises(SpiderDataError, match="empty_dir"):
        find_spider_dir(tmp_path / "empty_dir")


def test_env_var_and_argument_are_used(tmp_path: Path, monkeypatch) -> None:
    real = find_spider_dir()
    monkeypatch.setenv(ENV_VAR, str(real))
    assert find_spider_dir() == real.resolve()
    monkeypatch.setenv(ENV_VAR, str(tmp_path))  # the argument wins over the env var
    assert find_spider_dir(real) == real.resolve()


def _mirror(real: Path, dest: Path) -> Path:
    """A Spider folder of symlinks to the real files (nothing copied but what a test changes)."""
    dest.mkdir()
    for name in ("dev.json", "tables.json"):
        (dest / name).symlink_to(real / name)
    (dest / "database").mkdir()
    for db in TRAIN_DBS + EVAL_DBS:
        (dest / "database" / db).mkdir()
        (dest / "database" / db / f"{db}.sqlite").symlink_to(real / "database" / db / f"{db}.sqlite")
    return dest


def test_validation_catches_hash_schema_and_missing_files(tmp_path: Path) -> None:
    real = find_spider_dir()
    root = _mirror(real, tmp_path / "spider")
    assert len(load_items("eval", root)) == 573
    # tables.json with one extra byte: same content, different hash
    (root / "tables.json").unlink()
    (root / "tables.json").write_bytes((real / "tables.json").read_bytes() + b"\n")
    with pytest.raises(SpiderDataError, match="sha256 mismatch.*tables.json"):
        load_items("eval", root)
    assert len(load_items("eval", root, verify="schema")) == 573
    # a database whose tables differ from tables.json: swap in another database's file
    pets = root / "database" / "pets_1" / "pets_1.sqlite"
    pets.unlink()
    pets.symlink_to(real / "database" / "car_1" / "car_1.sqlite")
    with pytest.raises(SpiderDataError, match="pets_1 does not match tables.json"):
        load_items("eval", root, verify="schema")
    pets.unlink()
    with pytest.raises(SpiderDataError, match="missing: database/pets_1/pets_1.sqlite"):
        load_items("eval", root, verify="schema")
    # the training split does not need pets_1
    assert len(load_items("train", root, verify="schema")) == 399


# ---------------------------------------------------------------- prompts and evidence


def test_messages_and_evidence_contract(task: SqlTask, eval_examples, train_examples) -> None:
    verifiers = task.verifiers()
    assert [v.name for v in verifiers] == ["format", "executes", "result"]
    assert all(isinstance(v, Verifier) for v in verifiers)
    for ex in eval_examples + train_examples:
        roles = [m["role"] for m in ex.messages]
        assert roles == ["system", "user"]
        prompt = "\n".join(m["content"] for m in ex.messages)
        fmt, exe, res = (v.evidence(ex) for v in verifiers)
        assert fmt == Evidence(FORMAT_INSTRUCTION, "in_prompt")
        assert exe.placement == "in_prompt" and res.placement == "privileged"
        for ev in (fmt, exe):
            assert prompt.count(ev.text) == 1
            assert ex.messages[1]["content"].count(ev.text) == 1  # inside one message
        assert res.text == ex.gold["sql"] and res.text not in prompt
        # removing either in_prompt span leaves a prompt that still asks the question
        user = ex.messages[1]["content"]
        for ev in (fmt, exe):
            rest = user.replace(ev.text, "").strip()
            assert rest.startswith("Question: ") or rest.startswith("SQLite database schema:")
            assert f"Question: {ex.meta['question'].strip()}" in rest


def test_schema_block_is_the_databases_own_ddl(eval_examples) -> None:
    ex = _by_question(eval_examples, "How many countries are listed?")
    schema = ex.gold["schema"]
    for table in ("continents", "countries", "car_makers", "model_list", "car_names", "cars_data"):
        assert f'CREATE TABLE "{table}"' in schema
    assert '"MPG" TEXT' in schema  # the declared type, verbatim from sqlite_master
    world = _by_question(eval_examples, "What are the cities whose population is between 160000 and 900000?")
    assert 'CREATE TABLE "city"' in world.gold["schema"]
    assert "AUTOINCREMENT" in world.gold["schema"]
    assert "sqlite_sequence" not in world.gold["schema"]  # SQLite's internal table is left out
    assert "/* 3 example rows from continents:" in schema


def test_sample_rows_are_optional() -> None:
    ex = get_task("sql", sample_rows=0).load("eval", limit=1)[0]
    assert "example rows" not in ex.gold["schema"] and "CREATE TABLE" in ex.gold["schema"]


# ---------------------------------------------------------------- the three rewards


CASES = [
    # (question, right, wrong-but-runs, broken)
    (
        "Find the number of pets whose weight is heavier than 10.",
        "SELECT COUNT(PetID) FROM Pets WHERE weight > 10;",
        "SELECT COUNT(*) FROM Pets WHERE weight >= 9.3",
        "SELECT COUNT(*) FROM Pet WHERE weight > 10",  # no such table
    ),
    (
        "What are the population and life expectancies in Brazil?",
        "SELECT LifeExpectancy, Population FROM country WHERE Code = 'BRA'",  # columns swapped
        "SELECT Population FROM country WHERE Name = 'Brazil'",  # one column missing
        "SELECT Population, LifeExpectancy FROM country WHERE Name = 'Brazil' AND",
    ),
    (
        "Return the names of the 3 countries with the fewest people.",
        "SELECT Name FROM country ORDER BY Population LIMIT 3",
        "SELECT Name FROM country ORDER BY Population DESC LIMIT 3",
        "SELECT Name FROM country ORDER BY Populaton LIMIT 3",
    ),
    (
        "How much surface area do the countires in the Carribean cover together?",
        "SELECT SUM(c.SurfaceArea) FROM country AS c WHERE c.Region LIKE 'caribbean'",
        "SELECT AVG(SurfaceArea) FROM country WHERE Region = 'Caribbean'",
        "SELECT SUM(SurfaceArea) FROM country WHERE Region = 'Caribbean'; DROP TABLE country",
    ),
]


@pytest.mark.parametrize("question, right, wrong, broken", CASES)
def test_rewards_on_hand_written_answers(task: SqlTask, eval_examples, question, right, wrong, broken) -> None:
    ex = _by_question(eval_examples, question)
    fmt, exe, res = task.verifiers()
    ok = _block(right)
    assert (fmt(ok, ex), exe(ok, ex), res(ok, ex)) == (1.0, 1.0, 1.0)
    w = _block(wrong)
    assert (fmt(w, ex), exe(w, ex), res(w, ex)) == (1.0, 1.0, 0.0)
    b = _block(broken)
    assert (fmt(b, ex), exe(b, ex), res(b, ex)) == (1.0, 0.0, 0.0)
    bare = right  # correct SQL without the fence: executes and is right, but format fails
    assert (fmt(bare, ex), exe(bare, ex), res(bare, ex)) == (0.0, 1.0, 1.0)
    prose = "I think you should look at the country table."
    assert (fmt(prose, ex), exe(prose, ex), res(prose, ex)) == (0.0, 0.0, 0.0)


def test_order_matters_only_when_gold_orders(task: SqlTask, eval_examples) -> None:
    _, _, res = task.verifiers()
    # gold: SELECT section_name FROM Sections ORDER BY section_name DESC
    ordered = _by_question(eval_examples, "List the section_name in reversed lexicographical order.")
    assert ordered.gold["ordered"] is True
    assert res(_block("SELECT section_name FROM Sections ORDER BY 1 DESC"), ordered) == 1.0
    assert res(_block("SELECT section_name FROM Sections ORDER BY section_name ASC"), ordered) == 0.0
    assert res(_block("SELECT section_name FROM Sections"), ordered) == 0.0  # rowid order differs
    # gold without ORDER BY: any row order is right
    unordered = _by_question(eval_examples, "What are the cities whose population is between 160000 and 900000?")
    assert unordered.gold["ordered"] is False
    shuffled = "SELECT Name FROM city WHERE Population BETWEEN 160000 AND 900000 ORDER BY Name DESC"
    assert res(_block(shuffled), unordered) == 1.0
    dup = "SELECT Name FROM city WHERE Population BETWEEN 160000 AND 900000 UNION ALL SELECT 'Kabul'"
    assert res(_block(dup), unordered) == 0.0


def test_hostile_answers_score_zero_quickly(task: SqlTask, eval_examples) -> None:
    ex = _by_question(eval_examples, "How many people live in Gelderland district?")
    fmt, exe, res = task.verifiers()
    hostile = [
        "DELETE FROM city",
        "SELECT sum(Population) FROM city; DELETE FROM city",
        "ATTACH DATABASE '/tmp/x.db' AS x",
        "PRAGMA writable_schema = 1",
        "SELECT load_extension('evil')",
        "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x+1 FROM c) SELECT count(*) FROM c",
        "SELECT count(*) FROM city a, city b, city c, city d",
        "SELECT * FROM city a, city b",
        "SELECT '\ud800'",
        "SELECT 1\x00",
        "SELECT " + "1 + " * 20_000 + "1",
    ]
    import hashlib

    db = Path(ex.gold["db_path"])
    before = hashlib.sha256(db.read_bytes()).hexdigest()
    t0 = time.monotonic()
    for sql in hostile:
        c = _block(sql)
        assert exe(c, ex) == 0.0 and res(c, ex) == 0.0, sql
    # two timeouts at the default 2 s deadline (each run once: result reuses the cached error)
    assert time.monotonic() - t0 < 2 * 2.0 + 2.0
    assert hashlib.sha256(db.read_bytes()).hexdigest() == before


def test_verifiers_never_raise_on_junk(task: SqlTask, eval_examples) -> None:
    ex = eval_examples[0]
    junk = [None, 42, b"\xff", "", "```", "```sql", "`" * 10_000, "\x00" * 100, "\ud800```sql\nSELECT 1\n```"]
    for v in task.verifiers():
        for j in junk:
            assert v(j, ex) in (0.0, 1.0)  # type: ignore[arg-type]


# ---------------------------------------------------------------- evaluation


def test_gold_against_itself_is_perfect_on_all_972(task: SqlTask, eval_examples, train_examples) -> None:
    """Each gold query is re-executed as a *prediction* (a distinct SQL string, so no cache
    hit): 100% execution accuracy on every database, and fast."""
    examples = eval_examples + train_examples
    outputs = [_block(e.gold["sql"] + "\n-- as prediction") for e in examples]
    t0 = time.monotonic()
    report = task.evaluate(outputs, examples)
    assert time.monotonic() - t0 < 15.0
    assert report["n"] == 972 and report["correct"] == 972
    assert report["execution_accuracy"] == 1.0 and report["executable_rate"] == 1.0
    assert report["format_rate"] == 1.0 and report["gold_failures"] == 0
    assert set(report["per_db"]) == set(EVAL_DBS) | set(TRAIN_DBS)
    assert all(d["execution_accuracy"] == 1.0 for d in report["per_db"].values())
    json.dumps(report)  # JSON-serialisable


def test_evaluate_counts_per_database(task: SqlTask, eval_examples) -> None:
    exs = eval_examples[:4]  # pets_1
    right = _block(exs[0].gold["sql"])
    outputs = [right, "no idea", _block("SELECT nope FROM Pets"), _block("SELECT 1")]
    report = task.evaluate(outputs, exs)
    assert report["n"] == 4 and report["correct"] == 1
    assert report["execution_accuracy"] == 0.25
    assert report["executable_rate"] == 0.5  # the right one and SELECT 1
    assert report["format_rate"] == 0.75
    assert report["errors"] == {"no_sql": 1, "runtime": 1}
    assert report["per_db"] == {"pets_1": {"n": 4, "correct": 1, "execution_accuracy": 0.25, "executable_rate": 0.5}}
    assert [r["correct"] for r in report["examples"]] == [True, False, False, False]
    with pytest.raises(ValueError, match="pair up"):
        task.evaluate(outputs[:3], exs)
    json.dumps(report)


def test_failing_gold_gives_none_not_zero(task: SqlTask, eval_examples) -> None:
    """A gold query that does not run makes `result` not applicable (None), and evaluation
    counts it apart instead of scoring the model against an error."""
    import dataclasses

    ex = eval_examples[0]
    broken = dataclasses.replace(ex, gold={**ex.gold, "sql": "SELECT nope FROM Pets"})
    _, exe, res = task.verifiers()
    answer = _block(ex.gold["sql"])
    assert exe(answer, broken) == 1.0
    assert res(answer, broken) is None
    report = task.evaluate([answer, answer], [broken, ex])
    assert report["gold_failures"] == 1 and report["n"] == 1 and report["correct"] == 1


@pytest.mark.slow
def test_evidence_occurs_once_in_the_chat_templated_prompt(eval_examples, train_examples, task) -> None:
    """The contract on the string the policy really sees (Qwen's chat template)."""
    from mrtpo.models import load_policy

    _, tok = load_policy("qwen2.5-coder-0.5b")
    verifiers = task.verifiers()
    for ex in eval_examples + train_examples:
        prompt = tok.apply_chat_template(ex.messages, add_generation_prompt=True, tokenize=False)
        for v in verifiers:
            ev = v.evidence(ex)
            if ev.placement == "in_prompt":
                assert prompt.count(ev.text) == 1, (v.name, ex.id)
            else:
                assert ev.text not in prompt
