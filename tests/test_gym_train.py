"""The gym end to end: its warm start, ``mrtpo train`` on a gym task, ``mrtpo bench gym`` precision and
``mrtpo bench learn --preset gym --jobs 2``. A very short warm start (a few steps, in a temporary model
cache) keeps every test well under a minute."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
import torch

from mrtpo.bench.gym import completion_precision, rank_correlation
from mrtpo.gym.policy import ensure_warm_start, policy_spec, warm_start_dir
from mrtpo.tasks import get_task

TINY_POLICY = "{steps: 3, batch_size: 8}"
TINY = f"{{policy: {TINY_POLICY}}}"


@pytest.fixture(scope="module")
def gym_env(tmp_path_factory):
    """Environment of a subprocess using a temporary model cache (warm starts built there)."""
    cache = tmp_path_factory.mktemp("gym-cache")
    return {**os.environ, "MRTPO_CACHE": str(cache), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}


def _mrtpo(args, env, cwd):
    return subprocess.run(
        [sys.executable, "-m", "mrtpo.cli", *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=300
    )


def test_rank_correlation_and_precision_by_hand():
    truth = torch.tensor([True, False, False, False])
    assert rank_correlation(torch.tensor([3.0, 1, 1, 1]), truth) == pytest.approx(1.0)
    # ranks (1, 2, 3, 4) against (2, 2, 2, 4): 3 / sqrt(5 * 3)
    assert rank_correlation(torch.tensor([1.0, 2, 3, 4]), torch.tensor([False, False, False, True])) == pytest.approx(
        3 / 15**0.5
    )
    assert rank_correlation(torch.ones(4), torch.tensor([True, False, False, False])) is None  # uniform weights
    rows = completion_precision({"m": torch.tensor([[2.0, 1, 1, 0, 9]])}, ["r"], {"r": [0]}, length=4)
    assert rows[0]["lift"]["m"] == pytest.approx((2 / 4) / (1 / 4)) and rows[0]["relevant"] == 1
    assert completion_precision({"m": torch.ones(1, 4)}, ["r"], {"r": []}, length=4) == []  # no ground truth


def test_warm_start_is_cached_by_its_settings(tmp_path):
    task = get_task("gym-call", policy={"steps": 2, "batch_size": 4})
    first = ensure_warm_start(task, cache_dir=tmp_path, log=lambda *_: None)
    record = json.loads((first / "gym_warm_start.json").read_text())
    assert record["spec"]["steps"] == 2 and record["task"]["task"] == "gym-call"
    assert ensure_warm_start(task, cache_dir=tmp_path, log=lambda *_: None) == first  # reused, not rebuilt
    other = get_task("gym-call", p_follow=0.7, policy={"steps": 2, "batch_size": 4})
    assert warm_start_dir(other, policy_spec(other), tmp_path) != first
    # the constraints warm start serves every clause count and length (it is trained on a mixture)
    a, b = get_task("gym-constraints", num_clauses=2), get_task("gym-constraints", num_clauses=5, length=32)
    assert warm_start_dir(a, policy_spec(a), tmp_path) == warm_start_dir(b, policy_spec(b), tmp_path)


def test_gym_trains_through_the_cli_and_its_rewards_rescore(gym_env, tmp_path):
    out = tmp_path / "run"
    r = _mrtpo(
        [
            "train",
            "--task",
            "gym-constraints",
            "--model",
            "gym",
            "--output-dir",
            str(out),
            f"task_args={TINY}",
            "max_steps=2",
            "num_generations=4",
            "per_device_train_batch_size=8",
            "max_completion_length=24",
            "credit_samples=8",
            "report=false",
            "save_strategy=no",
        ],
        gym_env,
        tmp_path,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    steps = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [s["step"] for s in steps if "rewards/c1/mean" in s] == [1, 2]
    assert sum("clip_ratio/region_mean" in s for s in steps) == 2
    for s in steps:  # one policy update per generation batch: TRL's ratio is exactly 1, so nothing is clipped
        if "clip_ratio/region_mean" in s:
            assert s["clip_ratio/region_mean"] == 0 and s["clip_ratio/low_mean"] == 0 and s["clip_ratio/high_mean"] == 0
            assert s["grad_norm"] > 0  # the norm before clipping (max_grad_norm clips above it)
    task = get_task("gym-constraints")
    examples = {e.id: e for e in task.load("train")}
    samples = [json.loads(line) for line in (out / "credit_samples.jsonl").read_text().splitlines()]
    assert len(samples) == 16
    for s in samples:  # the trainer's rewards are the verifiers' scores of the decoded tokens
        words = [t for t in s["tokens"] if t not in ("<|im_end|>", "<|endoftext|>")]
        ex = examples[s["example_id"]]
        assert s["rewards"] == {v.name: v(" ".join(words), ex) for v in task.verifiers()}
        truth = task.relevant_positions(ex, words)
        assert all(0 <= p <= len(words) for positions in truth.values() for p in positions)


def test_bench_gym_precision_runs_and_uniform_methods_give_lift_one(gym_env, tmp_path):
    out = tmp_path / "precision.json"
    r = _mrtpo(
        [
            "bench",
            "gym",
            "--task",
            "gym-answer",
            "--task-arg",
            f"policy={TINY_POLICY}",
            "--prompts",
            "2",
            "--group-size",
            "4",
            "--out",
            str(out),
        ],
        gym_env,
        tmp_path,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    record = json.loads(out.read_text())
    assert {s["reward"] for s in record["summary"]} <= {"format", "valid", "result"} and record["rows"]
    assert all(row["lift"]["gdpo"] == pytest.approx(1.0) for row in record["rows"])
    assert set(record["conditioning"]) == {"format", "valid", "result"}


PLUGIN = """
import torch
from mrtpo.credit import register_method
from mrtpo.credit.advantages import gdpo_advantages

