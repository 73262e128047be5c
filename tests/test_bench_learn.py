"""``mrtpo bench learn``: completion digests, the held-out evaluation callback, and a real 2 methods
x 2 seeds x 2 steps benchmark on the sql task with a tiny random model (same prompts per seed across
methods, comparison files, resume).

The tiny model never writes valid SQL, so a test-only reward that differs between almost any two
completions is added to the task's three: then groups have a spread, the updates are real and
the methods' runs diverge after their first update.
"""

import json
import math
import types

import pytest
import torch

from mrtpo.bench.learn import EvalCallback, completion_digests, main


def test_completion_digests_ignore_padding_and_tell_tokens_apart():
    ids = torch.tensor([[5, 6, 7, 0], [5, 6, 7, 9], [5, 6, 8, 0], [5, 6, 7, 1]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 0], [1, 1, 1, 0], [1, 1, 1, 1]])
    d = completion_digests(ids, mask)
    assert len(d) == 4 and all(len(x) == 16 for x in d)
    assert d[0] == d[1]  # same tokens, different padding
    assert len({d[0], d[2], d[3]}) == 3  # one token changed; one token longer


# --------------------------------------------------------------------------------------------
# The evaluation callback: eval mode, no grad, train mode restored, RNG untouched.
# --------------------------------------------------------------------------------------------
def test_eval_callback_runs_greedy_in_eval_mode_and_leaves_the_run_alone(tmp_path):
    from mrtpo.testing import tiny_policy

    model, tok = tiny_policy(seed=1)
    model.train()
    seen = []
    model.model.register_forward_hook(lambda mod, args, out: seen.append((model.training, torch.is_grad_enabled())))

    class Task:
        name = "fake"

        def render_prompt(self, example, tokenizer):
            return example.messages[0]["content"]

        def evaluate(self, outputs, examples):
            return {"n": len(outputs), "mean_chars": sum(map(len, outputs)) / len(outputs), "items": outputs}

    from mrtpo.verifiers import Example

    examples = [
        Example(
            id=f"e{i}",
            split="eval",
            messages=[{"role": "user", "content": f"prompt {i}"}],
            gold={},
            tools=None,
            meta={},
        )
        for i in range(3)
    ]
    trainer = types.SimpleNamespace(
        model=model, processing_class=tok, accelerator=types.SimpleNamespace(unwrap_model=lambda m: m)
    )
    cb = EvalCallback(trainer, Task(), examples, every=2, folder=tmp_path, batch_size=2, max_new_tokens=5)
    rng = torch.get_rng_state()
    cb.evaluate(0)
    assert seen and all(mode == (False, False) for mode in seen)  # eval mode, no grad, every forward
    assert model.training and torch.is_grad_enabled()  # train mode restored
    assert torch.equal(torch.get_rng_state(), rng)  # training's RNG stream is not consumed
    state = types.SimpleNamespace(global_step=1)
    cb.on_step_end(None, state, None)  # step 1: not an eval step
    state.global_step = 2
    cb.on_step_end(None, state, None)
    cb.on_train_end(None, state, None)  # already evaluated at the last step: not again
    state.global_step = 3
    cb.on_train_end(None, state, None)
    lines = [json.loads(x) for x in (tmp_path / "eval.jsonl").read_text().splitlines()]
    assert [r["step"] for r in lines] == [0, 2, 3]
    assert lines[0]["metrics"] == {"n": 3, "mean_chars": lines[0]["metrics"]["mean_chars"]}  # scalars only
    assert lines[0]["n"] == 3 and lines[0]["mean_new_tokens"] <= 5
    outputs = [json.loads(x) for x in (tmp_path / "eval_outputs.jsonl").read_text().splitlines()]
    assert [o["id"] for o in outputs] == ["e0", "e1", "e2"] * 3
    # Greedy: the same weights give the same outputs at every evaluation.
    assert [o["output"] for o in outputs[:3]] == [o["output"] for o in outputs[3:6]]


# --------------------------------------------------------------------------------------------
# A real benchmark: 2 methods x 2 seeds x 2 steps on the sql task.
# --------------------------------------------------------------------------------------------
class CharCode:
    """Test-only reward with a spread in every group; its evidence is the gold SQL (privileged)."""

    name = "char_code"

    def __call__(self, completion, example):
        return float(sum(map(ord, completion)) % 7)

    def evidence(self, example):
        from mrtpo.verifiers import Evidence

        return Evidence(example.gold["sql"], "privileged")


METHODS, SEEDS = ("gdpo", "mrtpo"), (0, 1)


@pytest.fixture(scope="module")
def patched_task():
    from mrtpo.tasks.sql import SqlTask

    original = SqlTask.verifiers
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(SqlTask, "verifiers", lambda self: [*original(self), CharCode()])
        before = torch.get_num_threads()
        torch.set_num_threads(1)  # on 2 shared cores a second thread makes these small ops slower
        yield
        torch.set_num_threads(before)


