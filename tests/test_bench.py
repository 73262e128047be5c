"""Benchmarks run end to end on tiny inputs (their figures come from real runs, not from tests)."""

import json
import os
import subprocess
import sys

import pytest


def test_cost_bench_counts_the_replay_forwards_it_needs(tiny_model_dir, tmp_path):
    out = tmp_path / "cost.json"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "mrtpo.cli",
            "bench",
            "cost",
            "--model",
            str(tiny_model_dir),
            "--task",
            "sql",
            "--prompts",
            "1",
            "--group-size",
            "2",
            "--max-new-tokens",
            "4",
            "--lora-r",
            "4",
            "--profile",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    rows = {r["method"]: r for r in json.loads(out.read_text())["rows"]}
    assert set(rows) == {"grpo", "gdpo", "mrtpo", "contrast", "entropy"}
    # sql: format and executes (in_prompt) and result (privileged) all have evidence.
    # Per group, whatever the contexts: the original prompt, the counterfactuals' tokens after their
    # departure from it, the completions; the entropy baseline's original alone needs no middle call.
    assert rows["grpo"]["replay_forward_calls"] == rows["gdpo"]["replay_forward_calls"] == 0
    assert rows["mrtpo"]["replay_forward_calls"] == rows["contrast"]["replay_forward_calls"] == 3
    assert rows["entropy"]["replay_forward_calls"] == 2
    assert rows["mrtpo"]["naive_tokens"] > rows["mrtpo"]["unique_tokens"] > 0
    for r in rows.values():
        assert r["update_s"] > 0 and r["generation_s"] > 0
        assert 0 <= r["replay_kernel_s"] <= r["replay_s"]
    assert rows["mrtpo"]["replay_kernel_s"] > 0 and rows["gdpo"]["replay_kernel_s"] == 0
    floors = json.loads(out.read_text())["floors"]
    assert set(floors["phases"]) == {"generation", "update (rows+checkpointing)", "update (rows)", "update (shared)"}
    assert all(seconds > 0 and floor > 0 for seconds, floor in floors["phases"].values())
    # one prompt of P tokens, two completions: the unique tokens count the prompt once, the rows twice
    tokens = floors["tokens"]
    assert tokens["rows"] == 2 * tokens["prompt"] + tokens["completion"] and tokens["completion"] >= 2
    assert "profile of the update (shared)" in done.stdout and "aten::" in done.stdout


def test_relevance_bench_case_reports_chunk_and_memory_fields():
    from mrtpo.bench.relevance import Case, run_case

    row = run_case(Case(vocab=512, batch=2, length=16, chunk=None), repeats=1)
    assert row["chunk_used"] == 8192 and row["unchunked"]  # 16 MiB / (4 B × 512): all 32 positions in one chunk
    assert row["tokens_per_s"] > 0 and row["extra_peak_mib"] >= 0
    assert row["input_mib"] == 2 * 2 * 16 * 512 * 2 / 2**20
    small = run_case(Case(vocab=512, batch=2, length=16, chunk=4), repeats=1)
    assert small["chunk_used"] == 4 and not small["unchunked"]


@pytest.mark.parametrize("groups_per_pass,calls", [("1", 6), ("0", 3)])
def test_cost_bench_replays_groups_together_when_asked(tiny_model_dir, tmp_path, groups_per_pass, calls):
    """Two prompt groups: a pass each (3 + 3 forward calls) by default, one shared pass with
    ``--groups-per-pass 0``."""
    out = tmp_path / "cost.json"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "mrtpo.cli",
            "bench",
            "cost",
            "--model",
            str(tiny_model_dir),
            "--task",
            "sql",
            "--prompts",
            "2",
            "--group-size",
            "2",
            "--max-new-tokens",
            "4",
            "--lora-r",
            "4",
            "--methods",
            "mrtpo",
            "--update-modes",
            "shared",
            "--groups-per-pass",
            groups_per_pass,
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    (row,) = json.loads(out.read_text())["rows"]
    assert row["replay_forward_calls"] == calls


