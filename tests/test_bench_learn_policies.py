"""``mrtpo bench learn --policies``: a real 2 methods x 2 policies x 1 seed x 2 steps gym benchmark on
tiny warm starts (3 steps, built in a temporary model cache): one folder per (method, policy, seed),
each run on its own policy, one shared step-0 evaluation per policy, the two-level comparison, resume."""

import json

import pytest
import torch

ARGS = [
    "--task",
    "gym-call",
    "--preset",
    "gym",
    "--methods",
    "gdpo,mrtpo",
    "--seeds",
    "0",
    "--policies",
    "0,1",
    "--max-steps",
    "2",
    "--eval-every",
    "2",
    "--eval-size",
    "4",
    "task_args={policy: {steps: 3, batch_size: 8}}",
    "per_device_train_batch_size=8",
]


@pytest.fixture(scope="module")
def bench(tmp_path_factory):
    from mrtpo.bench.learn import main

    out = tmp_path_factory.mktemp("bench") / "policies"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MRTPO_CACHE", str(tmp_path_factory.mktemp("gym-cache")))
        before = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            assert main([*ARGS, "--out", str(out)]) == 0
        finally:
            torch.set_num_threads(before)
        yield out, mp


def test_every_method_policy_and_seed_trains_on_its_own_policy(bench):
    out, _ = bench
    for method in ("gdpo", "mrtpo"):
        for policy in (0, 1):
            info = json.loads((out / f"{method}-policy{policy}-seed0" / "finished.json").read_text())
            assert info["steps"] == 2
            assert info["settings"]["task_args"] == {"policy": {"steps": 3, "batch_size": 8, "seed": policy}}
    starts = [json.loads((out / f"start_eval-policy{p}.json").read_text()) for p in (0, 1)]
    assert starts[0]["signature"] != starts[1]["signature"]  # each policy's step 0 evaluated once, on its own
    assert not (out / "start_eval.json").exists() and json.loads((out / "bench.json").read_text())["policies"] == [0, 1]


def test_the_comparison_pairs_by_policy_and_resumes(bench, capsys):
    from mrtpo.bench.learn import main

    out, _ = bench
    result = json.loads((out / "comparison.json").read_text())
    assert result["policies"] == [0, 1] and result["missing"] == []
    two = result["two_level"]["by_method"]["mrtpo"]["reward"]
    assert list(two["per_policy"]) == ["0", "1"] and two["n_pairs"] == 2
    assert [c["n"] for c in two["per_policy"].values()] == [1, 1]  # one seed per policy, paired within it
    assert "reward_at_equal_time" in result["two_level"]["by_method"]["mrtpo"]  # the runs logged step times
    assert "## Paired against gdpo over policies and seeds" in (out / "comparison.md").read_text()
    capsys.readouterr()
    assert main([*ARGS, "--out", str(out)]) == 0  # all finished: nothing trained again
    printed = capsys.readouterr().out
    assert "mrtpo     policy 1 seed 0: finished" in printed and "[1/" not in printed