def _argv(tiny_dir, out, *extra):
    return [
        "--task",
        "sql",
        "--methods",
        ",".join(METHODS),
        "--seeds",
        ",".join(map(str, SEEDS)),
        "--max-steps",
        "2",
        "--eval-every",
        "1",
        "--eval-size",
        "2",
        "--eval-max-new-tokens",
        "6",
        "--target-reward",
        "1000",
        "--out",
        str(out),
        f"model={tiny_dir}",
        "train_size=8",
        "max_completion_length=10",
        "learning_rate=0.05",
        *extra,
    ]


@pytest.fixture(scope="module")
def bench(tiny_dir, patched_task, tmp_path_factory):
    out = tmp_path_factory.mktemp("bench") / "learn-sql"
    # Every run evaluates step 0 itself here, so the test below can check that they agree.
    assert main([*_argv(tiny_dir, out), "--no-share-start-eval"]) == 0
    return out


def _jsonl(path):
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def test_comparison_files_cover_every_method_and_seed(bench):
    for name in ("comparison.json", "comparison.md", "bench.json"):
        assert (bench / name).is_file(), name
    for png in ("rewards.png", "length.png", "heldout.png"):
        assert (bench / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", png
    result = json.loads((bench / "comparison.json").read_text())
    assert sorted((r["method"], r["seed"]) for r in result["runs"]) == [(m, s) for m in METHODS for s in SEEDS]
    assert result["missing"] == []
    assert result["rewards"] == ["format", "executes", "result", "char_code"]
    md = (bench / "comparison.md").read_text()
    for m in METHODS:
        assert result["summary"][m]["seeds"] == list(SEEDS)
        for s in SEEDS:
            assert f"| {m} | {s} | 2 |" in md  # one row per run in the runs table
        steps_table = md.split("## Steps to reach the target reward")[1].split("##")[0]
        assert f"| {m} | not reached (0/2 seeds within 2 steps) |" in steps_table
    for png in ("rewards.png", "length.png", "heldout.png"):
        assert f"]({png})" in md

    # Final values: mean of each run's last (here: both) logged steps, then mean and std over seeds.
    for m in METHODS:
        per_run = []
        for s in SEEDS:
            steps = [r for r in _jsonl(bench / f"{m}-seed{s}" / "metrics.jsonl") if "loss" in r]
            assert [r["step"] for r in steps] == [1, 2]
            per_run.append(sum(r["completions/mean_length"] for r in steps) / 2)
        got = result["summary"][m]["final"]["completions/mean_length"]
        assert got["mean"] == pytest.approx(sum(per_run) / 2)
        assert got["std"] == pytest.approx(abs(per_run[0] - per_run[1]) / math.sqrt(2))
        half = 12.706204736 * got["std"] / math.sqrt(2)  # t(0.975, 1 degree of freedom) * s / sqrt(n)
        assert got["ci95"] == pytest.approx([got["mean"] - half, got["mean"] + half])

    # mrtpo paired against gdpo, seed by seed, on the final total reward.
    paired = result["paired"]
    assert paired["reference"] == "gdpo" and list(paired["by_method"]) == ["mrtpo"]
    final = {(r["method"], r["seed"]): r["final"]["reward"] for r in result["runs"]}
    diffs = [final[("mrtpo", s)] - final[("gdpo", s)] for s in SEEDS]
    total = paired["by_method"]["mrtpo"]["reward"]
    assert total["n"] == 2 and total["mean_difference"] == pytest.approx(sum(diffs) / 2)
    assert set(paired["by_method"]["mrtpo"]) == {
        "reward",
        "reward_at_equal_time",
        "heldout/execution_accuracy",
        "steps_to_target",
    }
    for r in result["runs"]:  # equal seconds: gdpo's budget is its own whole run, so its value is its final
        times = [x["step_time"] for x in _jsonl(bench / f"gdpo-seed{r['seed']}" / "metrics.jsonl") if "loss" in x]
        if "equal_time" not in r:  # on busy cores an mrtpo run's first step can outlast gdpo's 2-step run
            assert r["method"] == "mrtpo"
            own = [x["step_time"] for x in _jsonl(bench / f"mrtpo-seed{r['seed']}" / "metrics.jsonl") if "loss" in x]
            assert own[0] > sum(times)
            continue
        assert r["equal_time"]["budget_s"] == pytest.approx(sum(times))
        if r["method"] == "gdpo":
            assert r["equal_time"]["step"] == 2 and r["equal_time"]["value"] == r["final"]["reward"]
    assert paired["by_method"]["mrtpo"]["steps_to_target"]["n"] == 0  # no seed reached 1000
    assert "## Paired against gdpo, seed by seed" in md and "## Means with 95% confidence intervals" in md


def test_every_run_is_evaluated_at_start_each_step_and_end(bench):
    from mrtpo.tasks import get_task

    first_two = [e.id for e in get_task("sql", sample_rows=0).load("eval", 2)]
    starts = []
    for m in METHODS:
        for s in SEEDS:
            run = bench / f"{m}-seed{s}"
            evals = _jsonl(run / "eval.jsonl")
            assert [e["step"] for e in evals] == [0, 1, 2]
            assert all(e["n"] == 2 and "execution_accuracy" in e["metrics"] for e in evals)
            outputs = _jsonl(run / "eval_outputs.jsonl")
            assert [o["id"] for o in outputs] == first_two * 3
            starts.append([o["output"] for o in outputs[:2]])
            assert json.loads((run / "finished.json").read_text())["steps"] == 2
            assert not any("shared_from" in e for e in evals)
    # Step 0 is the same base policy in every run (LoRA starts at B = 0), decoded greedily: what
    # lets a benchmark evaluate it once and share it (checked in the rerun test below).
    assert all(s == starts[0] for s in starts)
    assert not (bench / "start_eval.json").exists()


def test_same_seed_same_prompts_and_first_batch_across_methods(bench):
    order = {
        (m, s): [r["example_ids"] for r in _jsonl(bench / f"{m}-seed{s}" / "prompts.jsonl")]
        for m in METHODS
        for s in SEEDS
    }
    for s in SEEDS:
        assert order[("gdpo", s)] == order[("mrtpo", s)]
        assert len(order[("gdpo", s)]) == 2 and all(len(b) == 8 for b in order[("gdpo", s)])  # 2 prompts x 4
    assert order[("gdpo", 0)] != order[("gdpo", 1)]  # the seed does change the data order
    for (m, s), batches in order.items():
        samples = _jsonl(bench / f"{m}-seed{s}" / "credit_samples.jsonl")
        # The credit samples of each step come from that step's first prompt.
        assert next(x["example_id"] for x in samples if x["step"] == 0) == batches[0][0]
        assert next(x["example_id"] for x in samples if x["step"] == 1) == batches[1][0]
    for s in SEEDS:
        a = _jsonl(bench / f"gdpo-seed{s}" / "credit_samples.jsonl")
        b = _jsonl(bench / f"mrtpo-seed{s}" / "credit_samples.jsonl")
        # Same initial weights and RNG state: the first sampled completions are identical ...
        assert [x["token_ids"] for x in a if x["step"] == 0] == [x["token_ids"] for x in b if x["step"] == 0]
        # ... and the methods' updates differ (real, different gradients).
        ga = [r["grad_norm"] for r in _jsonl(bench / f"gdpo-seed{s}" / "metrics.jsonl") if "loss" in r]
        gb = [r["grad_norm"] for r in _jsonl(bench / f"mrtpo-seed{s}" / "metrics.jsonl") if "loss" in r]
        assert ga[0] > 0 and gb[0] > 0 and ga[0] != pytest.approx(gb[0], rel=1e-6)


def test_shared_samples_compare_every_training_completion_with_the_first_method(bench):
    result = json.loads((bench / "comparison.json").read_text())
    assert "shared_samples" not in result["summary"]["gdpo"]  # the reference itself
    shared = result["summary"]["mrtpo"]["shared_samples"]
    assert shared["reference"] == "gdpo"
    for s in SEEDS:
        ref = [r["completions"] for r in _jsonl(bench / f"gdpo-seed{s}" / "prompts.jsonl")]
        oth = [r["completions"] for r in _jsonl(bench / f"mrtpo-seed{s}" / "prompts.jsonl")]
        assert [len(b) for b in ref] == [8, 8]  # one digest per sampled completion
        # The credit samples (first completions of each batch, with their tokens) agree with the digests.
        samples = _jsonl(bench / f"gdpo-seed{s}" / "credit_samples.jsonl")
        for x in samples:
            ids = torch.tensor([x["token_ids"]])
            assert completion_digests(ids, torch.ones_like(ids))[0] in ref[x["step"]]
        # Same first batch (same weights and RNG); after one update with lr 0.05 the samples differ.
        assert ref[0] == oth[0] and ref[1] != oth[1]
        same = sum(a == b for ra, rb in zip(ref, oth) for a, b in zip(ra, rb))
        assert shared["per_seed"][str(s)] == {"share": same / 16, "compared": 16, "first_different_step": 2}
    md = (bench / "comparison.md").read_text()
    assert "## Sampled completions shared with gdpo" in md
    assert "| mrtpo | " in md.split("## Sampled completions shared with gdpo")[1]


def test_rerun_skips_finished_runs_and_redoes_an_unfinished_one(bench, tiny_dir, capsys):
    stamps = {p: p.stat().st_mtime_ns for p in bench.glob("*-seed*/metrics.jsonl")}
    capsys.readouterr()
    assert main(_argv(tiny_dir, bench)) == 0
    printed = capsys.readouterr().out
    assert printed.count(": finished") == 4 and "[1/" not in printed
    assert {p: p.stat().st_mtime_ns for p in stamps} == stamps  # nothing retrained

    # Interrupted runs (no finished marker) are started again from scratch, the others are kept.
    # This time step 0 is shared: the first redone run evaluates it, the second copies it.
    redo = [bench / "gdpo-seed1", bench / "mrtpo-seed1"]
    names = ("prompts.jsonl", "eval_outputs.jsonl", "eval.jsonl")
    before = {(run, name): (run / name).read_text() for run in redo for name in names}
    for run in redo:
        (run / "finished.json").unlink()
        with (run / "metrics.jsonl").open("a") as f:
            f.write(json.dumps({"step": 7, "loss": 1.0, "reward": 5.0}) + "\n")
    assert main(_argv(tiny_dir, bench)) == 0
    printed = capsys.readouterr().out
    assert "gdpo      seed 1: partial" in printed and "mrtpo     seed 1: partial" in printed
    assert "[1/2] gdpo seed 1" in printed and "[2/2] mrtpo seed 1" in printed and "seed 0 ->" not in printed
    for run in redo:
        assert [r["step"] for r in _jsonl(run / "metrics.jsonl") if "loss" in r] == [1, 2]
        for name in ("prompts.jsonl", "eval_outputs.jsonl"):
            assert (run / name).read_text() == before[(run, name)], (run, name)  # same prompts and outputs
        old = [json.loads(x) for x in before[(run, "eval.jsonl")].splitlines()]
        new = _jsonl(run / "eval.jsonl")
        assert [e["metrics"] for e in new] == [e["metrics"] for e in old]
    assert "shared_from" not in _jsonl(redo[0] / "eval.jsonl")[0]
    assert _jsonl(redo[1] / "eval.jsonl")[0]["shared_from"] == "gdpo-seed1"
    assert json.loads((bench / "start_eval.json").read_text())["run"] == "gdpo-seed1"
    kept = {p: s for p, s in stamps.items() if p.parent not in redo}
    assert len(kept) == 2 and {p: p.stat().st_mtime_ns for p in kept} == kept


def test_changed_settings_or_controlled_keys_are_refused(bench, tiny_dir, capsys):
    capsys.readouterr()
    assert main([*_argv(tiny_dir, bench), "temperature=0.5"]) == 2
    err = capsys.readouterr().err
    assert "finished with other settings" in err and "temperature: 1.0 vs 0.5" in err
    assert main([*_argv(tiny_dir, bench), "--eval-size", "3"]) == 2
    assert "eval_size: 2 vs 3" in capsys.readouterr().err
    assert main([*_argv(tiny_dir, bench), "seed=3"]) == 2
    assert "seed is set by the benchmark" in capsys.readouterr().err
    assert main([*_argv(tiny_dir, bench), "--methods", "gdpo,nope"]) == 2
    assert "unknown method(s) nope" in capsys.readouterr().err


def test_a_weight_shape_change_keeps_finished_runs_of_methods_that_do_not_replay(bench, tiny_dir, capsys):
    """gdpo does not read lam / w_max: its finished runs stay valid when they change (a new default
    shape); mrtpo's runs, which read them, are refused, naming the keys."""
    capsys.readouterr()
    assert main([*_argv(tiny_dir, bench, "lam=0.5", "w_max=1.5"), "--methods", "gdpo", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert out.count(": finished") == len(SEEDS) and "to do" not in out
    assert main([*_argv(tiny_dir, bench, "lam=0.5"), "--methods", "mrtpo", "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "mrtpo-seed0 finished with other settings" in err and "vs 0.5" in err and "lam: " in err


def test_dry_run_lists_the_plan_without_training(tiny_dir, tmp_path, capsys):
    out = tmp_path / "plan"
    assert main([*_argv(tiny_dir, out), "--dry-run"]) == 0
    printed = capsys.readouterr().out
    for m in METHODS:
        for s in SEEDS:
            assert f"{m:<9} seed {s}: to do" in printed
    assert "2 steps × 2 prompts × 4 completions" in printed
    assert not out.exists()


def test_compare_only_rebuilds_from_finished_runs_and_keeps_the_training_command(bench, tiny_dir, capsys):
    (bench / "comparison.md").unlink()
    assert main([*_argv(tiny_dir, bench), "--compare-only"]) == 0
    assert "[1/" not in capsys.readouterr().out  # nothing trained
    md = (bench / "comparison.md").read_text()
    command = next(line for line in md.splitlines() if line.startswith("- **command**"))
    assert "--compare-only" not in command and "--methods gdpo,mrtpo" in command
