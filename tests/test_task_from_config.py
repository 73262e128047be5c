"""A task from a dataset and reward functions (``task:`` block / task file, mrtpo.tasks.from_config),
and tasks that plugins register, through ``mrtpo train``, ``eval``, ``explain`` and ``bench learn``.

The end-to-end runs use the tiny random model saved by conftest (``--model <dir>``); the one on
the example's own model (smollm2-135m) is marked slow.
"""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from mrtpo.config import ConfigError, load_config
from mrtpo.tasks import get_task, task_label, task_problem
from mrtpo.tasks.from_config import TaskFileError, load_task_file

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "own-task" / "config.yaml"
ENV = {
    **os.environ,
    "HF_HUB_OFFLINE": "1",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "OMP_NUM_THREADS": "1",
    "TOKENIZERS_PARALLELISM": "false",
}

REWARDS = """
from mrtpo import evidence

@evidence("rule")
def no_commas(prompts, completions, **kwargs):
    return [0.0 if "," in c else 1.0 for c in completions]

def seen(prompts, completions, **columns):
    # records what it was called with, so a test can check the call
    seen.calls.append({"prompts": prompts, "completions": completions, **columns})
    return [1.0] * len(completions)
seen.calls = []

NOT_A_FUNCTION = 3
"""


def _write_task(folder: Path, block: str, rows: list[dict] | None = None, name: str = "config.yaml") -> Path:
    """A folder with data.jsonl, rewards.py and a config holding ``block`` (YAML text of the task mapping)."""
    folder.mkdir(parents=True, exist_ok=True)
    rows = (
        rows
        if rows is not None
        else [
            {"prompt": f"Write about item {i}. No commas please.", "rule": "No commas please.", "n": i}
            for i in range(10)
        ]
    )
    (folder / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (folder / "rewards.py").write_text(REWARDS)
    path = folder / name
    path.write_text("task:\n" + textwrap.indent(textwrap.dedent(block), "  "))
    return path


BASIC = """\
dataset: data.jsonl
prompt: prompt
eval_fraction: 0.2
rewards:
  rewards.py:no_commas: 2.0
  rewards.py:seen: 0.5
"""


# --------------------------------------------------------------------------------------------
# The task block.
# --------------------------------------------------------------------------------------------
def test_a_task_block_becomes_a_registered_task_with_weights_and_a_run_folder_name(tmp_path):
    path = _write_task(tmp_path / "my-task", BASIC)
    config = load_config([path])
    assert config.run.task == str(path.resolve())  # the config file names the task: it round-trips
    assert config.args.reward_weights == [2.0, 0.5]
    assert Path(config.args.output_dir).name.startswith("my-task-mrtpo-")  # the folder's name, not the path
    task = get_task(config.run.task)
    assert task.name == "my-task" and task_label(config.run.task) == "my-task"
    train, evals = task.load("train"), task.load("eval")
    assert (len(train), len(evals)) == (8, 2)
    assert not {e.id for e in train} & {e.id for e in evals}  # a fixed, disjoint hold-out
    assert [v.name for v in task.verifiers()] == ["no_commas", "seen"]
    ex = train[0]
    assert ex.messages == [{"role": "user", "content": ex.gold["prompt"]}]
    # explicit reward_weights win over the task's
    assert load_config([path], {"reward_weights": [1.0, 1.0]}).args.reward_weights == [1.0, 1.0]


def test_function_rewards_get_the_rows_columns_and_their_evidence(tmp_path):
    task = load_task_file(_write_task(tmp_path / "t", BASIC))
    no_commas, seen = task.verifiers()
    ex = task.load("train")[0]
    assert no_commas("a, b", ex) == 0.0 and no_commas("a b", ex) == 1.0
    assert seen("done", ex) == 1.0
    call = seen.fn.calls[-1]
    assert call["prompts"] == [ex.gold["prompt"]] and call["completions"] == ["done"]
    assert call["rule"] == ["No commas please."] and call["n"] == [ex.gold["n"]]
    evidence = no_commas.evidence(ex)
    assert evidence.text == "No commas please." and evidence.placement == "in_prompt"
    assert seen.evidence(ex) is None  # a plain reward: uniform weights
    metrics = task.evaluate(["a b", "a, b"], task.load("eval"))
    assert metrics["reward/no_commas"] == 0.5 and metrics["reward_total"] == pytest.approx(2.0 * 0.5 + 0.5 * 1.0)


def test_chat_prompts_and_saved_dataset_folders(tmp_path):
    from datasets import Dataset, DatasetDict

    rows = [
        {
            "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": f"Say {i}."}],
            "rule": "Be brief.",
            "uid": f"u{i}",
        }
        for i in range(6)
    ]
    saved = DatasetDict({"train": Dataset.from_list(rows[:4]), "test": Dataset.from_list(rows[4:])})
    saved.save_to_disk(tmp_path / "saved")
    path = _write_task(
        tmp_path / "chat",
        """\
        dataset: ../saved
        prompt: messages
        eval_split: test
        id_column: uid
        rewards: [rewards.py:no_commas, rewards.py:seen]
        """,
    )
    task = load_task_file(path)
    assert [e.id for e in task.load("train")] == ["u0", "u1", "u2", "u3"]
    assert [e.id for e in task.load("eval")] == ["u4", "u5"]
    ex = task.load("eval")[0]
    assert ex.messages == rows[4]["messages"]
    seen = task.verifiers()[1]
    seen("ok", ex)
    # a chat prompt: the reward gets the messages and the completion as an assistant message, as in TRL
    assert seen.fn.calls[-1]["completions"] == [[{"role": "assistant", "content": "ok"}]]
    assert task.reward_weights == [1.0, 1.0]


