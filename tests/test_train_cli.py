"""``mrtpo train``: flags over config layers, a real 2-step run on the sql task, and resume.

Every run uses a tiny random model saved to a temporary folder (``--model <dir>``) and the real
Spider examples of the sql task. Torch runs single-threaded here: on 2 shared cores a second
thread makes these small ops many times slower.
"""

import json
import math
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from mrtpo.config import TRAIN_DEFAULTS, load_config
from mrtpo.train import main

ENV = {
    **os.environ,
    "HF_HUB_OFFLINE": "1",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "OMP_NUM_THREADS": "1",
    "TOKENIZERS_PARALLELISM": "false",
}
SMALL = ["task_args={sample_rows: 0}", "train_size=4", "max_completion_length=12", "save_steps=1"]


# --------------------------------------------------------------------------------------------
# Config layers through the command.
# --------------------------------------------------------------------------------------------
def test_unknown_key_through_the_command_exits_2_with_the_message(tmp_path, capsys):
    rc = main(["--task", "sql", "--output-dir", str(tmp_path / "run"), "num_generation=4"])
    assert rc == 2
    err = capsys.readouterr().err
    assert "unknown config key 'num_generation'" in err and "did you mean 'num_generations'?" in err
    assert not (tmp_path / "run").exists()  # nothing written for a rejected config


def test_layers_defaults_yaml_flags_overrides(tmp_path):
    first, second = tmp_path / "a.yaml", tmp_path / "b.yaml"
    # YAML 1.1 reads 1e-5 as a string: the loader turns it into the field's float.
    first.write_text("learning_rate: 1e-5\ntemperature: 0.7\nmax_steps: 7\nnum_generations: 2\nlam: 0.5\n")
    second.write_text("temperature: 0.9\ntrain_size: 16\n")
    ns_args = [
        "--config",
        str(first),
        "--config",
        str(second),
        "--max-steps",
        "3",
        "--seed",
        "1",
        "--output-dir",
        str(tmp_path / "out"),
        "seed=2",
    ]
    from mrtpo.train import _parser, resolve_from_argv

    config, checkpoint = resolve_from_argv(_parser().parse_args(ns_args))
    args, run = config.args, config.run
    assert checkpoint is None
    assert args.learning_rate == 1e-5 and isinstance(args.learning_rate, float)  # first file
    assert args.temperature == 0.9  # second file beats first
    assert args.max_steps == 3  # flag beats files
    assert args.seed == 2  # key=value beats flags
    assert args.num_generations == 2 and args.lam == 0.5 and run.train_size == 16
    assert args.logging_steps == TRAIN_DEFAULTS["logging_steps"]  # untouched: our default, not TRL's 10
    assert args.per_device_train_batch_size == TRAIN_DEFAULTS["per_device_train_batch_size"]
    if not torch.cuda.is_available():
        assert args.use_cpu is True and args.bf16 is False and args.activation_checkpointing is False
    assert config.explicit["temperature"] == str(second) and config.explicit["seed"] == "command line"


def test_resume_needs_a_checkpoint(tmp_path, capsys):
    assert main(["--resume"]) == 2
    assert "--resume without a path needs the run folder" in capsys.readouterr().err
    (tmp_path / "run").mkdir()
    assert main(["--resume", str(tmp_path / "run")]) == 2
    assert "holds no checkpoint-N folder" in capsys.readouterr().err


# --------------------------------------------------------------------------------------------
# A real run through the command line.
# --------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def cli_run(tiny_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("cli") / "run"
    cmd = [
        sys.executable,
        "-m",
        "mrtpo.cli",
        "train",
        "--task",
        "sql",
        "--method",
        "mrtpo",
        "--model",
        str(tiny_dir),
        "--output-dir",
        str(out),
        "--max-steps",
        "2",
        *SMALL,
    ]
    proc = subprocess.run(cmd, check=False, capture_output=True, text=True, env=ENV, timeout=300)
    return out, proc


