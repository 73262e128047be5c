"""Issue 31's reliability probes through ``mrtpo train``: every bad input is one clear line before any
model loads (a table), and a run folder survives reuse, failed commands, torn logs, half-written and
corrupt checkpoints and a resume past its end, with resume still equal to an uninterrupted run.

Real runs are in-process on the credit gym (``--task gym-constraints --model gym``) with a warm start
of three steps in a temporary model cache: a 3-step run takes about 2 s.
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

import mrtpo.train
from mrtpo.rewards import RewardValueError, check_reward_values
from mrtpo.run_folder import checkpoint_problem, file_problem
from mrtpo.train import main
from mrtpo.trainer.metrics import json_line, trim_jsonl

FLAGS = ["--task", "gym-constraints", "--model", "gym"]
KEYS = [
    "task_args={policy: {steps: 3, batch_size: 8}}",
    "num_generations=4",
    "per_device_train_batch_size=8",
    "max_completion_length=24",
    "report=false",
    "save_steps=1",
]
VOLATILE = ("time", "step_time", "train_runtime", "train_samples_per_second", "train_steps_per_second")


def train(out, *flags, keys=()):
    """``mrtpo train`` on the gym in ``out`` (flags first, then key=value, as argparse wants them; ``--resume``
    without a path is followed by ``--output-dir``)."""
    return main([*FLAGS, *flags, "--output-dir", str(out), *KEYS, *keys])


@pytest.fixture(scope="module", autouse=True)
def gym_cache(tmp_path_factory):
    """The gym warm starts of this module go to a temporary model cache; torch on one thread."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MRTPO_CACHE", str(tmp_path_factory.mktemp("gym-cache")))
        yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A finished 3-step run with a checkpoint at every step."""
    out = tmp_path_factory.mktemp("runs") / "finished"
    assert train(out, "--max-steps", "3") == 0
    return out


@pytest.fixture
def run(finished, tmp_path):
    """A copy of the finished run to damage."""
    return Path(shutil.copytree(finished, tmp_path / "run"))


@pytest.fixture
def no_model(monkeypatch):
    """Loading a model (``build_trainer``) fails the test."""

    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr(mrtpo.train, "build_trainer", refuse)


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def one_error_line(capsys, *, loaded: bool = False) -> str:
    """The command's one error line, and no traceback. Before a model loads stderr holds nothing else;
    after (``loaded``) it also holds the loading and progress bars, on whose last line the error starts."""
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    lines = [line for line in err.splitlines() if line.strip()]
    if loaded:
        lines = [line[line.index("mrtpo train: ") :] for line in lines if "mrtpo train: " in line]
    assert len(lines) == 1 and lines[0].startswith("mrtpo train: error: "), err
    return lines[0]


def records(path: Path) -> list[dict]:
    return [
        {k: v for k, v in json.loads(line).items() if k not in VOLATILE and not k.startswith(("time/", "memory/"))}
        for line in path.read_text().splitlines()
    ]


# --------------------------------------------------------------------------------------------
# Bad input: one line, before any model loads, and the finished run it points at is untouched.
# --------------------------------------------------------------------------------------------
BAD_INPUTS = [
    ([], ["learning_rate=0"], "learning_rate must be > 0, got 0"),
    (["--learning-rate=-1e-5"], [], "learning_rate must be > 0, got -1e-05"),
    ([], ["per_device_train_batch_size=0"], "per_device_train_batch_size must be >= 1, got 0"),
    ([], ["gradient_accumulation_steps=0"], "gradient_accumulation_steps must be >= 1, got 0"),
    ([], ["temperature=0"], "temperature must be > 0, got 0"),
    ([], ["temperature=-0.5"], "temperature must be > 0, got -0.5"),
    ([], ["max_completion_length=0"], "max_completion_length must be >= 1, got 0"),
    (["--max-steps", "0"], [], "max_steps must be >= 1, got 0"),
    (["--max-steps", "-5"], [], "max_steps must be >= 1, got -5"),
    ([], ["num_generations=1"], "num_generations must be >= 2"),
    (
        [],
        ["num_generations=3"],
        "per_device_train_batch_size x gradient_accumulation_steps x processes (8 x 1 x 1) "
        "must be divisible by num_generations (3)",
    ),
    ([], ["top_p=0"], "top_p must be in (0, 1] and min_p in [0, 1], got 0.0 and None"),
    ([], ["lora_dropout=1.5"], "lora_dropout must be in [0, 1), got 1.5"),
    ([], ["save_steps=0"], "save_steps must be > 0, got 0"),
    ([], ["beta=-1"], "beta must be >= 0, got -1"),
    ([], ["epsilon=0"], "epsilon must be > 0, got 0"),
    ([], ["min_p=2"], "min_p in [0, 1], got 1.0 and 2"),
    (["--lora-r", "4"], ["lora_target_modules=5"], "lora_target_modules must be all-linear or a list of module names"),
    ([], ["loss_type=nope"], "unknown loss_type 'nope'; choose one of dapo, grpo, bnpo, dr_grpo, cispo, sapo"),
    ([], ["report_to=nope"], "report_to='nope' is not a logging integration"),
    ([], ["eval_strategy=steps"], "eval_strategy='steps' needs held-out prompts: set eval_size"),
    ([], ["max_steps=many"], "max_steps (from command line) must be an integer, got 'many'"),
    ([], ["num_generation=4"], "unknown config key 'num_generation'"),
    ([], ["dtype=int8"], "dtype must be float32, bfloat16 or float16, got 'int8'"),
    ([], ["task_args={train_size: 0, policy: {steps: 3}}"], "task 'gym-constraints' has no train examples"),
    ([], ["task_args={p_follow: 2}"], "do not fit task 'gym-constraints': p_follow must be in [0, 1], got 2"),
    ([], ["task_args={policy: {stepz: 3}}"], "does not fit the gym policy"),
    (
        [],
        [],
        "already holds a run (README.md, checkpoint-1, checkpoint-2, checkpoint-3, ...): continue it with --resume",
    ),
    (["--resume", "--overwrite"], [], "--overwrite starts a new run; it cannot be combined with --resume"),
    (["--resume"], ["learning_rate=0"], "learning_rate must be > 0, got 0"),
    (["--resume"], ["temperature=0"], "temperature must be > 0, got 0"),
]


@pytest.mark.parametrize("flags, keys, message", BAD_INPUTS, ids=[" ".join(f + k)[:40] for f, k, _ in BAD_INPUTS])
def test_bad_input_is_one_line_before_any_model_loads(finished, no_model, capsys, flags, keys, message):
    before = snapshot(finished)
    assert train(finished, *flags, keys=keys) == 2
    assert message in one_error_line(capsys)
    assert snapshot(finished) == before


def test_an_unwritable_output_folder_is_one_line(tmp_path, no_model, capsys):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    assert train(blocker / "run") == 2
    assert f"cannot write to the output folder {blocker / 'run'}: Not a directory" in one_error_line(capsys)
    if os.geteuid() != 0:  # root writes into read-only folders
        read_only = tmp_path / "read-only"
        read_only.mkdir(mode=0o555)
        assert train(read_only) == 2
        assert "cannot write to the output folder" in one_error_line(capsys)


@pytest.mark.parametrize(
    "body, message",
    [
        ("raise RuntimeError('boom')", "MRTPO_PLUGINS module 'bad_plugin' raised RuntimeError while importing: boom"),
        ("import no_such_module_anywhere", "MRTPO_PLUGINS names 'bad_plugin', which does not import"),
    ],
)
def test_a_failing_plugin_names_mrtpo_plugins_and_the_module(tmp_path, body, message):
    (tmp_path / "bad_plugin.py").write_text(body + "\n")
    env = {**os.environ, "MRTPO_PLUGINS": "bad_plugin", "PYTHONPATH": str(tmp_path), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "mrtpo.cli", "train", "--list-keys"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode != 0 and "Traceback" not in done.stderr
    assert [line for line in done.stderr.splitlines() if line.strip()] == [done.stderr.strip()]
    assert message in done.stderr


# --------------------------------------------------------------------------------------------
# Reward values.
# --------------------------------------------------------------------------------------------
def test_reward_values_must_be_finite_numbers_or_none():
    ok = [1, 0.5, None, float("nan"), True, torch.tensor(2.0)]
    assert check_reward_values("r", ok) is ok
    bad = [
        (["1.0"], "reward function 'r' returned '1.0' (a str) for row 0 (example_id 'a')"),
        ([0.0, float("inf")], "reward function 'r' returned inf (infinite) for row 1 (example_id 'b')"),
        ([0.0, -float("inf")], "returned -inf (infinite) for row 1"),
        ([[1.0]], "returned [1.0] (a list) for row 0"),
        (0.5, "reward function 'r' returned a float (0.5), not a list with one reward per completion"),
    ]
    for values, message in bad:
        with pytest.raises(RewardValueError) as err:
            check_reward_values("r", values, ["a", "b"])
        assert message in str(err.value)


def test_checked_reward_funcs_check_sync_and_async_functions_and_restore_them():
    import asyncio
    from types import SimpleNamespace

    from trl.trainer.utils import is_async_callable

    from mrtpo.rewards import checked_reward_funcs

    def sync(completions, **kwargs):
        return [1.0, "no"]

    async def later(completions, **kwargs):
        return [float("-inf"), 0.0]

    scorer = torch.nn.Linear(1, 1)  # a reward model: TRL takes its logits as they are
    trainer = SimpleNamespace(reward_funcs=[sync, later, scorer], reward_func_names=["s", "a", "m"])
    with checked_reward_funcs(trainer):
        checked_sync, checked_async, model = trainer.reward_funcs
        assert model is scorer and is_async_callable(checked_async) and not is_async_callable(checked_sync)
        with pytest.raises(RewardValueError, match=r"'s' returned 'no' \(a str\) for row 1 \(example_id 'y'\)"):
            checked_sync(completions=["p", "q"], example_id=["x", "y"])
        with pytest.raises(RewardValueError, match=r"'a' returned -inf \(infinite\) for row 0"):
            asyncio.run(checked_async(completions=["p", "q"]))
    assert trainer.reward_funcs == [sync, later, scorer]


class BadReward:
    """A gym reward that returns ``value`` for the second completion of every batch."""

    name = "bad"

    def __init__(self, value):
        self.value = value

    def __call__(self, completion, example):
        self.calls = getattr(self, "calls", 0) + 1
        return self.value if self.calls == 2 else 1.0

    def evidence(self, example):
        return None


@pytest.mark.parametrize("value, shown", [("yes", "'yes' (a str)"), (float("inf"), "inf (infinite)")])
def test_a_bad_reward_value_stops_training_with_one_line_and_keeps_the_logs(run, monkeypatch, capsys, value, shown):
    from mrtpo.gym.task import ConstraintsTask

    original = ConstraintsTask.verifiers
    monkeypatch.setattr(ConstraintsTask, "verifiers", lambda self: [*original(self), BadReward(value)])
    logs = {name: (run / name).read_bytes() for name in ("metrics.jsonl", "credit_samples.jsonl")}
    assert train(run, "--resume", "--max-steps", "4") == 2  # fails while scoring step 4
    line = one_error_line(capsys, loaded=True)
    assert f"reward function 'bad' returned {shown} for row 1 (example_id 'gym-constraints-train-" in line
    assert {name: (run / name).read_bytes() for name in logs} == logs  # the finished run's logs are intact
    assert b"Infinity" not in logs["metrics.jsonl"]


def test_metrics_lines_are_strict_json():
    line = json_line({"step": 1, "loss": float("inf"), "reward": float("nan"), "x": -float("inf"), "ok": 0.5})
    assert json.loads(line) == {"step": 1, "loss": None, "reward": None, "x": None, "ok": 0.5}
    assert line.endswith("\n") and line.count("\n") == 1


# --------------------------------------------------------------------------------------------
# The run folder.
# --------------------------------------------------------------------------------------------
def test_overwrite_starts_over_and_leaves_nothing_of_the_old_run(run, capsys):
    (run / "notes.txt").write_text("mine")
    assert train(run, "--max-steps", "1", "--overwrite") == 0
    assert "--overwrite: removing the earlier run" in capsys.readouterr().out
    assert [r["step"] for r in records(run / "metrics.jsonl")] == [1, 1]
    assert sorted(p.name for p in run.glob("checkpoint-*")) == ["checkpoint-1"]
    assert (run / "notes.txt").read_text() == "mine"  # only the run's own files go


def test_a_model_that_fails_to_load_leaves_the_run_resumable(run, capsys):
    before = snapshot(run)
    assert train(run, "--resume", "--max-steps", "4", "--model", "no-such-model") == 2
    assert "no-such-model" in one_error_line(capsys)
    assert snapshot(run) == before
    assert train(run, "--resume", "--max-steps", "4") == 0
    assert [r["step"] for r in records(run / "metrics.jsonl")] == [1, 2, 3, 3, 4, 4]


def test_resuming_a_finished_run_says_so_and_trains_nothing(run, no_model, capsys):
    before = snapshot(run)
    assert train(run, "--resume") == 0
    assert f"{run} is already finished: checkpoint-3 is at step 3 of max_steps 3" in capsys.readouterr().out
    assert snapshot(run) == before


def test_resuming_past_the_end_trains_exactly_the_new_steps(run):
    assert train(run, "--resume", "--max-steps", "4") == 0
    assert [r["step"] for r in records(run / "metrics.jsonl")] == [1, 2, 3, 3, 4, 4]
    assert sorted(p.name for p in run.glob("checkpoint-*"))[-1] == "checkpoint-4"
    assert json.loads((run / "checkpoint-4" / "trainer_state.json").read_text())["global_step"] == 4


def _assert_same_as_finished(run, finished):
    """The resumed run equals the uninterrupted one: every metric, credit sample and weight."""
    assert records(run / "metrics.jsonl")[:3] == records(finished / "metrics.jsonl")[:3]
    assert (run / "credit_samples.jsonl").read_text() == (finished / "credit_samples.jsonl").read_text()
    a = load_file(run / "checkpoint-3" / "model.safetensors")
    b = load_file(finished / "checkpoint-3" / "model.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_a_torn_last_log_line_is_dropped_and_resume_is_exact(run, finished, capsys):
    shutil.rmtree(run / "checkpoint-3")  # interrupted after checkpoint-2, mid-way through a log line of step 3
    with (run / "metrics.jsonl").open("a") as f:
        f.write('{"step": 3, "loss": 0.1')
    with (run / "credit_samples.jsonl").open("a") as f:
        f.write('{"step": 2, "exam')
    assert train(run, "--resume") == 0
    out = capsys.readouterr().out
    assert "note: dropped the torn last line of metrics.jsonl" in out
    assert "note: dropped the torn last line of credit_samples.jsonl" in out
    _assert_same_as_finished(run, finished)


def test_a_half_written_checkpoint_is_passed_over_with_a_note(run, finished, capsys):
    # kill -9 while checkpoint-3 was being written: its optimizer state is cut short, its
    # trainer_state.json (written last) never came.
    (run / "checkpoint-3" / "trainer_state.json").unlink()
    optimizer = run / "checkpoint-3" / "optimizer.pt"
    optimizer.write_bytes(optimizer.read_bytes()[:100])
    assert train(run, "--resume") == 0
    out = capsys.readouterr().out
    assert "note: passing over checkpoint-3: trainer_state.json is missing" in out
    assert f"resuming from {run / 'checkpoint-2'} (step 2)" in out
    _assert_same_as_finished(run, finished)


@pytest.mark.parametrize(
    "name, where",
    [("model.safetensors", ""), ("optimizer.pt", ""), ("rng_state.pth", ""), ("trainer_state.json", "checkpoint-3")],
)
def test_a_truncated_checkpoint_file_is_one_line_naming_it_and_the_previous_checkpoint(
    run, no_model, capsys, name, where
):
    damaged = run / "checkpoint-3" / name
    damaged.write_bytes(damaged.read_bytes()[:-7])
    before = snapshot(run)
    assert main([*FLAGS, "--resume", str(run / where), *KEYS]) == 2
    line = one_error_line(capsys)
    assert f"cannot resume from {run / 'checkpoint-3'}: {damaged} is" in line
    assert f"the previous complete checkpoint is {run / 'checkpoint-2'}" in line
    assert snapshot(run) == before


def test_a_checkpoint_of_another_run_is_refused_naming_the_settings(run, no_model, capsys):
    config = run / "config.yaml"  # as an older mrtpo left it: a fresh run rewrote config.yaml, kept checkpoint-3
    config.write_text(
        config.read_text().replace("learning_rate: 2.0e-06", "learning_rate: 0.001").replace("seed: 42", "seed: 7")
    )
    before = snapshot(run)
    assert train(run, "--resume") == 2
    line = one_error_line(capsys)
    assert f"{run / 'checkpoint-3'} was saved under other settings than {config}" in line
    assert "learning_rate: 2e-06 vs 0.001; seed: 42 vs 7" in line
    assert snapshot(run) == before
    # Setting them on the command line is the user's word that the checkpoint goes on under them.
    with pytest.raises(AssertionError, match="a model was loaded"):
        train(run, "--resume", "--max-steps", "4", "--seed", "7", keys=["learning_rate=0.001"])
    # A checkpoint without the copy of its settings (an older mrtpo's) cannot be checked, and says so.
    (run / "checkpoint-3" / "mrtpo_config.yaml").unlink()
    capsys.readouterr()
    with pytest.raises(AssertionError, match="a model was loaded"):
        train(run, "--resume", "--max-steps", "4")
    assert "note: checkpoint-3 carries no copy of its settings" in capsys.readouterr().out


def test_a_full_disk_while_training_is_one_line(run, monkeypatch, capsys):
    import errno

    import mrtpo.trainer.metrics

    def full(path, record):
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(mrtpo.trainer.metrics, "append_jsonl", full)
    assert train(run, "--resume", "--max-steps", "4") == 2
    line = one_error_line(capsys, loaded=True)
    assert f"cannot write {run / 'metrics.jsonl'}: No space left on device" in line
    assert f"--resume {run}" in line


# --------------------------------------------------------------------------------------------
# The pieces, on hand-made files.
# --------------------------------------------------------------------------------------------
def test_trim_jsonl_drops_only_a_torn_last_line_and_rewrites_only_on_change(tmp_path):
    path = tmp_path / "m.jsonl"
    path.write_text('{"step": 1}\n{"step": 2}\n{"step": 3')
    assert trim_jsonl(path, lambda r: True) is True
    assert path.read_text() == '{"step": 1}\n{"step": 2}\n'
    inode = path.stat().st_ino
    assert trim_jsonl(path, lambda r: True) is False and path.stat().st_ino == inode  # nothing to do: not rewritten
    assert trim_jsonl(path, lambda r: r["step"] <= 1) is False and path.read_text() == '{"step": 1}\n'
    path.write_text('{"step": 1}\n{"ste\n{"step": 3}\n')
    with pytest.raises(ValueError, match="m.jsonl line 2 is not JSON"):
        trim_jsonl(path, lambda r: True)
    assert trim_jsonl(tmp_path / "absent.jsonl", lambda r: True) is False


def test_file_problem_reads_only_headers(tmp_path):
    weights = tmp_path / "model.safetensors"
    save_file({"w": torch.zeros(64)}, weights)
    size = weights.stat().st_size
    assert file_problem(weights) is None
    weights.write_bytes(weights.read_bytes()[:-4])
    assert file_problem(weights) == f"is truncated ({size - 4} of {size} bytes)"
    state = tmp_path / "optimizer.pt"
    torch.save({"x": torch.zeros(64)}, state)
    assert file_problem(state) is None
    state.write_bytes(state.read_bytes()[:-1])
    assert file_problem(state) == "is truncated or corrupt"
    (tmp_path / "empty.json").write_text("")
    assert file_problem(tmp_path / "empty.json") == "is empty"


def test_checkpoint_problem_requires_what_an_exact_resume_loads(finished, tmp_path):
    assert checkpoint_problem(finished / "checkpoint-3") is None
    for name in ("scheduler.pt", "rng_state.pth", "model.safetensors"):
        ckpt = Path(shutil.copytree(finished / "checkpoint-3", tmp_path / name))
        (ckpt / name).unlink()
        problem = checkpoint_problem(ckpt)
        assert problem is not None and not problem.incomplete
        assert problem.why == ("holds no model weights" if name == "model.safetensors" else "is missing")