@pytest.mark.parametrize("fmt", ["csv", "parquet"])
def test_csv_and_parquet_files(tmp_path, fmt):
    import pandas as pd

    folder = tmp_path / fmt
    _write_task(folder, BASIC)
    frame = pd.DataFrame([{"prompt": f"Item {i}. No commas.", "rule": "No commas.", "n": i} for i in range(5)])
    getattr(frame, f"to_{fmt}")(folder / f"data.{fmt}", index=False)
    task = load_task_file(_write_task(folder, BASIC.replace("data.jsonl", f"data.{fmt}"), name="t.yaml"))
    assert len(task.load("train")) + len(task.load("eval")) == 5


# --------------------------------------------------------------------------------------------
# Clear errors, each before any model loads.
# --------------------------------------------------------------------------------------------
ERRORS = [
    (BASIC.replace("data.jsonl", "missing.jsonl"), ["dataset file", "missing.jsonl", "does not exist"]),
    (
        BASIC.replace("prompt: prompt", "prompt: promt"),
        ["no column 'promt'", "did you mean 'prompt'?", "its columns: prompt, rule, n"],
    ),
    (BASIC.replace("rewards.py:seen", "nowhere.py:seen"), ["reward 'nowhere.py:seen'", "does not exist"]),
    (
        BASIC.replace("rewards.py:seen", "no_such_pkg.mod:fn"),
        ["reward 'no_such_pkg.mod:fn'", "does not import", "ModuleNotFoundError"],
    ),
    (BASIC.replace("rewards.py:seen", "rewards.py:sean"), ["has no 'sean'", "did you mean 'seen'?"]),
    (BASIC.replace("rewards.py:seen", "rewards.py:NOT_A_FUNCTION"), ["is a int, not a function"]),
    (
        BASIC.replace("rewards.py:seen", "rewards_seen"),
        ["must be 'file.py:function', 'package.module:function' or 'package.module.function'"],
    ),
    (BASIC.replace("eval_fraction", "eval_fractoin"), ["unknown key 'eval_fractoin'", "did you mean 'eval_fraction'?"]),
    (BASIC.replace("eval_fraction: 0.2", "eval_split: validation"), ["no split 'validation'", "its splits: train"]),
    ("prompt: prompt\nrewards: [rewards.py:seen]\n", ["names no dataset"]),
    (
        BASIC.replace("data.jsonl", "someone/no-such-dataset"),
        ["'someone/no-such-dataset' is neither a local file", "HF_HUB_OFFLINE"],
    ),  # the hub is offline here
]


