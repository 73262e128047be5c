"""Issue 41's reliability probes that need no model: output folders that ``mrtpo export`` may not
replace, numeric settings checked once for the command line, task files and the Python API, one
writer per run folder, reward functions with a deadline, and a run that pins its task.

Every run folder here is made by hand (a ``config.yaml`` and a ``model/`` of a few bytes): exporting a
full fine-tuning run copies ``model/`` and loads nothing.
"""

import errno
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mrtpo.cli import main as cli_main
from mrtpo.config import ConfigError, load_config
from mrtpo.export import export_model


def make_run(folder: Path) -> Path:
    """A finished full fine-tuning run as ``mrtpo export`` sees it: config.yaml, a log, a checkpoint, model/."""
    (folder / "model").mkdir(parents=True)
    (folder / "model" / "config.json").write_text('{"model_type": "qwen2"}')
    (folder / "model" / "model.safetensors").write_bytes(b"weights")
    (folder / "config.yaml").write_text("task: sql\n")
    (folder / "metrics.jsonl").write_text('{"step": 1}\n')
    (folder / "checkpoint-1").mkdir()
    (folder / "checkpoint-1" / "trainer_state.json").write_text('{"global_step": 1}')
    return folder


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def export_error(capsys, *argv) -> str:
    """``mrtpo export`` refusing: exit 2, one line on stderr, no traceback."""
    assert cli_main(["export", *map(str, argv)]) == 2
    out, err = capsys.readouterr()
    lines = [line for line in err.splitlines() if line.strip()]
    assert "Traceback" not in out + err and len(lines) == 1 and lines[0].startswith("mrtpo export: error: "), err
    return lines[0]


# --------------------------------------------------------------------------------------------
# 1. Output folders export may not replace.
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("where, why", [
    ("run", "is a run folder"),  # --output-dir RUN --overwrite deleted the run, then crashed
    ("parent", "holds a run"),  # ... and the parent case every other run and file in it
    ("run/model", "is inside the run folder"),
    ("run/checkpoint-1", "is a checkpoint"),
    ("run/checkpoint-1/sub", "is inside the checkpoint"),
    ("other", "holds files mrtpo export did not write"),
    ("file.txt", "is a file"),
])
def test_export_refuses_an_output_that_is_or_holds_a_run_or_other_files(tmp_path, capsys, where, why):
    run = make_run(tmp_path / "run")
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("mine")
    (tmp_path / "file.txt").write_text("mine")
    dest = {"parent": tmp_path}.get(where, tmp_path / where)
    before = snapshot(tmp_path)
    line = export_error(capsys, run, "--output-dir", dest, "--overwrite")
    assert f"{dest} {why}" in line
    assert snapshot(tmp_path) == before
    assert not list(tmp_path.glob(".*.partial"))


def test_export_replaces_only_its_own_earlier_export(tmp_path, capsys):
    run = make_run(tmp_path / "run")
    dest = tmp_path / "merged"
    assert export_model(run, dest) == dest
    assert (dest / "model.safetensors").read_bytes() == b"weights"
    line = export_error(capsys, run, "--output-dir", dest)
    assert f"{dest} holds an earlier export: --overwrite replaces it" in line
    assert export_model(run, dest, overwrite=True) == dest
    # The run's own export slot (the default) is replaced like any earlier export.
    assert export_model(run) == run / "export"
    assert export_model(run, overwrite=True) == run / "export"
    (dest / "mine.txt").write_text("added by hand")  # an export with files of the user's: not replaced
    assert "holds files mrtpo export did not write (mine.txt)" in export_error(capsys, run, "--output-dir", dest,
                                                                                "--overwrite")


