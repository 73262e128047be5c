"""Every task works through the user-facing commands: `mrtpo train --task <t>` and `mrtpo eval`."""

import json
import subprocess
import sys

import pytest


def mrtpo(*args, timeout=600):
    done = subprocess.run([sys.executable, "-m", "mrtpo.cli", *args], capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    return done


@pytest.mark.parametrize(
    "task, rewards",
    [
        ("toolcall", {"format", "correctness"}),
        ("instructions", {f"constraint_{i}" for i in range(1, 6)}),
        ("sql", {"format", "executes", "result"}),
    ],
)
def test_train_then_eval_the_checkpoint(task, rewards, tiny_model_dir, tmp_path):
    run = tmp_path / "run"
    mrtpo(
        "train",
        "--task",
        task,
        "--model",
        str(tiny_model_dir),
        "--max-steps",
        "1",
        "--output-dir",
        str(run),
        "per_device_train_batch_size=4",
        "num_generations=2",
        "max_completion_length=8",
    )
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    logged = {key.split("/")[1] for line in lines for key in line if key.startswith("rewards/")}
    assert rewards <= logged
    assert (run / "report.html").exists() and (run / "checkpoint-1").is_dir()
    out = tmp_path / "eval"
    mrtpo(
        "eval",
        "--task",
        task,
        "--model",
        str(run / "checkpoint-1"),
        "--limit",
        "2",
        "--max-new-tokens",
        "8",
        "--out",
        str(out),
    )
    results = json.loads((out / "results.json").read_text())
    assert len((out / "outputs.jsonl").read_text().splitlines()) == 2
    assert results["run"]["task"] == task and results["run"]["n_examples"] == 2
    assert results["metrics"]  # the task's own evaluate() dict
