"""``mrtpo.bench.learn.compare`` / ``.report`` on hand-made finished runs (no training): per-method
means with 95% CIs, each method paired against gdpo seed by seed, the held-out metrics a task
declares, and the Markdown tables; over policies, the two-level intervals and each policy's own
row; at equal training seconds."""

import json
import math

import pytest

from mrtpo.bench.learn import HELDOUT_METRICS, build_comparison, heldout_metrics

FINAL = {("gdpo", 0): 1.0, ("gdpo", 1): 2.0, ("gdpo", 2): 3.0, ("mrtpo", 0): 2.0, ("mrtpo", 1): 4.0, ("mrtpo", 2): 6.0}
HELDOUT_END = {
    ("gdpo", 0): 0.1,
    ("gdpo", 1): 0.2,
    ("gdpo", 2): 0.3,
    ("mrtpo", 0): 0.2,
    ("mrtpo", 1): 0.2,
    ("mrtpo", 2): 0.5,
}


class DeclaringTask:
    name = "made-up"
    heldout_metrics = ("acc", "rate")


def _write_runs(out):
    """Each run logs rewards 0, final/2, final at steps 1-3 and evaluates at steps 0 and 3."""
    for (method, seed), final in FINAL.items():
        folder = out / f"{method}-seed{seed}"
        folder.mkdir(parents=True)
        lines = [
            {"step": s, "loss": 0.0, "reward": r, "rewards/ok/mean": r / 2, "completions/mean_length": 10.0}
            for s, r in ((1, 0.0), (2, final / 2), (3, final))
        ]
        (folder / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
        evals = [
            {"step": 0, "metrics": {"acc": 0.0, "rate": 0.5}},
            {"step": 3, "metrics": {"acc": HELDOUT_END[(method, seed)], "rate": 0.5}},
        ]
        (folder / "eval.jsonl").write_text("".join(json.dumps(x) + "\n" for x in evals))
        (folder / "finished.json").write_text(json.dumps({"steps": 3, "wall_s": 1.0, "train_s": 1.0, "eval_s": 0.0}))


@pytest.fixture
def result(tmp_path):
    _write_runs(tmp_path)
    return build_comparison(
        tmp_path, DeclaringTask(), ["mrtpo", "gdpo"], [0, 1, 2], target=1.5, tail=1, plots=False
    ), tmp_path


def test_means_carry_student_t_intervals(result):
    res, _ = result
    gdpo = res["summary"]["gdpo"]["final"]["reward"]
    half = 4.302652729911275 / math.sqrt(3)  # t(0.975, 2) * s / sqrt(3), s = 1
    assert gdpo["mean"] == 2.0 and gdpo["ci95"] == pytest.approx([2 - half, 2 + half])
    # Steps to 1.5: gdpo never / step 3 / step 2; mrtpo step 3 / 2 / 2.
    assert res["summary"]["gdpo"]["steps_to_target"]["per_seed"] == {"0": None, "1": 3, "2": 2}
    stt = res["summary"]["mrtpo"]["steps_to_target"]
    assert stt["mean"] == pytest.approx(7 / 3) and stt["ci95"] is not None


def test_every_method_is_paired_against_gdpo_seed_by_seed(result):
    res, _ = result
    assert res["heldout_metrics"] == ["acc", "rate"]  # declared by the task object
    assert res["paired"]["reference"] == "gdpo" and list(res["paired"]["by_method"]) == ["mrtpo"]
    got = res["paired"]["by_method"]["mrtpo"]
    # Final reward: differences 1, 2, 3 (hand-computed in test_bench_learn_stats).
    t = 2 * math.sqrt(3)
    assert got["reward"]["mean_difference"] == 2.0 and got["reward"]["p_value"] == pytest.approx(1 - t / math.sqrt(14))
    assert got["reward"]["p_sign_flip"] == 0.25
    # Held-out headline at the end: differences 0.1, 0, 0.2.
    assert got["heldout/acc"]["n"] == 3 and got["heldout/acc"]["mean_difference"] == pytest.approx(0.1)
    # Steps to target over the seeds where both reached it (1 and 2): differences -1 and 0.
    assert got["steps_to_target"]["seeds"] == ["1", "2"] and got["steps_to_target"]["mean_difference"] == -0.5


def test_markdown_shows_intervals_and_paired_tests(result):
    res, out = result
    md = (out / "comparison.md").read_text()
    cis = md.split("## Means with 95% confidence intervals over seeds")[1].split("##")[0]
    half = 4.302652729911275 / math.sqrt(3)
    assert f"| gdpo | 2.000 [{2 - half:.3f}, {2 + half:.3f}] |" in cis
    paired = md.split("## Paired against gdpo, seed by seed")[1].split("##")[0]
    assert "| mrtpo | reward | 3 | 2.000 [" in paired and "| 0.25 |" in paired
    assert "| mrtpo | steps_to_target | 2 | -0.500 [" in paired
    assert json.loads((out / "comparison.json").read_text())["paired"] == res["paired"]


def test_one_seed_has_no_pairs_nor_intervals(tmp_path):
    _write_runs(tmp_path)
    res = build_comparison(tmp_path, "sql", ["gdpo", "mrtpo"], [1], plots=False)
    assert res["paired"] is None and res["summary"]["gdpo"]["final"]["reward"]["ci95"] is None
    assert "## Paired against" not in (tmp_path / "comparison.md").read_text()


def test_heldout_metrics_from_the_task_or_the_table():
    assert heldout_metrics(DeclaringTask()) == ("acc", "rate")
    assert heldout_metrics("sql") == HELDOUT_METRICS["sql"]  # the built-in tasks declare none
    assert heldout_metrics("no-such-task") == ()


# --------------------------------------------------------------------------------------------
# Policies x seeds, and equal training seconds.
# --------------------------------------------------------------------------------------------
DIFFS = {1: [1.0, 2.0, 3.0], 2: [0.0, 0.5, 1.0]}  # mrtpo − gdpo per policy, seeds 0, 1, 2


def _write_policy_runs(out):
    """gdpo ends at 1.0 after 3 steps of 1 s; mrtpo at 1 + d after steps of 1.5 s, having 0.5 + d
    at step 2 (3 s, gdpo's whole run). mrtpo policy 2 seed 2 is not finished."""
    for policy, diffs in DIFFS.items():
        for seed, d in enumerate(diffs):
            for method, rewards, step_time in (("gdpo", (0.0, 0.5, 1.0), 1.0), ("mrtpo", (0.0, 0.5 + d, 1.0 + d), 1.5)):
                folder = out / f"{method}-policy{policy}-seed{seed}"
                folder.mkdir(parents=True)
                lines = [
                    {"step": s, "reward": r, "step_time": step_time, "completions/mean_length": 10.0}
                    for s, r in zip((1, 2, 3), rewards)
                ]
                (folder / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
                if (method, policy, seed) != ("mrtpo", 2, 2):
                    (folder / "finished.json").write_text(json.dumps({"steps": 3, "train_s": 3.0, "eval_s": 0.0}))


def test_policies_pair_by_policy_and_seed_with_a_two_level_interval(tmp_path):
    _write_policy_runs(tmp_path)
    res = build_comparison(
        tmp_path, "made-up", ["gdpo", "mrtpo"], [0, 1, 2], tail=1, heldout=[], plots=False, policies=[1, 2]
    )
    assert res["policies"] == [1, 2] and res["missing"] == [["mrtpo", 2, 2]]
    assert {(r["method"], r["policy"], r["seed"]) for r in res["runs"]} >= {("gdpo", 2, 2), ("mrtpo", 1, 0)}
    pooled = res["paired"]["by_method"]["mrtpo"]["reward"]  # every (policy, seed) pair, as if independent
    assert pooled["n"] == 5 and pooled["mean_difference"] == pytest.approx((6 + 0.5) / 5)
    assert "policy2-seed1" in pooled["seeds"]
    two = res["two_level"]["by_method"]["mrtpo"]["reward"]
    assert two["per_policy_mean"] == pytest.approx({"1": 2.0, "2": 0.25}) and two["mean"] == pytest.approx(1.125)
    assert two["between_policy_std"] == pytest.approx(1.75 / math.sqrt(2)) and two["n_pairs"] == 5
    half = math.tan(math.pi * 0.475) * (1.75 / math.sqrt(2)) / math.sqrt(2)  # t(0.975, 1) * sd / sqrt(2)
    assert two["ci95_t"] == pytest.approx([1.125 - half, 1.125 + half])
    assert two["per_policy"]["1"]["mean_difference"] == 2.0 and two["per_policy"]["1"]["p_sign_flip"] == 0.25
    assert two["per_policy"]["2"]["n"] == 2
    # Equal seconds: mrtpo at step 2 (3 s = gdpo's run) has 0.5 + d against gdpo's final 1.0.
    equal = res["two_level"]["by_method"]["mrtpo"]["reward_at_equal_time"]
    assert equal["per_policy_mean"] == pytest.approx({"1": 1.5, "2": -0.25})
    mrtpo_row = next(r for r in res["runs"] if (r["method"], r["policy"], r["seed"]) == ("mrtpo", 1, 0))
    assert mrtpo_row["equal_time"] == {"budget_s": 3.0, "step": 2, "seconds": 3.0, "value": 1.5, "ran_out": False}
    md = (tmp_path / "comparison.md").read_text()
    assert "11 finished of 12 (gdpo, mrtpo × policies 1, 2 × seeds 0, 1, 2)" in md and "mrtpo policy 2 seed 2" in md
    table = md.split("## Paired against gdpo over policies and seeds")[1].split("##")[0]
    assert f"| mrtpo | reward | 2 × 5 | 1.125 [{1.125 - half:.3f}, {1.125 + half:.3f}] |" in table
    assert "| mrtpo | reward | 1 | 3 | 2.000 [" in table and "| 4 of 5 |" in table
    assert "| gdpo | 1 | 0 | 3 |" in md.split("## Runs")[1]  # the policy column


def test_without_policies_the_output_has_no_policy_keys(result):
    res, out = result
    assert "policies" not in res and "two_level" not in res and all("policy" not in r for r in res["runs"])
    assert "reward_at_equal_time" not in res["paired"]["by_method"]["mrtpo"]  # the runs logged no step times
    assert "over policies" not in (out / "comparison.md").read_text()