# --------------------------------------------------------------------------------------------
# 2. Numeric settings: finite and in range, one check for the command line, task files and the API.
# --------------------------------------------------------------------------------------------
NAN, INF = float("nan"), float("inf")
BAD_NUMBERS = [
    ({"reward_weights": [NAN, 1.0, 1.0]}, "reward_weights must be finite, got [nan, 1.0, 1.0]"),
    ({"reward_weights": [1.0, -INF, 1.0]}, "reward_weights must be finite, got [1.0, -inf, 1.0]"),
    ({"temperature": 0.0}, "temperature must be > 0, got 0.0"),  # MRTPOConfig(temperature=0): ZeroDivisionError
    ({"temperature": NAN}, "temperature must be finite, got nan"),
    ({"learning_rate": INF}, "learning_rate must be finite, got inf"),
    ({"lam": NAN}, "lam must be finite, got nan"),
    ({"max_grad_norm": NAN}, "max_grad_norm must be finite, got nan"),
    ({"beta": -0.1}, "beta must be >= 0, got -0.1"),
    ({"max_steps": 0}, "max_steps must be >= 1, got 0"),
    ({"top_p": 1.5}, "top_p must be in (0, 1]"),
    ({"num_generations": 1}, "num_generations must be >= 2"),
]


@pytest.mark.parametrize("settings, message", BAD_NUMBERS, ids=[next(iter(s)) + str(i) for i, (s, _) in
                                                                 enumerate(BAD_NUMBERS)])
def test_a_bad_number_is_refused_by_the_python_api(settings, message):
    from mrtpo.trainer.config import MRTPOConfig

    with pytest.raises(ValueError) as err:
        MRTPOConfig(output_dir="unused", use_cpu=True, **settings)
    assert message in str(err.value)


@pytest.mark.parametrize("settings, message", BAD_NUMBERS, ids=[next(iter(s)) + str(i) for i, (s, _) in
                                                                 enumerate(BAD_NUMBERS)])
def test_a_bad_number_is_refused_by_the_config_layers(settings, message):
    with pytest.raises(ConfigError) as err:
        load_config([], {"task": "gym-constraints", "model": "gym", **settings})
    assert message in str(err.value)


def test_the_api_defaults_pass_and_max_steps_minus_one_means_epochs_there_only():
    from mrtpo.trainer.config import MRTPOConfig

    assert MRTPOConfig(output_dir="unused", use_cpu=True).max_steps == -1  # transformers' default: train num_train_epochs
    with pytest.raises(ConfigError, match="max_steps must be >= 1, got -1"):
        load_config([], {"task": "gym-constraints", "model": "gym", "max_steps": -1})


@pytest.mark.parametrize("key, value", [("lora_alpha", INF), ("lora_learning_rate", INF), ("lora_dropout", NAN)])
def test_run_settings_must_be_finite(key, value):
    with pytest.raises(ConfigError, match=f"{key} must be"):
        load_config([], {"task": "gym-constraints", "model": "gym", key: value})


def write_task(folder: Path, weights: str = "1.0", reward: str = "return [1.0 for _ in completions]",
               rows: str = '{"prompt": "say hi", "tags": ["a"]}\n' * 4) -> Path:
    """A task file with one reward (``reward`` is its body) over ``rows`` (data.jsonl)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "data.jsonl").write_text(rows)
    (folder / "rewards.py").write_text(f"def r(completions, **kwargs):\n    {reward}\n")
    (folder / "task.yaml").write_text(f"dataset: data.jsonl\nrewards:\n  rewards.py:r: {weights}\n")
    return folder / "task.yaml"


@pytest.mark.parametrize("weight", [".nan", ".inf", "-.inf"])
def test_a_task_file_reward_weight_must_be_finite(tmp_path, weight):
    from mrtpo.tasks.from_config import TaskFileError, load_task_file

    with pytest.raises(TaskFileError, match=r"the weight of reward 'rewards.py:r' must be a finite number"):
        load_task_file(write_task(tmp_path, weights=weight))


def test_a_nan_weight_on_the_command_line_is_one_line_before_any_model_loads(tmp_path, capsys, monkeypatch):
    import mrtpo.train

    monkeypatch.setattr(mrtpo.train, "build_trainer", lambda *a, **k: pytest.fail("a model was loaded"))
    assert mrtpo.train.main(["--task", "gym-constraints", "--model", "gym", "--output-dir", str(tmp_path / "run"),
                             "reward_weights=[.nan, 1, 1]"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "reward_weights must be finite, got [nan, 1, 1]" in err
    assert not (tmp_path / "run").exists()