def test_train_command_writes_the_run_folder(cli_run):
    out, proc = cli_run
    assert proc.returncode == 0, proc.stderr[-3000:]
    # Progress: one compact line per step with the reward and each task reward.
    for step in (1, 2):
        assert f"step {step}/2 | reward" in proc.stdout + proc.stderr
    assert "format" in proc.stdout + proc.stderr and "report:" in proc.stdout
    # What it chose for this CPU, and why: full fine-tuning keeps float32 weights on any CPU.
    assert re.search(
        r"^CPU with(out AVX512-BF16/AMX| [A-Z0-9_/]+): float32 weights \(full fine-tuning", proc.stdout, re.M
    )

    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in lines if "loss" in r]
    assert [r["step"] for r in steps] == [1, 2]
    for r in steps:
        for key in (
            "rewards/format/mean",
            "rewards/executes/mean",
            "rewards/result/mean",
            "time/replay",
            "skip/zero_spread/executes",
            "skip/contexts_skipped",
        ):
            assert key in r, key
        # executes' replays run only in groups where it has a spread (a random policy rarely has one)
        assert ("credit/executes/relevance_mean" in r) == (r["skip/zero_spread/executes"] < 1)

    saved = yaml.safe_load((out / "config.yaml").read_text())
    assert saved["task"] == "sql" and saved["method"] == "mrtpo" and saved["max_steps"] == 2
    assert saved["train_size"] == 4 and saved["task_args"] == {"sample_rows": 0} and saved["save_steps"] == 1

    for n in (1, 2):
        state = json.loads((out / f"checkpoint-{n}" / "trainer_state.json").read_text())
        assert state["global_step"] == n
        assert (out / f"checkpoint-{n}" / "optimizer.pt").is_file()

    # The credit samples come from the first train_size real Spider examples.
    from mrtpo.tasks import get_task

    ids = {e.id for e in get_task("sql", sample_rows=0).load("train", 4)}
    samples = [json.loads(x) for x in (out / "credit_samples.jsonl").read_text().splitlines()]
    assert samples and {s["example_id"] for s in samples} <= ids
    assert {s["step"] for s in samples} == {0, 1}
    assert set(samples[0]["weights"]) == {"format", "executes", "result"}

    assert (out / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    html = (out / "report.html").read_text()
    assert "data:image/png;base64," in html and "class='tok'" in html
    for name in ("format", "executes", "result"):
        assert f"<b>{name}</b>" in html
    # the samples tagged 0 and 1 (before each update) show under the curves' step numbers, 1 and 2
    assert "<h3>step 1</h3>" in html and "<h3>step 2</h3>" in html
    md = (out / "report.md").read_text()
    assert "![training curves](curves.png)" in md and "| format |" in md


# --------------------------------------------------------------------------------------------
# Resume: a resumed run equals the uninterrupted one.
# --------------------------------------------------------------------------------------------
class CharCode:
    """Test-only reward that differs between almost any two random completions, so every group
    has a spread and the updates are non-zero (the tiny random model never writes valid SQL)."""

    name = "char_code"

    def __call__(self, completion, example):
        return float(sum(map(ord, completion)) % 7)

    def evidence(self, example):
        from mrtpo.verifiers import Evidence

        return Evidence(example.gold["sql"], "privileged")


VOLATILE = {"time", "step_time", "train_runtime", "train_samples_per_second", "train_steps_per_second"}


def _stable(record):
    return {k: v for k, v in record.items() if k not in VOLATILE and not k.startswith(("time/", "memory/"))}


def test_resume_continues_the_same_run(tiny_dir, tmp_path, monkeypatch, one_thread):
    from safetensors.torch import load_file

    from mrtpo.tasks.sql import SqlTask

    original = SqlTask.verifiers
    monkeypatch.setattr(SqlTask, "verifiers", lambda self: [*original(self), CharCode()])
    full, resumed = tmp_path / "full", tmp_path / "resumed"
    base = [
        "--task",
        "sql",
        "--model",
        str(tiny_dir),
        "--max-steps",
        "2",
        "--learning-rate",
        "0.01",
        "report=false",
        *SMALL,
    ]
    assert main([*base, "--output-dir", str(full)]) == 0

    # An interrupted run: its folder holds checkpoint-1 and the lines it logged after it.
    shutil.copytree(full, resumed)
    shutil.rmtree(resumed / "checkpoint-2")
    assert main(["--resume", str(resumed / "checkpoint-1")]) == 0

    a = [json.loads(x) for x in (full / "metrics.jsonl").read_text().splitlines()]
    b = [json.loads(x) for x in (resumed / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in b] == [r["step"] for r in a] == [1, 2, 2]  # step 1, step 2, summary
    # Step 2 is a real update: its rewards differ within the group, so its advantages are non-zero,
    # and its gradient is too. Its loss *value* says nothing here: at the first iteration on fresh
    # samples the ratio is exactly 1, so TRL's DAPO loss is -sum(A * mask) / sum(mask), and the
    # advantages are centred on the batch mean of the sequence advantages with every token weight
    # averaging 1 over its response; when every completion has the same length (all cut at
    # max_completion_length, as the tiny random model's are) that sum is 0 up to rounding, under
    # GRPO and GDPO as well, while the gradient -sum(A * grad log p) / sum(mask) is not.
    step2 = a[1]
    assert math.isfinite(step2["loss"]) and math.isfinite(step2["grad_norm"]) and step2["grad_norm"] > 0
    assert step2["rewards/char_code/std"] > 0
    assert [_stable(r) for r in b[:2]] == [_stable(r) for r in a[:2]]  # identical losses, rewards, credit metrics
    # The end-of-training summary averages the loss over the steps of *this* train() call.
    assert a[2]["train_loss"] == pytest.approx((a[0]["loss"] + a[1]["loss"]) / 2, rel=1e-4, abs=1e-12)
    assert b[2]["train_loss"] == pytest.approx(b[1]["loss"], rel=1e-4, abs=1e-12)

    # Same data order and the same sampled completions (RNG restored), same credit.
    ca = [json.loads(x) for x in (full / "credit_samples.jsonl").read_text().splitlines()]
    cb = [json.loads(x) for x in (resumed / "credit_samples.jsonl").read_text().splitlines()]
    assert [s["step"] for s in ca] == [0, 0, 1, 1]
    assert cb == ca
    assert all(any(x != 0 for x in s["advantage"]) for s in ca if s["step"] == 1)  # step 2 trained on credit

    # The resumed run went on from step 1 to step 2, not from 0: its last checkpoint is step 2's.
    for run in (full, resumed):
        assert json.loads((run / "checkpoint-2" / "trainer_state.json").read_text())["global_step"] == 2

    # Same weights after step 2, and the run folder kept its settings.
    wa = load_file(full / "checkpoint-2" / "model.safetensors")
    wb = load_file(resumed / "checkpoint-2" / "model.safetensors")
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    w1 = load_file(full / "checkpoint-1" / "model.safetensors")
    assert any(not torch.equal(w1[k], wa[k]) for k in wa)  # step 2 did move the weights
    saved = yaml.safe_load((resumed / "config.yaml").read_text())
    assert saved["resume_from_checkpoint"] == str(resumed / "checkpoint-1")
    assert saved["learning_rate"] == 0.01 and saved["output_dir"] == str(resumed)


def test_resume_rejects_another_output_dir(tiny_dir, tmp_path, capsys):
    from safetensors.torch import save_file

    ckpt = tmp_path / "run" / "checkpoint-1"  # complete: weights, optimizer, scheduler, RNG, then the state
    ckpt.mkdir(parents=True)
    save_file({"w": torch.zeros(2)}, ckpt / "model.safetensors")
    for name in ("optimizer.pt", "scheduler.pt", "rng_state.pth"):
        torch.save({}, ckpt / name)
    (ckpt / "trainer_state.json").write_text(json.dumps({"global_step": 1}))
    assert main(["--resume", str(ckpt), "--output-dir", str(tmp_path / "other")]) == 2
    assert "resuming keeps the run's folder" in capsys.readouterr().err


def test_prompt_rendering_check_catches_a_task_that_renders_differently(tiny_dir, tmp_path, monkeypatch, one_thread):
    from mrtpo.tasks.sql import SqlTask
    from mrtpo.train import PromptMismatchError, build_trainer

    monkeypatch.setattr(
        SqlTask, "render_prompt", lambda self, ex, tok: "Plain: " + ex.messages[-1]["content"], raising=False
    )
    config = load_config(
        [],
        {
            "task": "sql",
            "model": str(tiny_dir),
            "output_dir": str(tmp_path),
            "train_size": 4,
            "task_args": {"sample_rows": 0},
        },
    )
    with pytest.raises(PromptMismatchError, match="renders the prompt of 'spider-dev-0' differently"):
        build_trainer(config)


def test_list_keys_and_docs_cover_every_run_setting(capsys):
    import dataclasses

    from mrtpo.config import RunSettings

    assert main(["--list-keys"]) == 0
    listed = capsys.readouterr().out
    docs = (Path(__file__).resolve().parents[1] / "docs" / "training.md").read_text()
    for f in dataclasses.fields(RunSettings):
        assert f"  {f.name} " in listed and f"| `{f.name}` |" in docs, f.name
    for key in ("lam", "w_max", "relevance_top_k", "num_generations", "learning_rate"):
        assert f"  {key} " in listed


def test_lora_run_trains_only_the_adapters_and_explain_loads_them(tiny_dir, tmp_path, monkeypatch, one_thread):
    from safetensors.torch import load_file

    from mrtpo.explain import main as explain_main
    from mrtpo.tasks.sql import SqlTask

    original = SqlTask.verifiers
    monkeypatch.setattr(SqlTask, "verifiers", lambda self: [*original(self), CharCode()])
    out = tmp_path / "lora"
    # The CPU demo's setup: LoRA on bf16 base weights, activation checkpointing.
    assert (
        main(
            [
                "--task",
                "sql",
                "--model",
                str(tiny_dir),
                "--output-dir",
                str(out),
                "--max-steps",
                "2",
                "--lora-r",
                "4",
                "dtype=bfloat16",
                "activation_checkpointing=true",
                "report=false",
                *SMALL,
            ]
        )
        == 0
    )
    saved = yaml.safe_load((out / "config.yaml").read_text())
    assert saved["lora_r"] == 4 and saved["learning_rate"] == 2e-5  # LoRA's default learning rate
    steps = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if '"loss"' in x]
    assert all(r["grad_norm"] > 0 for r in steps)
    ckpt = out / "checkpoint-2"
    assert (ckpt / "adapter_model.safetensors").is_file() and not (ckpt / "model.safetensors").exists()
    adapters = load_file(ckpt / "adapter_model.safetensors")
    assert adapters and all("lora_" in k for k in adapters)
    assert any(k.endswith("lora_B.weight") and v.abs().max() > 0 for k, v in adapters.items())  # B starts at 0
    assert all(v.dtype == torch.float32 for v in adapters.values())  # adapters train in fp32 on a bf16 base
    html = tmp_path / "explain.html"
    assert (
        explain_main(
            [
                "--task",
                "sql",
                "--model",
                str(ckpt),
                "--completion",
                "SELECT 1",
                "--task-arg",
                "sample_rows=0",
                "--out",
                str(html),
            ]
        )
        == 0
    )
    assert "class='tok'" in html.read_text()


@pytest.mark.slow
def test_cpu_demo_config_runs_one_step_on_the_default_model(tmp_path):
    """The README's command (configs/cpu-demo.yaml) on the real 0.5B model, cut to one step."""
    out = tmp_path / "demo"
    config = Path(__file__).resolve().parents[1] / "configs" / "cpu-demo.yaml"
    cmd = [
        sys.executable,
        "-m",
        "mrtpo.cli",
        "train",
        "--config",
        str(config),
        "--output-dir",
        str(out),
        "--max-steps",
        "1",
        "save_steps=1",
    ]
    proc = subprocess.run(cmd, check=False, capture_output=True, text=True, env=ENV, timeout=1800)
    assert proc.returncode == 0, proc.stderr[-3000:]
    step = next(json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if '"loss"' in x)
    assert step["step"] == 1 and 0 <= step["rewards/format/mean"] <= 1
    assert step["grad_norm"] > 0 or step["frac_reward_zero_std"] == 1  # an update unless every group tied
    assert (out / "checkpoint-1" / "adapter_model.safetensors").is_file()
    assert "data:image/png;base64," in (out / "report.html").read_text()


def test_a_fresh_run_in_a_used_folder_is_refused_unless_told_to_overwrite(
    cli_run, tiny_dir, tmp_path, capsys, one_thread
):
    out, proc = cli_run
    assert proc.returncode == 0
    again = tmp_path / "again"
    shutil.copytree(out, again)
    fresh = [
        "--task",
        "sql",
        "--model",
        str(tiny_dir),
        "--output-dir",
        str(again),
        "--max-steps",
        "1",
        "report=false",
        *SMALL,
    ]
    before = {p: p.read_bytes() for p in again.rglob("*") if p.is_file()}
    assert main(fresh) == 2
    assert f"{again} already holds a run" in capsys.readouterr().err
    assert {p: p.read_bytes() for p in again.rglob("*") if p.is_file()} == before  # untouched
    assert main([*fresh, "--overwrite"]) == 0
    steps = [json.loads(x)["step"] for x in (again / "metrics.jsonl").read_text().splitlines()]
    samples = [json.loads(x)["step"] for x in (again / "credit_samples.jsonl").read_text().splitlines()]
    assert steps == [1, 1] and samples == [0, 0]  # one step and its summary; nothing left of the 2-step run
    assert sorted(p.name for p in again.glob("checkpoint-*")) == ["checkpoint-1"]  # the old checkpoint-2 is gone
    assert not (again / "report.html").exists()  # the old run's report too (this run has report=false)