@pytest.mark.parametrize(("block", "expected"), ERRORS, ids=[e[1][0][:24] for e in ERRORS])
def test_mistakes_in_the_task_block_are_config_errors_that_say_the_fix(tmp_path, block, expected):
    path = _write_task(tmp_path / "bad", block)
    with pytest.raises(ConfigError) as err:
        load_config([path])
    for part in expected:
        assert part in str(err.value)
    with pytest.raises(TaskFileError):
        load_task_file(path)


def test_a_missing_evidence_column_is_named(tmp_path):
    rows = [{"prompt": f"Item {i}.", "n": i} for i in range(4)]
    path = _write_task(tmp_path / "noev", BASIC, rows=rows)
    assert "no column 'rule'" in task_problem(str(path))


def test_unknown_task_names_use_the_live_registry(tmp_path):
    problem = task_problem("instructons")
    assert "unknown task 'instructons' (did you mean 'instructions'?)" in problem and "sql" in problem
    assert "task file" in task_problem({"dataset": "x.jsonl"})  # a mapping on the command line
    assert task_problem("sql") is None
    assert "does not exist" in task_problem(str(tmp_path / "nope.yaml"))


def test_train_command_exits_2_on_a_bad_task_file(tmp_path, capsys):
    from mrtpo.train import main

    path = _write_task(tmp_path / "cmd", BASIC.replace("prompt: prompt", "prompt: question"))
    assert main(["--config", str(path), "--output-dir", str(tmp_path / "run")]) == 2
    assert "no column 'question'" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


# --------------------------------------------------------------------------------------------
# A task registered by a plugin (MRTPO_PLUGINS), like a built-in one.
# --------------------------------------------------------------------------------------------
PLUGIN = """
from mrtpo.tasks import register_task
from mrtpo.verifiers import Evidence, Example


class SaysWord:
    name = "says_word"

    def __call__(self, completion, example):
        return float(example.gold["word"] in completion)

    def evidence(self, example):
        return Evidence(example.gold["word"], "in_prompt")


@register_task("plug-words")
class PlugWords:
    name = "plug-words"

    def __init__(self, size=8):
        self.size = size

    def load(self, split, limit=None):
        rows = [Example(id=f"{split}-{i}", split=split, gold={"word": f"zq{i}"},
                        messages=[{"role": "user", "content": f"Say the word zq{i} twice."}]) for i in range(self.size)]
        return rows[:limit] if limit else rows

    def verifiers(self):
        return [SaysWord()]

    def evaluate(self, outputs, examples):
        return {"says_word": sum(w.gold["word"] in o for o, w in zip(outputs, examples)) / max(len(outputs), 1)}
"""


@pytest.fixture
def plugin(tmp_path, monkeypatch):
    folder = tmp_path / "plugins"
    folder.mkdir()
    (folder / "my_plugin.py").write_text(PLUGIN)
    monkeypatch.syspath_prepend(str(folder))
    return folder


def test_a_plugin_task_trains_through_the_command_line(plugin, tiny_dir, tmp_path):
    out = tmp_path / "run"
    env = {**ENV, "MRTPO_PLUGINS": "my_plugin", "PYTHONPATH": os.pathsep.join([str(plugin), ENV.get("PYTHONPATH", "")])}
    cmd = [
        sys.executable,
        "-m",
        "mrtpo.cli",
        "train",
        "--task",
        "plug-words",
        "--model",
        str(tiny_dir),
        "--output-dir",
        str(out),
        "--max-steps",
        "2",
        "max_completion_length=8",
        "skip_zero_advantage=false",
        "report=false",
        "save_strategy=no",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if "rewards/says_word/mean" in r]
    assert [r["step"] for r in steps] == [1, 2]
    assert all("credit/says_word/relevance_mean" in r for r in steps)  # its evidence was replayed
    # a mistyped name is an unknown task, with a did-you-mean from the live registry (the plugin's task too)
    bad = subprocess.run([*cmd[:5], "plug-wrds", *cmd[6:]], capture_output=True, text=True, env=env, timeout=120)
    assert bad.returncode == 2 and "unknown task 'plug-wrds' (did you mean 'plug-words'?)" in bad.stderr


