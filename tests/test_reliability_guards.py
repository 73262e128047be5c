"""Issue 41's reliability probes that need no model: output folders that ``mrtpo export`` may not
replace, numeric settings checked once for the command line, task files and the Python API, one
writer per run folder, reward functions with a deadline, and a run that pins its task.

Every run folder here is made by hand (a ``config.yaml`` and a ``model/`` of a few bytes): exporting a
full fine-tuning run copies ``model/`` and loads nothing.
"""

import contextlib
import errno
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mrtpo.config import ConfigError, load_config
from mrtpo.export import export_model, main as export_main
from mrtpo.run_lock import LOCK_NAME


def make_run(folder: Path) -> Path:
    """A finished full fine-tuning run as ``mrtpo export`` sees it: config.yaml, a log, a checkpoint, model/."""
    (folder / "model").mkdir(parents=True)
    (folder / "model" / "config.json").write_text('{"model_type": "qwen2"}')
    (folder / "model" / "model.safetensors").write_bytes(b"weights")
    (folder / "model" / "README.md").write_text("model card")  # a run file name an export holds too
    (folder / "config.yaml").write_text("task: sql\n")
    (folder / "metrics.jsonl").write_text('{"step": 1}\n')
    (folder / "checkpoint-1").mkdir()
    (folder / "checkpoint-1" / "trainer_state.json").write_text('{"global_step": 1}')
    return folder


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` but a run's lock file (the commands' own, emptied when they end)."""
    return {
        str(p.relative_to(folder)): p.read_bytes()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.name != LOCK_NAME
    }


def export_error(capsys, *argv) -> str:
    """``mrtpo export`` refusing: exit 2, one line on stderr, no traceback."""
    assert export_main([*map(str, argv)]) == 2  # the command itself: mrtpo.cli would configure logging globally
    out, err = capsys.readouterr()
    lines = [line for line in err.splitlines() if line.strip()]
    assert "Traceback" not in out + err and len(lines) == 1 and lines[0].startswith("mrtpo export: error: "), err
    return lines[0]


# --------------------------------------------------------------------------------------------
# 1. Output folders export may not replace.
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "where, why",
    [
        ("run", "is a run folder"),  # --output-dir RUN --overwrite deleted the run, then crashed
        ("parent", "holds a run"),  # ... and the parent case every other run and file in it
        ("run/model", "is inside the run folder"),
        ("run/checkpoint-1", "is a checkpoint"),
        ("run/checkpoint-1/sub", "is inside the checkpoint"),
        ("other", "holds files mrtpo export did not write"),
        ("file.txt", "is a file"),
    ],
)
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
    assert "holds files mrtpo export did not write (mine.txt)" in export_error(
        capsys, run, "--output-dir", dest, "--overwrite"
    )


def test_a_full_disk_while_exporting_is_one_line_and_leaves_no_partial_output(tmp_path, capsys, monkeypatch):
    import mrtpo.export

    def full(src, dst, **kwargs):
        Path(dst).mkdir()
        raise OSError(errno.ENOSPC, "No space left on device", str(dst))

    monkeypatch.setattr(mrtpo.export.shutil, "copytree", full)
    run = make_run(tmp_path / "run")
    line = export_error(capsys, run, "--output-dir", tmp_path / "merged")
    assert "cannot write" in line and "No space left on device" in line
    assert not (tmp_path / "merged").exists() and not (tmp_path / ".merged.partial").exists()


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


@pytest.mark.parametrize(
    "settings, message", BAD_NUMBERS, ids=[next(iter(s)) + str(i) for i, (s, _) in enumerate(BAD_NUMBERS)]
)
def test_a_bad_number_is_refused_by_the_python_api(settings, message):
    from mrtpo.trainer.config import MRTPOConfig

    with pytest.raises(ValueError) as err:
        MRTPOConfig(output_dir="unused", use_cpu=True, **settings)
    assert message in str(err.value)


@pytest.mark.parametrize(
    "settings, message", BAD_NUMBERS, ids=[next(iter(s)) + str(i) for i, (s, _) in enumerate(BAD_NUMBERS)]
)
def test_a_bad_number_is_refused_by_the_config_layers(settings, message):
    with pytest.raises(ConfigError) as err:
        load_config([], {"task": "gym-constraints", "model": "gym", **settings})
    assert message in str(err.value)


def test_the_api_defaults_pass_and_max_steps_minus_one_means_epochs_there_only():
    from mrtpo.trainer.config import MRTPOConfig

    assert MRTPOConfig(output_dir="unused", use_cpu=True).max_steps == -1  # epochs
    with pytest.raises(ConfigError, match="max_steps must be >= 1, got -1"):
        load_config([], {"task": "gym-constraints", "model": "gym", "max_steps": -1})


@pytest.mark.parametrize("key, value", [("lora_alpha", INF), ("lora_learning_rate", INF), ("lora_dropout", NAN)])
def test_run_settings_must_be_finite(key, value):
    with pytest.raises(ConfigError, match=f"{key} must be"):
        load_config([], {"task": "gym-constraints", "model": "gym", key: value})


def write_task(
    folder: Path,
    weights: str = "1.0",
    reward: str = "return [1.0 for _ in completions]",
    rows: str = '{"prompt": "say hi", "tags": ["a"]}\n' * 4,
) -> Path:
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
    assert (
        mrtpo.train.main(
            [
                "--task",
                "gym-constraints",
                "--model",
                "gym",
                "--output-dir",
                str(tmp_path / "run"),
                "reward_weights=[.nan, 1, 1]",
            ]
        )
        == 2
    )
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "reward_weights must be finite, got [nan, 1, 1]" in err
    assert not (tmp_path / "run").exists()


# --------------------------------------------------------------------------------------------
# 3. One writer per run folder.
# --------------------------------------------------------------------------------------------
GYM = ["--task", "gym-constraints", "--model", "gym"]
GYM_KEYS = [
    "task_args={policy: {steps: 3, batch_size: 8}}",
    "num_generations=4",
    "per_device_train_batch_size=8",
    "max_completion_length=24",
    "report=false",
    "save_steps=1",
]


@pytest.fixture
def gym_cache(tmp_path, monkeypatch):
    """The gym warm starts of a test go to a temporary model cache; torch on one thread."""
    import torch

    monkeypatch.setenv("MRTPO_CACHE", str(tmp_path / "cache"))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def held_elsewhere(folder: Path) -> bool:
    """Whether some open file holds ``folder``'s run lock (a new open file description cannot take it)."""
    import fcntl

    with open(folder / LOCK_NAME, "a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(f, fcntl.LOCK_UN)
        return False


def test_a_second_writer_is_refused_with_the_holders_pid(tmp_path, capsys):
    import mrtpo.train

    out = tmp_path / "run"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from pathlib import Path; "
            "from mrtpo.run_lock import lock_run_folder; lock_run_folder(Path(sys.argv[1])); "
            "print('locked', flush=True); time.sleep(60)",
            str(out),
        ],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": "src"},
    )
    try:
        assert holder.stdout.readline().strip() == "locked"
        assert mrtpo.train.main([*GYM, "--output-dir", str(out), *GYM_KEYS]) == 2
        err = capsys.readouterr().err.strip()
        assert err.count("\n") == 0
        assert f"{out} is in use by mrtpo train (pid {holder.pid}): wait for it to end" in err
    finally:
        holder.kill()
        holder.wait()
    assert sorted(p.name for p in out.iterdir()) == [".mrtpo.lock"]  # nothing of a run was written


def test_the_lock_is_held_before_a_model_loads_and_released_on_return(tmp_path, monkeypatch, capsys):
    import mrtpo.train

    out = tmp_path / "run"
    seen = []

    def build(config, data=None):
        seen.append(held_elsewhere(out))
        raise ConfigError("stop here")

    monkeypatch.setattr(mrtpo.train, "build_trainer", build)
    assert mrtpo.train.main([*GYM, "--output-dir", str(out), *GYM_KEYS]) == 2
    assert seen == [True]
    assert not held_elsewhere(out) and (out / ".mrtpo.lock").read_text() == ""  # released, the pid cleared


def test_processes_of_one_run_do_not_refuse_each_other(tmp_path, monkeypatch):
    """Under torchrun / accelerate only rank 0 takes the lock: the other ranks write nothing themselves."""
    import mrtpo.train

    out = tmp_path / "run"
    from mrtpo.run_lock import lock_run_folder

    lock = lock_run_folder(out)  # rank 0 holds it
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setattr(mrtpo.train, "build_trainer", lambda *a, **k: (_ for _ in ()).throw(ConfigError("rank 1 on")))
    try:
        assert mrtpo.train.main([*GYM, "--output-dir", str(out), *GYM_KEYS]) == 2  # reached the model, not refused
    finally:
        lock.release()


@contextlib.contextmanager
def held_by(folder: Path, command: str = "mrtpo train", shared: bool = False):
    """Another process holding ``folder``'s run lock as ``command`` would (exclusive, or ``shared``) until the
    block ends; yields the process (its pid is the holder's)."""
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from pathlib import Path; from mrtpo.run_lock import lock_run_folder; "
            "lock_run_folder(Path(sys.argv[1]), sys.argv[2], shared=sys.argv[3] == 'shared'); "
            "print('locked', flush=True); time.sleep(60)",
            str(folder),
            command,
            "shared" if shared else "exclusive",
        ],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": "src"},
    )
    try:
        assert holder.stdout.readline().strip() == "locked"
        yield holder
    finally:
        holder.kill()
        holder.wait()


def test_report_is_refused_while_a_training_holds_the_run_and_writes_nothing(tmp_path, capsys):
    from mrtpo.report.command import main as report_main

    run = make_run(tmp_path / "run")
    before = snapshot(run)
    with held_by(run) as training:
        assert report_main([str(run)]) == 2
        out, err = capsys.readouterr()
        assert err.count("\n") == 1 and "Traceback" not in out + err
        assert err.startswith(
            f"mrtpo report: error: {run} is in use by mrtpo train (pid {training.pid}): wait for it to end "
            f"(a training writes its own report at its end, unless report: false), then run mrtpo report {run}"
        )
        assert snapshot(run) == before  # no report file written
    assert report_main([str(run)]) == 0  # the training ended: the report is written
    assert (run / "report.md").is_file() and (run / LOCK_NAME).read_text() == ""


def test_export_is_refused_while_a_training_holds_the_run(tmp_path, capsys):
    run = make_run(tmp_path / "run")
    before = snapshot(tmp_path)
    with held_by(run) as training:
        for dest in (tmp_path / "merged", run / "export"):  # written elsewhere (a reader) or into the run
            line = export_error(capsys, run, "--output-dir", dest)
            assert f"{run} is in use by mrtpo train (pid {training.pid}): export reads model/ and the " in line
        assert snapshot(tmp_path) == before and not (tmp_path / "merged").exists()
    assert export_main([str(run), "--output-dir", str(tmp_path / "merged")]) == 0  # ended: exported
    assert (tmp_path / "merged" / "model.safetensors").read_bytes() == b"weights"


@pytest.mark.parametrize("command, shared", [("mrtpo report", False), ("mrtpo export", True)])
def test_training_is_refused_while_a_report_or_an_export_holds_the_run(gym_run, tmp_path, capsys, command, shared):
    import mrtpo.train

    fresh, run = tmp_path / "fresh", gym_run(tmp_path / "run")
    for out, resume in ((fresh, []), (run, ["--resume", str(run), "--max-steps", "4"])):
        before = snapshot(out) if out.exists() else {}
        with held_by(out, command, shared) as holder:
            assert mrtpo.train.main([*GYM, "--output-dir", str(out), *resume, *GYM_KEYS]) == 2
        err = capsys.readouterr().err.strip()
        assert err.count("\n") == 0 and f"{out} is in use by {command} (pid {holder.pid})" in err, err
        assert snapshot(out) == before


def test_exports_written_elsewhere_share_a_run_and_one_into_it_waits_for_them(tmp_path, capsys):
    from mrtpo.report.command import main as report_main

    run = make_run(tmp_path / "run")
    with held_by(run, "mrtpo export", shared=True) as reader:
        assert export_model(run, tmp_path / "copy") == tmp_path / "copy"  # two readers at once
        assert f"{reader.pid} mrtpo export" in (run / LOCK_NAME).read_text()  # the other reader still listed
        line = export_error(capsys, run)  # the default output, RUN/export, is a write into the run
        assert f"{run} is in use by mrtpo export (pid {reader.pid})" in line and not (run / "export").exists()
        assert report_main([str(run)]) == 2 and f"in use by mrtpo export (pid {reader.pid})" in capsys.readouterr().err
    assert export_model(run) == run / "export"  # the reader ended (killed: the kernel dropped its lock)
    assert (run / LOCK_NAME).read_text() == ""  # emptied by the last holder, the killed reader's line too


def test_a_run_folder_nobody_can_write_is_exported_without_a_lock(tmp_path, monkeypatch, capsys):
    """No lock file can be made there, so no training can be writing it: export reads it; report (a write) fails."""
    from mrtpo.report.command import main as report_main

    run = make_run(tmp_path / "run")
    real_open = os.open

    def read_only(path, flags, *args):
        if Path(path).name == LOCK_NAME:
            raise OSError(errno.EROFS, "Read-only file system", str(path))
        return real_open(path, flags, *args)

    monkeypatch.setattr(os, "open", read_only)
    assert export_model(run, tmp_path / "copy") == tmp_path / "copy"
    assert report_main([str(run)]) == 2
    assert f"cannot write to the output folder {run}: Read-only file system" in capsys.readouterr().err
    assert not (run / LOCK_NAME).exists() and not (run / "report.md").exists()


def test_a_holder_that_ended_is_not_named(tmp_path):
    from mrtpo.run_lock import RunLockError, lock_run_folder

    run = tmp_path / "run"
    with held_by(run, "mrtpo export", shared=True) as reader:
        with (run / LOCK_NAME).open("a") as f:
            f.write("999999999 mrtpo export\n")  # a reader that ended while another read (no such pid)
        with pytest.raises(RunLockError) as err:
            lock_run_folder(run)
    assert str(err.value).startswith(f"{run} is in use by mrtpo export (pid {reader.pid}): wait")
    assert "999999999" not in str(err.value)


@pytest.mark.slow  # two subprocesses that import torch and train: ~50 s on a shared 2-core machine
def test_two_runs_started_together_never_share_a_folder(tmp_path, gym_cache):
    out = tmp_path / "run"
    command = [
        sys.executable,
        "-m",
        "mrtpo.cli",
        "train",
        *GYM,
        "--output-dir",
        str(out),
        "--max-steps",
        "2",
        *GYM_KEYS,
    ]
    env = {**os.environ, "PYTHONPATH": "src", "OMP_NUM_THREADS": "1"}
    runs = [
        subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)
    ]
    results = [(p.wait(timeout=300), p.stderr.read()) for p in runs]
    assert sorted(code for code, _ in results) == [0, 2], results
    refused = next(err for code, err in results if code == 2)
    assert "is in use by mrtpo train (pid " in refused or "already holds a run" in refused
    steps = [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert steps == sorted(steps) and steps[-1] == 2


# --------------------------------------------------------------------------------------------
# 4. Reward functions with a deadline.
# --------------------------------------------------------------------------------------------
def slow_trainer(timeout):
    """What :func:`mrtpo.rewards.checked_reward_funcs` reads of a trainer: a fast, a slow and an async reward."""
    import asyncio
    from types import SimpleNamespace

    def fast(completions, **kwargs):
        return [1.0] * len(completions)

    def slow(completions, **kwargs):
        time.sleep(5)
        return [1.0] * len(completions)

    async def slow_async(completions, **kwargs):
        await asyncio.sleep(5)
        return [1.0] * len(completions)

    return SimpleNamespace(
        reward_funcs=[fast, slow, slow_async],
        reward_func_names=["fast", "slow", "slow_async"],
        args=SimpleNamespace(reward_timeout=timeout),
    )


def test_a_reward_past_its_deadline_is_named_and_progress_is_shown(monkeypatch, capsys):
    import asyncio

    import mrtpo.rewards
    from mrtpo.rewards import RewardTimeoutError, checked_reward_funcs

    monkeypatch.setattr(mrtpo.rewards, "PROGRESS_EVERY_S", 0.2)
    trainer = slow_trainer(0.5)
    with checked_reward_funcs(trainer):
        fast, slow, slow_async = trainer.reward_funcs
        assert fast(completions=["a", "b"]) == [1.0, 1.0]
        t0 = time.monotonic()
        with pytest.raises(
            RewardTimeoutError,
            match=r"reward function 'slow' did not return within reward_timeout "
            r"\(0.5 s\)",
        ):
            slow(completions=["a"])
        assert time.monotonic() - t0 < 2
        assert "scoring: reward function 'slow' still running after 0." in capsys.readouterr().err
        with pytest.raises(RewardTimeoutError, match="reward function 'slow_async' did not return within"):
            asyncio.run(slow_async(completions=["a"]))


def test_a_reward_under_a_deadline_runs_in_the_callers_grad_mode():
    import torch

    from mrtpo.rewards import checked_reward_funcs

    def grad_mode(completions, **kwargs):
        return [float(torch.is_grad_enabled())] * len(completions)

    trainer = slow_trainer(5.0)
    trainer.reward_funcs, trainer.reward_func_names = [grad_mode], ["grad_mode"]
    with checked_reward_funcs(trainer):
        with torch.no_grad():  # TRL scores under no_grad: a reward's torch work builds no graph
            assert trainer.reward_funcs[0](completions=["a"]) == [0.0]
        assert trainer.reward_funcs[0](completions=["a"]) == [1.0]


def test_no_deadline_when_reward_timeout_is_none():
    from mrtpo.rewards import checked_reward_funcs

    trainer = slow_trainer(None)
    trainer.reward_funcs = trainer.reward_funcs[:1]
    with checked_reward_funcs(trainer):
        assert trainer.reward_funcs[0](completions=["a"]) == [1.0]


def test_reward_timeout_is_a_setting_with_a_default_and_a_range():
    from mrtpo.trainer.config import MRTPOConfig

    assert MRTPOConfig(output_dir="unused", use_cpu=True).reward_timeout == 300.0
    with pytest.raises(ValueError, match="reward_timeout must be > 0, got 0"):
        MRTPOConfig(output_dir="unused", use_cpu=True, reward_timeout=0)


def test_a_slow_reward_stops_training_with_one_line_naming_it(tmp_path, gym_cache, monkeypatch, capsys):
    import mrtpo.train
    from mrtpo.gym.task import ConstraintsTask

    class Slow:
        name = "sleepy"

        def __call__(self, completion, example):
            time.sleep(30)
            return 1.0

        def evidence(self, example):
            return None

    original = ConstraintsTask.verifiers
    monkeypatch.setattr(ConstraintsTask, "verifiers", lambda self: [*original(self), Slow()])
    t0 = time.monotonic()
    assert (
        mrtpo.train.main(
            [*GYM, "--output-dir", str(tmp_path / "run"), "--max-steps", "2", *GYM_KEYS, "reward_timeout=1"]
        )
        == 2
    )
    assert time.monotonic() - t0 < 30
    err = [line for line in capsys.readouterr().err.splitlines() if "mrtpo train: error" in line]
    assert len(err) == 1 and "reward function 'sleepy' did not return within reward_timeout (1.0 s)" in err[0]


# --------------------------------------------------------------------------------------------
# 6. --resume --max-steps N: the schedule of a run planned for N steps.
# --------------------------------------------------------------------------------------------
def learning_rates(run: Path) -> dict[int, float]:
    lines = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["learning_rate"] for r in lines if "learning_rate" in r}


def test_resume_with_more_steps_follows_the_schedule_of_the_new_length(tmp_path, gym_cache):
    import mrtpo.train

    short, planned = tmp_path / "short", tmp_path / "planned"
    assert mrtpo.train.main([*GYM, "--output-dir", str(short), "--max-steps", "3", *GYM_KEYS]) == 0
    assert learning_rates(short)[3] == pytest.approx(2e-6 / 3)  # step s of N uses lr x (N - s + 1) / N
    assert mrtpo.train.main([*GYM, "--resume", str(short), "--max-steps", "6", *GYM_KEYS]) == 0
    assert mrtpo.train.main([*GYM, "--output-dir", str(planned), "--max-steps", "6", *GYM_KEYS]) == 0
    resumed, expected = learning_rates(short), learning_rates(planned)
    assert [resumed[s] for s in (4, 5, 6)] == [expected[s] for s in (4, 5, 6)]  # the first resumed step too
    assert [round(resumed[s] / 2e-6 * 6, 9) for s in (4, 5, 6)] == [3.0, 2.0, 1.0]  # lr x (6 - s + 1) / 6


# --------------------------------------------------------------------------------------------
# 5. A run pins its task.
# --------------------------------------------------------------------------------------------
def test_task_fingerprint_hashes_the_task_file_reward_sources_and_data(tmp_path):
    import hashlib

    from mrtpo.task_pin import task_fingerprint

    task = write_task(tmp_path / "t")
    pin = task_fingerprint(str(task))
    assert pin == {
        f"{kind} {name}": hashlib.sha256((tmp_path / "t" / name).read_bytes()).hexdigest()
        for kind, name in (("task file", "task.yaml"), ("reward source", "rewards.py"), ("dataset", "data.jsonl"))
    }
    assert task_fingerprint("gym-constraints") == {}  # a built-in task is the package's code


def test_resume_stops_when_the_task_changed_unless_allowed(tiny_dir, tmp_path, one_thread, capsys):
    import mrtpo.train

    task = write_task(tmp_path / "t")
    out = tmp_path / "run"
    base = [
        "--task",
        str(task),
        "--model",
        str(tiny_dir),
        "report=false",
        "max_completion_length=6",
        "save_steps=1",
        "--method",
        "gdpo",
    ]  # a task file whose reward declares no evidence: GDPO
    assert mrtpo.train.main([*base, "--output-dir", str(out), "--max-steps", "1"]) == 0
    assert json.loads((out / "task_pin.json").read_text())["files"]["reward source rewards.py"]
    (tmp_path / "t" / "rewards.py").write_text("def r(completions, **kwargs):\n    return [5.0 for _ in completions]\n")
    with (tmp_path / "t" / "data.jsonl").open("a") as f:
        f.write('{"prompt": "say bye", "tags": ["b"]}\n')
    before = snapshot(out)
    capsys.readouterr()
    assert mrtpo.train.main([*base, "--resume", str(out), "--max-steps", "2"]) == 2
    err = capsys.readouterr().err.strip()
    assert (
        err.count("\n") == 0
        and "the task changed since this run started: reward source rewards.py, dataset data.jsonl" in err
        and "--allow-task-change" in err
    )
    assert snapshot(out) == before
    assert mrtpo.train.main([*base, "--resume", str(out), "--max-steps", "2", "--allow-task-change"]) == 0
    pin = json.loads((out / "task_pin.json").read_text())
    assert pin["changes"] == [{"at_step": 1, "changed": ["reward source rewards.py", "dataset data.jsonl"]}]
    assert pin["files"]["reward source rewards.py"] == task_fingerprint_of(tmp_path / "t" / "rewards.py")
    assert mrtpo.train.main([*base, "--resume", str(out), "--max-steps", "3"]) == 0  # pinned to the new files now


def task_fingerprint_of(path: Path) -> str:
    import hashlib

    return hashlib.sha256(path.read_bytes()).hexdigest()


# --------------------------------------------------------------------------------------------
# 7. The smaller defects.
# --------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def gym_run(tmp_path_factory):
    """A finished 2-step gym run (its own model cache, torch on one thread)."""
    import shutil

    import torch

    import mrtpo.train

    out = tmp_path_factory.mktemp("gym") / "run"
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MRTPO_CACHE", str(tmp_path_factory.mktemp("cache")))
        assert mrtpo.train.main([*GYM, "--output-dir", str(out), "--max-steps", "2", *GYM_KEYS]) == 0
        yield lambda where: Path(shutil.copytree(out, where))
    torch.set_num_threads(threads)


def test_report_accepts_a_torn_last_metrics_line(gym_run, tmp_path, capsys):
    from mrtpo.report.command import main as report_main

    run = gym_run(tmp_path / "run")
    with (run / "metrics.jsonl").open("a") as f:
        f.write('{"step": 3, "loss": 0.1')  # killed mid-write
    assert report_main([str(run)]) == 0
    assert "note: left out the torn last line of" in capsys.readouterr().out
    assert (run / "report.md").is_file()
    with (run / "metrics.jsonl").open("a") as f:
        f.write('\n{"step": 4}\n')  # a bad line in the middle is still an error, naming it
    assert report_main([str(run)]) == 2
    assert "metrics.jsonl line 4 is not JSON" in capsys.readouterr().err


def test_resume_writes_the_model_a_killed_run_never_wrote(gym_run, tmp_path, capsys):
    import shutil

    import mrtpo.train

    run = gym_run(tmp_path / "run")
    weights = (run / "checkpoint-2" / "model.safetensors").read_bytes()
    shutil.rmtree(run / "model")  # killed after its last checkpoint, before the final save
    assert mrtpo.train.main([*GYM, "--resume", str(run), *GYM_KEYS]) == 0
    assert "has no model/: writing it from checkpoint-2" in capsys.readouterr().out
    assert (run / "model" / "model.safetensors").read_bytes() == weights
    assert [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()][-1] == 2


@pytest.mark.parametrize(
    "name, text, message",
    [
        ("data.jsonl", "", "dataset file {path} is empty"),
        ("data.jsonl", '{"prompt": "a"}\n{"prompt": "b"\n{"prompt": "c"}\n', "dataset file {path} line 2 is not JSON"),
        ("data.jsonl", "prompt,x\na,1\n", "dataset file {path} line 1 is not JSON"),
        ("data.jsonl", '{"prompt": "a"}\n[1, 2]\n', "dataset file {path} line 2 is not a JSON object"),
        ("data.json", '{"prompt": "a"', "dataset file {path} is neither one JSON document nor JSON lines (line 1"),
        ("data.csv", "", "dataset file {path} is empty"),
        ("data.txt", "say hi\n", "dataset file {path}: unknown format '.txt'"),  # was: reported as missing
    ],
)
def test_a_dataset_file_datasets_rejects_is_one_line_naming_file_and_line(tmp_path, name, text, message):
    from mrtpo.tasks.from_config import TaskFileError, load_task_file

    task = write_task(tmp_path)
    (tmp_path / name).write_text(text)
    task.write_text(f"dataset: {name}\nrewards: [rewards.py:r]\n")
    with pytest.raises(TaskFileError) as err:
        load_task_file(task)
    assert message.format(path=tmp_path / name) in str(err.value) and "\n" not in str(err.value)


def test_a_reward_module_calling_sys_exit_at_import_is_named(tmp_path):
    from mrtpo.tasks.from_config import TaskFileError, load_task_file

    task = write_task(tmp_path)
    (tmp_path / "rewards.py").write_text("import sys\nsys.exit(3)\n")
    with pytest.raises(TaskFileError, match=r"reward 'rewards.py:r': rewards.py does not import \(SystemExit: 3\)"):
        load_task_file(task)


def test_each_reward_call_gets_its_own_copy_of_list_cells(tmp_path):
    from mrtpo.tasks.from_config import load_task_file

    task = write_task(tmp_path, reward="kwargs['tags'][0].append('seen'); return [float(len(kwargs['tags'][0]))]")
    loaded = load_task_file(task)
    example = loaded.load("train")[0]
    verifier = loaded.verifiers()[0]
    assert [verifier("x", example) for _ in range(3)] == [2.0, 2.0, 2.0]  # ["a"] + "seen", each time afresh
    assert example.gold["tags"] == ["a"]


class HugeReward:
    """A gym reward that returns ``value`` for every completion."""

    name = "huge"

    def __init__(self, value):
        self.value = value

    def __call__(self, completion, example):
        return self.value

    def evidence(self, example):
        return None


@pytest.mark.parametrize("value", [1e300, -1e300])
def test_a_reward_beyond_float32_range_is_one_line(tmp_path, gym_cache, monkeypatch, capsys, value):
    import mrtpo.train
    from mrtpo.gym.task import ConstraintsTask

    original = ConstraintsTask.verifiers
    monkeypatch.setattr(ConstraintsTask, "verifiers", lambda self: [*original(self), HugeReward(value)])
    assert mrtpo.train.main([*GYM, "--output-dir", str(tmp_path / "run"), "--max-steps", "2", *GYM_KEYS]) == 2
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    lines = [line[line.index("mrtpo train: ") :] for line in err.splitlines() if "mrtpo train: " in line]
    assert len(lines) == 1 and f"reward function 'huge' returned {value!r}" in lines[0]
    assert "beyond ±1e+15" in lines[0]


def test_reward_values_are_bounded():
    from mrtpo.rewards import RewardValueError, check_reward_values

    assert check_reward_values("r", [1e15, -1e15, 0.0]) == [1e15, -1e15, 0.0]
    with pytest.raises(RewardValueError, match=r"'r' returned 1e\+16 \(beyond ±1e\+15"):
        check_reward_values("r", [0.0, 1e16])


def test_an_empty_train_dataset_is_refused_by_the_api(tmp_path):
    from datasets import Dataset

    from mrtpo.trainer import MRTPOConfig, MRTPOTrainer

    args = MRTPOConfig(
        output_dir=str(tmp_path),
        use_cpu=True,
        max_steps=2,
        per_device_train_batch_size=4,
        num_generations=4,
        report_to="none",
    )
    with pytest.raises(ValueError, match="train_dataset is empty"):  # was: 0 steps, no error
        MRTPOTrainer(
            model="unused-no-such-model",
            reward_funcs=[lambda completions, **kw: [1.0] * len(completions)],
            args=args,
            train_dataset=Dataset.from_dict({"prompt": []}),
        )


def test_key_value_settings_may_sit_between_flags(tmp_path, capsys, monkeypatch):
    import mrtpo.train

    monkeypatch.setattr(mrtpo.train, "build_trainer", lambda *a, **k: pytest.fail("a model was loaded"))
    assert (
        mrtpo.train.main(
            [
                "--task",
                "gym-constraints",
                "seed=3",
                "--model",
                "gym",
                "learning_rate=0",
                "--output-dir",
                str(tmp_path / "run"),
                "temperature=0.5",
            ]
        )
        == 2
    )
    assert "learning_rate must be > 0, got 0" in capsys.readouterr().err  # read as a setting, not refused by argparse


def test_resume_followed_by_a_setting_resumes_the_output_dir(gym_run, tmp_path, capsys):
    import mrtpo.train

    run = gym_run(tmp_path / "run")
    assert mrtpo.train.main([*GYM, "--output-dir", str(run), "--resume", "max_steps=3", *GYM_KEYS]) == 0
    assert f"resuming from {run / 'checkpoint-2'} (step 2)" in capsys.readouterr().out
    assert json.loads((run / "checkpoint-3" / "trainer_state.json").read_text())["global_step"] == 3


def test_a_full_disk_while_writing_the_report_is_one_line(gym_run, tmp_path, capsys, monkeypatch):
    import mrtpo.report.build
    import mrtpo.train

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "run" / "curves.png"))

    monkeypatch.setattr(mrtpo.report.build, "make_report", full)
    run = gym_run(tmp_path / "run")
    assert mrtpo.train.main([*GYM, "--resume", str(run), "--max-steps", "3", *GYM_KEYS[:-2], "report=true"]) == 2
    out, err = capsys.readouterr()
    lines = [line[line.index("mrtpo train: ") :] for line in err.splitlines() if "mrtpo train: " in line]
    assert "Traceback" not in out + err and len(lines) == 1
    assert f"cannot write {run / 'curves.png'}: No space left on device" in lines[0]


def test_evidence_text_missing_from_its_prompt_is_one_line_before_any_model_loads(tmp_path, capsys, monkeypatch):
    import mrtpo.train

    task = write_task(tmp_path, rows='{"prompt": "say hi", "hint": "hi"}\n{"prompt": "say bye", "hint": "hello"}\n')
    (tmp_path / "rewards.py").write_text(
        "from mrtpo.rewards import evidence\n\n@evidence('hint')\n"
        "def r(completions, **kwargs):\n    return [1.0 for _ in completions]\n"
    )
    monkeypatch.setattr(mrtpo.train, "build_trainer", lambda *a, **k: pytest.fail("a model was loaded"))
    assert (
        mrtpo.train.main(
            [
                "--task",
                str(task),
                "--output-dir",
                str(tmp_path / "run"),
                "train_size=2",
                "per_device_train_batch_size=4",
            ]
        )
        == 2
    )
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0
    assert "in_prompt evidence of reward 'r' for example 'train-1' does not occur in its prompt: 'hello'" in err


def test_the_python_api_holds_the_run_lock_while_it_trains(tmp_path):
    """MRTPOTrainer.train takes output_dir's lock: refused (with the holder's pid) while another process
    holds the folder, held while it trains, released after; re-entrant under mrtpo train's own lock."""
    from transformers import TrainerCallback

    from mrtpo.run_lock import RunLockError, lock_run_folder
    from tests.test_trainer import has_letter_e, make_trainer

    seen = []

    class Probe(TrainerCallback):
        def on_step_end(self, *args, **kwargs):
            seen.append(_holder(tmp_path))

    def trainer():
        made = make_trainer(tmp_path, [has_letter_e], max_steps=1)
        made.add_callback(Probe())
        return made

    refused = trainer()
    with held_by(tmp_path) as other, pytest.raises(RunLockError, match=rf"in use by mrtpo train \(pid {other.pid}\)"):
        refused.train()
    assert refused.state.global_step == 0 and seen == []  # refused before a step
    trainer().train()  # alone: holds the lock while it trains, then releases it
    assert seen == ["held"] and _holder(tmp_path) == "free"
    outer = lock_run_folder(tmp_path)  # as mrtpo train holds it around build_trainer and train
    try:
        trainer().train()  # re-entrant: the process's own lock does not refuse it
        assert seen == ["held", "held"] and _holder(tmp_path) == "held"  # its release left the outer lock
    finally:
        outer.release()
    assert _holder(tmp_path) == "free"


def _holder(folder: Path) -> str:
    """ "held" when another process cannot take ``folder``'s lock now, else "free"."""
    probe = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from pathlib import Path; from mrtpo.run_lock import lock_run_folder; "
            "lock_run_folder(Path(sys.argv[1]), 'probe').release()",
            str(folder),
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": "src"},
    )
    return "free" if probe.returncode == 0 else "held"