@register_method("firsthalf", needs="none", description="GDPO's advantage on the first half of each response")
def firsthalf(batch, config):
    adv = gdpo_advantages(batch.rewards, batch.group_size, config.reward_weights, config.batch_norm)
    adv = adv if batch.rows is None else adv[batch.rows]
    mask = batch.mask.float()
    first = (torch.arange(mask.shape[1]) < (mask.sum(1, keepdim=True) / 2).ceil()).float() * mask
    return adv.unsqueeze(1) * first * mask.sum(1, keepdim=True) / first.sum(1, keepdim=True).clamp_min(1)
"""


def test_a_plugin_method_runs_on_the_gym_preset_in_two_workers(gym_env, tmp_path):
    (tmp_path / "my_credit.py").write_text(PLUGIN)
    env = {**gym_env, "MRTPO_PLUGINS": "my_credit", "PYTHONPATH": str(tmp_path)}
    out = tmp_path / "bench"
    r = _mrtpo(
        [
            "bench",
            "learn",
            "--task",
            "gym-call",
            "--preset",
            "gym",
            "--methods",
            "gdpo,firsthalf",
            "--seeds",
            "0",
            "--max-steps",
            "2",
            "--eval-every",
            "2",
            "--eval-size",
            "4",
            "--jobs",
            "2",
            "--out",
            str(out),
            f"task_args={TINY}",
            "per_device_train_batch_size=8",
        ],
        env,
        tmp_path,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert "training in 2 worker processes" in r.stdout
    for method in ("gdpo", "firsthalf"):
        assert (out / f"{method}-seed0" / "finished.json").is_file()
    comparison = json.loads((out / "comparison.json").read_text())
    assert set(comparison["methods"]) == {"gdpo", "firsthalf"} and comparison["heldout_metrics"][0] == "reward_total"
    # a worker trains the runs its parent named, whatever else has finished since (the share it once
    # computed from the unfinished runs skipped a run when the other worker had already finished)
    shutil.rmtree(out / "firsthalf-seed0")
    gdpo_finished = (out / "gdpo-seed0" / "finished.json").read_text()
    worker = _mrtpo(
        [
            "bench",
            "learn",
            "--task",
            "gym-call",
            "--preset",
            "gym",
            "--methods",
            "gdpo,firsthalf",
            "--seeds",
            "0",
            "--max-steps",
            "2",
            "--eval-every",
            "2",
            "--eval-size",
            "4",
            "--out",
            str(out),
            f"task_args={TINY}",
            "per_device_train_batch_size=8",
            "--worker",
            '[["firsthalf", null, 0]]',
        ],
        env,
        tmp_path,
    )
    assert worker.returncode == 0, worker.stderr[-3000:]
    assert (out / "firsthalf-seed0" / "finished.json").is_file()
    assert (out / "gdpo-seed0" / "finished.json").read_text() == gdpo_finished
    bad = _mrtpo(
        ["bench", "learn", "--task", "gym-call", "--dry-run"], {**env, "MRTPO_PLUGINS": "no_such_module"}, tmp_path
    )
    assert bad.returncode != 0 and "MRTPO_PLUGINS names 'no_such_module'" in bad.stderr


def test_flops_per_token_counts_linear_weights_head_and_attention():
    from mrtpo.bench.step import flops_per_token
    from mrtpo.testing import tiny_policy

    model, tok = tiny_policy(hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=64)
    v, d = len(tok), 32
    # per layer: q 32x32, k and v 32x16 each, o 32x32, gate/up/down 32x64 each; the head (tied) v x 32
    per_layer = 32 * 32 + 2 * 32 * 16 + 32 * 32 + 3 * 32 * 64
    assert flops_per_token(model, context=0) == 2 * (2 * per_layer + v * d)
    assert flops_per_token(model, context=10) - flops_per_token(model, context=0) == 4 * 2 * d * 10


def test_bench_step_times_each_phase_of_both_methods_against_its_floor(gym_env, tmp_path):
    out = tmp_path / "step.json"
    result = _mrtpo(
        [
            "bench",
            "step",
            "--task",
            "gym-constraints",
            "--steps",
            "3",
            "--profile",
            "2",
            "--out",
            str(out),
            f"task_args={TINY}",
            "max_completion_length=8",
            "skip_zero_advantage=false",
        ],
        gym_env,
        tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    record = json.loads(out.read_text())
    rows = {r["method"]: r for r in record["rows"]}
    assert set(rows) == {"gdpo", "mrtpo"} and all(r["steps"] == 3 for r in rows.values())
    assert rows["gdpo"]["replay"]["median"] < 1e-3 and rows["gdpo"]["replay"]["floor"] == 0  # gdpo replays nothing
    for row in rows.values():
        for phase in ("generation", "update"):
            assert 0 < row[phase]["floor"] < row[phase]["median"]  # the arithmetic is a lower bound
        total = sum(row[p]["median"] for p in ("generation", "scoring", "replay", "update"))
        assert row["step"]["q1"] <= row["step"]["median"] <= row["step"]["q3"] and total > 0
        assert 0 < row["tokens"]["sampled"] <= 32 * 8
        cpu = row["generation_cpu"]  # generation in this process's CPU time: one thread, so at most its wall time
        assert 0 < cpu["floor"] and 0 < cpu["median"] <= 1.2 * row["generation"]["median"] + 0.01
    # nothing skipped: every completion replayed under the original and each of its 3 clauses' counterfactuals
    assert rows["mrtpo"]["tokens"]["replayed"] == 4 * rows["mrtpo"]["tokens"]["sampled"]
    assert rows["mrtpo"]["replay"]["floor"] > 0
    assert record["verdicts"]["mrtpo_over_gdpo"] > 0 and record["matmul_gflops"] > 0
    assert record["matmul_gflops_cpu_time"] >= 0.8 * record["matmul_gflops"]  # per CPU second: no slower than wall
    assert "run_backward" in record["profiles"]["gdpo"]["python"] and "aten::" in record["profiles"]["mrtpo"]["torch"]


def test_gym_compare_gpu_path_dry_run_on_the_cpu(gym_env, tmp_path):
    """``DEVICE=cuda bash scripts/gym_compare.sh`` (what a lent GPU runs), on a tiny policy and 2 steps:
    every run asks for the accelerator (``use_cpu: false``, falling back to the CPU here) and the
    comparison and its summary are written."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    out = tmp_path / "gym"
    env = {
        **gym_env,
        "DEVICE": "cuda",
        "STAGES": "main summary",
        "METHODS": "gdpo,mrtpo",
        "SEEDS": "0",
        "STEPS": "2",
        "JOBS": "1",
        "OUT": str(out),
        "MRTPO": str(Path(sys.executable).parent / "mrtpo"),
        "EXTRA_ARGS": 'task_args={"policy":{"steps":3,"batch_size":8}} max_completion_length=8 --eval-size 4',
    }
    result = subprocess.run(
        ["bash", str(root / "scripts" / "gym_compare.sh")],
        env=env,
        cwd=root,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    main = out / "main-gym-constraints"
    assert (main / "bench.json").is_file()
    for method in ("gdpo", "mrtpo"):
        config = (main / f"{method}-seed0" / "config.yaml").read_text()
        assert "use_cpu: false" in config
        assert json.loads((main / f"{method}-seed0" / "finished.json").read_text())["steps"] == 2