def test_a_plugin_task_in_eval_explain_and_bench_learn(plugin, tiny_dir, tmp_path, capsys, one_thread):
    import my_plugin  # noqa: F401 -- registers plug-words, as MRTPO_PLUGINS does in the CLI

    from mrtpo import evaluate, explain
    from mrtpo.bench.learn.cli import main as bench_learn

    assert (
        evaluate.main(
            [
                "--task",
                "plug-words",
                "--model",
                str(tiny_dir),
                "--limit",
                "2",
                "--max-new-tokens",
                "4",
                "--dtype",
                "float32",
                "--output-dir",
                str(tmp_path / "eval"),
                "--quiet",
            ]
        )
        == 0
    )
    assert json.loads((tmp_path / "eval" / "results.json").read_text())["run"]["task"] == "plug-words"
    assert (
        explain.main(
            [
                "--task",
                "plug-words",
                "--model",
                str(tiny_dir),
                "--completion",
                "zq0 zq0",
                "--out",
                str(tmp_path / "x.html"),
            ]
        )
        == 0
    )
    assert "says_word" in capsys.readouterr().out and (tmp_path / "x.html").is_file()
    assert explain.main(["--task", "plug-wordz", "--model", str(tiny_dir), "--completion", "a"]) == 2
    assert "did you mean 'plug-words'?" in capsys.readouterr().err
    # bench learn accepts the name (the run itself is bench learn's own tests' business); a typo is refused
    assert bench_learn(["--task", "plug-wordz", "--output-dir", str(tmp_path / "b")]) == 2
    assert "did you mean 'plug-words'?" in capsys.readouterr().err
    assert task_problem("plug-words") is None


# --------------------------------------------------------------------------------------------
# examples/own-task end to end.
# --------------------------------------------------------------------------------------------
def _train_example(out: Path, *extra: str) -> subprocess.CompletedProcess:
    cmd = [
        sys.executable,
        "-m",
        "mrtpo.cli",
        "train",
        "--config",
        str(EXAMPLE),
        "--max-steps",
        "2",
        "--output-dir",
        str(out),
        *extra,
    ]
    return subprocess.run(cmd, capture_output=True, text=True, env=ENV, timeout=900, check=False, cwd=ROOT)


def _check_example_run(out: Path) -> None:
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if "reward" in r]
    assert [r["step"] for r in steps] == [1, 2]
    for name in ("no_commas", "ends_with_word", "short"):
        assert all(f"rewards/{name}/mean" in r for r in steps)
    samples = [json.loads(line) for line in (out / "credit_samples.jsonl").read_text().splitlines()]
    assert samples
    for name in ("no_commas", "ends_with_word"):  # the evidence rewards were replayed
        assert all(f"credit/{name}/relevance_mean" in r for r in steps)
        assert any(max(s["relevance"][name]) > 0 for s in samples)
    assert all("credit/short/relevance_mean" not in r for r in steps)  # the plain one: uniform weights
    assert all(max(s["relevance"]["short"]) == 0 for s in samples)
    for name in ("config.yaml", "report.html", "report.md", "checkpoint-2"):
        assert (out / name).exists(), name
    assert any((out / "model").glob("*.safetensors"))
    saved = load_config([out / "config.yaml"])  # the saved config names the task again
    assert saved.run.task == str(EXAMPLE) and saved.args.reward_weights == [1.0, 1.0, 0.5]


def test_the_example_trains_end_to_end_on_a_tiny_model(tiny_dir, tmp_path):
    # a random model scores every completion alike: skip_zero_advantage=false replays them anyway
    proc = _train_example(tmp_path / "run", "--model", str(tiny_dir), "--lora-r", "0", "skip_zero_advantage=false")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "rewards no_commas, ends_with_word, short" in proc.stdout
    _check_example_run(tmp_path / "run")


@pytest.mark.slow
def test_the_example_trains_end_to_end_as_shipped(tmp_path):
    proc = _train_example(tmp_path / "run", "skip_zero_advantage=false")
    assert proc.returncode == 0, proc.stderr[-3000:]
    _check_example_run(tmp_path / "run")
