"""A large task file loads lazily (issue 41): no example exists until it is read, every pre-model check
still sees every row (read from Arrow columns), and what comes out equals the eager reading of the file.

The eager reference here is built independently: the JSON lines parsed with ``json``, the hold-out
drawn as the task file's docs state it (the first ``round(n * eval_fraction)`` of a
``random.Random(split_seed)`` shuffle of the row numbers).
"""

import json
import random
import textwrap
from pathlib import Path

import pytest

from mrtpo.config import ConfigError, load_config
from mrtpo.verifiers import Example

ROWS = 20_000

REWARDS = """
from mrtpo import evidence

@evidence("rule")
def no_commas(prompts, completions, **kwargs):
    return [0.0 if "," in c else 1.0 for c in completions]

@evidence(lambda row: row["rule"] if row["n"] % 2 else None)
def by_function(prompts, completions, **kwargs):
    return [1.0] * len(completions)
"""


def _row(i: int) -> dict:
    return {"prompt": f"Write about item {i}. No commas please.", "rule": "No commas please.", "n": i, "uid": f"u{i}"}


def _task(folder: Path, rows: list[dict], block: str = "") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (folder / "rewards.py").write_text(REWARDS)
    (folder / "task.yaml").write_text(
        "dataset: data.jsonl\nprompt: prompt\nrewards: [rewards.py:no_commas, rewards.py:by_function]\n"
        + textwrap.dedent(block)
    )
    return folder / "task.yaml"


@pytest.fixture
def built(monkeypatch) -> list[int]:
    """Counts every :class:`Example` constructed, wherever."""
    made: list[int] = []
    init = Example.__init__

    def counting(self, *args, **kwargs):
        made.append(1)
        init(self, *args, **kwargs)

    monkeypatch.setattr(Example, "__init__", counting)
    return made


def _eager(path: Path, fraction: float, seed: int) -> tuple[list[Example], list[Example]]:
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    order = list(range(len(rows)))
    random.Random(seed).shuffle(order)
    held = set(order[: round(len(rows) * fraction)])
    examples = [
        Example(
            id=f"train-{i}", split="train", messages=[{"role": "user", "content": r["prompt"]}], gold=r, meta={"row": i}
        )
        for i, r in enumerate(rows)
    ]
    return [e for e in examples if e.meta["row"] not in held], [e for e in examples if e.meta["row"] in held]


def test_loading_a_large_task_file_builds_no_example_until_one_is_read(tmp_path, built):
    from mrtpo.run_build import load_task_data, trainer_dataset

    path = _task(tmp_path / "big", [_row(i) for i in range(ROWS)], "eval_fraction: 0.1\nsplit_seed: 3\n")
    config = load_config([], {"task": str(path), "eval_size": 500})
    data = load_task_data(config)  # the task, its checks (prompts, evidence, ids) and the id mapping
    rows = trainer_dataset(data.task, data.train)  # the trainer's dataset
    assert built == []  # not one example, for 20,000 rows
    assert (len(data.train), len(data.evals), len(rows)) == (ROWS - 2000, 500, ROWS - 2000)

    assert data.examples["train-7"].gold["n"] == 7 and data.train[-1].id == data.train[len(data.train) - 1].id
    assert len(built) == 3  # one per example read
    with pytest.raises(KeyError):
        data.examples["train-20000"]

    train, held = _eager(tmp_path / "big" / "data.jsonl", 0.1, 3)
    assert list(data.train) == train and list(data.evals) == held[:500]
    assert list(data.task.load("eval")) == held
    assert rows.column_names == ["prompt", "rule", "n", "uid", "example_id"]
    assert rows.to_list() == [
        {"prompt": e.gold["prompt"], "rule": e.gold["rule"], "n": e.gold["n"], "uid": e.gold["uid"], "example_id": e.id}
        for e in train
    ]
    assert [data.examples[e.id] for e in held[:500:97]] == held[:500:97]
    assert len(data.examples) == ROWS - 2000 + 500 and list(data.examples)[:2] == [train[0].id, train[1].id]


def test_every_row_is_still_checked_before_a_model_loads(tmp_path):
    from mrtpo.run_build import load_task_data
    from mrtpo.tasks.from_config import TaskFileError, load_task_file

    rows = [_row(i) for i in range(ROWS)]
    rows[15_001]["rule"] = "Use a colon."  # evidence of row 15001 not in its prompt (an odd row: both rewards)
    path = _task(tmp_path / "evidence", rows)
    with pytest.raises(ConfigError, match=r"reward 'no_commas' for example 'train-15001' does not occur"):
        load_task_data(load_config([], {"task": str(path)}))

    rows = [_row(i) for i in range(ROWS)]
    rows[12_345]["prompt"] = None
    with pytest.raises(TaskFileError, match=r"row 12345 of split 'train': the prompt must be text"):
        load_task_file(_task(tmp_path / "null-prompt", rows))

    chat = [{**_row(i), "prompt": [{"role": "user", "content": f"Say {i}."}]} for i in range(ROWS)]
    chat[19_999]["prompt"] = []
    with pytest.raises(TaskFileError, match=r"row 19999 of split 'train': the prompt must be text"):
        load_task_file(_task(tmp_path / "empty-chat", chat))


def test_ids_from_a_column_are_looked_up_and_must_be_unique(tmp_path, built):
    from mrtpo.run_build import load_task_data, trainer_dataset

    path = _task(tmp_path / "ids", [_row(i) for i in range(ROWS)], "id_column: uid\n")
    data = load_task_data(load_config([], {"task": str(path)}))
    assert built == []
    ex = data.examples["u12345"]
    assert (ex.id, ex.meta["row"], ex.gold["n"]) == ("u12345", 12345, 12345)
    assert trainer_dataset(data.task, data.train)[12345]["example_id"] == "u12345"

    numbered = _task(tmp_path / "numbered", [_row(i) for i in range(100)], "id_column: n\n")
    data = load_task_data(load_config([], {"task": str(numbered)}))
    assert data.examples["42"].gold["uid"] == "u42"  # an integer id reads as str() writes it
    assert trainer_dataset(data.task, data.train)[42]["example_id"] == "42"

    rows = [_row(i) for i in range(ROWS)]
    rows[17_000]["uid"] = "u3"
    with pytest.raises(ConfigError, match=r"has two examples with id 'u3'; ids must be unique"):
        load_task_data(load_config([], {"task": str(_task(tmp_path / "dup", rows, "id_column: uid\n"))}))


def test_a_null_line_is_named_by_its_row(tmp_path):
    """``datasets`` reads a ``null`` line as a row of empty cells (the line check runs only on a file it rejects)."""
    from mrtpo.tasks.from_config import TaskFileError, load_task_file

    path = _task(tmp_path / "null-line", [_row(0)])
    (path.parent / "data.jsonl").write_text(json.dumps(_row(0)) + "\nnull\n" + json.dumps(_row(2)) + "\n")
    with pytest.raises(TaskFileError, match=r"^row 1 of split 'train': the prompt must be text .* got None$"):
        load_task_file(path)