@pytest.mark.parametrize("groups_per_pass,passes", [("1", 2), ("0", 1)])
def test_replay_bench_against_a_plain_forward_over_the_same_tokens(tiny_model_dir, tmp_path, groups_per_pass, passes):
    """Two sql groups (4 contexts each: the original, format, executes, result) of 3 random
    completions of 5 tokens: 3 replay calls per pass; the floor reads every distinct (context,
    completion[:-1]) row once per pass, so its tokens are Σ contexts × 3 × (context + 4)."""
    from transformers import AutoTokenizer

    from mrtpo.bench.replay_floor import replay_batch
    from mrtpo.tasks import get_task

    out = tmp_path / "replay.json"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "mrtpo.cli",
            "bench",
            "replay",
            "--model",
            str(tiny_model_dir),
            "--prompts",
            "2",
            "--group-size",
            "3",
            "--max-new-tokens",
            "5",
            "--groups-per-pass",
            groups_per_pass,
            "--repeats",
            "2",
            "--profile",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    record = json.loads(out.read_text())
    (row,) = record["rows"]
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    groups = replay_batch(get_task("sql"), tok, 2, 3, 5)
    assert [len(g.contexts) for g in groups] == row["contexts"] == [4, 4]
    for g in groups:
        assert g.completions.shape == (3, 5) and int(g.completions.max()) < tok.vocab_size
        assert g.lengths.tolist() == [5, 5, 5]
    assert row["replay_forward_calls"] == 3 * passes and row["floor_forward_calls"] == passes
    distinct = [list(dict.fromkeys(map(tuple, g.contexts))) for g in groups]
    assert row["floor_tokens"] == sum(3 * (len(context) + 4) for contexts in distinct for context in contexts)
    assert len(row["replay_all_s"]) == len(row["floor_all_s"]) == 2
    assert row["ratio"] == pytest.approx(row["replay_s"] / row["floor_s"]) and row["ratio"] > 0
    assert row["host_traffic"]["syncs"] <= 4 * passes  # nothing read back per group or context
    assert "aten::" in record["profile"]["table"] and record["profile"]["kernel_launches"] == 0  # no CUDA here
    assert "replay / floor" in done.stdout


def test_gpu_check_dry_run_on_the_cpu(tiny_model_dir, tmp_path):
    """scripts/gpu_check.sh end to end with the tiny shape on the CPU: a model built from the given
    tokenizer, the replay against its plain-forward floor, a gdpo and an mrtpo run, medians over
    steps >= 2, peak memory, the step ratio."""
    out = tmp_path / "gpu"
    done = subprocess.run(
        [
            "bash",
            "scripts/gpu_check.sh",
            "--shapes",
            "tiny",
            "--tokenizer",
            str(tiny_model_dir),
            "--steps",
            "2",
            "--prompts",
            "1",
            "--group-size",
            "2",
            "--max-new-tokens",
            "4",
            "--out",
            str(out),
            "--models",
            str(tmp_path / "models"),
            "use_cpu=true",
            "bf16=false",
            "activation_checkpointing=false",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHON": sys.executable},
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    record = json.loads((out / "gpu.json").read_text())
    rows = {r["method"]: r for r in record["rows"]}
    assert set(rows) == {"gdpo", "mrtpo"} and all(r["rc"] == 0 and r["steps"] == 2 for r in rows.values())
    # gdpo replays nothing; mrtpo replays every group although random weights score 0 everywhere
    # (skip_zero_advantage=false), and neither leaves update rows out
    assert rows["gdpo"]["replay"] < 1e-3 and rows["mrtpo"]["replay"] > 0
    for method in ("gdpo", "mrtpo"):
        steps = [json.loads(x) for x in (out / "runs" / f"tiny-{method}" / "metrics.jsonl").read_text().splitlines()]
        steps = [x for x in steps if "step_time" in x]
        assert len(steps) == 2 and all(x["reward_std"] == 0 for x in steps)  # nothing would have been replayed
        assert not any("skip/update_completions_skipped" in x for x in steps)
        assert all(x.get("skip/completions_skipped", 0) == 0 for x in steps)
        assert [x.get("skip/completions_replayed") for x in steps] == ([2, 2] if method == "mrtpo" else [None, None])
    assert all(r["peak_gib"] > 0.1 and r["step"] > 0 for r in rows.values())
    assert record["ratios"]["tiny"] == rows["mrtpo"]["step"] / rows["gdpo"]["step"]
    assert "mrtpo / gdpo step, tiny:" in done.stdout
    assert (tmp_path / "models" / "tiny" / "config.json").is_file() and not (out / "models").exists()
    replay = record["replays"]["tiny"]  # gpu.yaml replays 2 groups per pass: the one group takes one pass
    assert replay["rc"] == 0 and replay["replay_forward_calls"] == 3 and replay["floor_forward_calls"] == 1
    assert replay["ratio"] == pytest.approx(replay["replay_s"] / replay["floor_s"])
    assert "replay / plain forward, tiny:" in done.stdout
    assert record["targets"] == {"step_ratio": 1.1, "replay_ratio": 1.2}


def test_gpu_check_refuses_a_real_shape_without_cuda():
    from mrtpo.bench.gpu import main

    with pytest.raises(SystemExit, match="no CUDA device"):
        main(["--shapes", "q05"])


def test_gpu_check_keeps_a_stopped_runs_output(tmp_path):
    """A run stopped by its timeout keeps what it printed (its traceback, its progress), in a log whose
    folder the run never got to make."""
    from mrtpo.bench.gpu import _run_logged

    log = tmp_path / "runs" / "q05-mrtpo.log"
    rc, text = _run_logged(["bash", "-c", "echo started; echo warning >&2; sleep 30"], 1.0, log)
    assert rc == "timeout" and log.read_text() == text
    assert text.startswith("started\nwarning\n") and text.endswith("stopped after 1 s")
    rc, text = _run_logged(["bash", "-c", "echo out; exit 3"], 10.0, log)
    assert (rc, text, log.read_text()) == (3, "out\n", "out\n")
