"""``mrtpo.bench.learn.plan``: the preset files, and one config per run from one base (over
policies too: only ``task_args.policy.seed`` may differ between them)."""

import pytest
import yaml

from mrtpo.bench.learn import CONFIGS_DIR, read_preset


# --------------------------------------------------------------------------------------------
# Presets.
# --------------------------------------------------------------------------------------------
def test_presets_hold_valid_training_keys_and_per_task_sections():
    from mrtpo.config import load_config, valid_keys

    keys = valid_keys()
    for name in ("cpu", "gpu"):
        path = CONFIGS_DIR / f"bench-learn-{name}.yaml"
        for task in ("sql", "toolcall", "instructions"):
            train, bench = read_preset(path, task)
            assert set(train) <= set(keys), set(train) - set(keys)
            assert bench["eval_size"] > 0 and bench["eval_every"] > 0
        raw = yaml.safe_load(path.read_text())
        assert "method" not in raw and "seed" not in raw  # the benchmark sets those per run
    train, bench = read_preset(CONFIGS_DIR / "bench-learn-cpu.yaml", "sql")
    assert train["task_args"] == {"sample_rows": 0} and bench["target_reward"] == 2.5
    assert bench["eval_max_new_tokens"] == 128
    train, bench = read_preset(CONFIGS_DIR / "bench-learn-cpu.yaml", "instructions")
    assert train["max_completion_length"] == 192 and bench["target_reward"] is None
    config = load_config([], {**read_preset(CONFIGS_DIR / "bench-learn-cpu.yaml", "toolcall")[0], "task": "toolcall"})
    assert config.run.lora_r == 16 and config.args.max_completion_length == 96 and config.args.logging_steps == 1


def test_preset_with_an_unknown_bench_key_is_refused(tmp_path):
    from mrtpo.bench.learn import BenchError

    bad = tmp_path / "p.yaml"
    bad.write_text("max_steps: 2\nbench:\n  eval_evry: 2\n")
    with pytest.raises(BenchError, match="unknown bench key.*eval_evry"):
        read_preset(bad, "sql")


def test_method_settings_let_only_their_keys_differ(tmp_path):
    from mrtpo.bench.learn.plan import BenchError, plan_configs

    plans = plan_configs(
        "gym-call",
        ["gdpo", "mrtpo"],
        [0],
        {"model": "gym"},
        "preset",
        [],
        {"max_steps": 3},
        tmp_path,
        {"mrtpo": {"learning_rate": 3e-4}},
    )
    assert plans[("mrtpo", None, 0)].args.learning_rate == 3e-4
    assert plans[("gdpo", None, 0)].args.learning_rate != 3e-4 and plans[("gdpo", None, 0)].args.max_steps == 3
    with pytest.raises(BenchError, match="not benchmarked"):
        plan_configs("gym-call", ["gdpo"], [0], {}, "preset", [], {}, tmp_path, {"mrtpo": {"learning_rate": 1e-4}})
    with pytest.raises(BenchError, match="set by the benchmark"):
        plan_configs("gym-call", ["gdpo"], [0], {}, "preset", [], {}, tmp_path, {"gdpo": {"seed": 3}})


def test_a_variant_trains_its_base_method_under_its_own_label_with_its_own_settings(tmp_path):
    from mrtpo.bench.learn.plan import BenchError, method_variants, plan_configs, run_dir

    labels, bases = method_variants(["gdpo", "mrtpo", "paper=mrtpo"])
    assert labels == ["gdpo", "mrtpo", "paper"] and bases == {"paper": "mrtpo"}
    plans = plan_configs(
        "gym-call",
        labels,
        [0],
        {"model": "gym"},
        "preset",
        [],
        {"max_steps": 3},
        tmp_path,
        {"paper": {"lam": 1.0, "w_max": None}},
        None,
        bases,
    )
    paper, default = plans[("paper", None, 0)], plans[("mrtpo", None, 0)]
    assert paper.args.method == default.args.method == "mrtpo"
    assert (paper.args.lam, paper.args.w_max) == (1.0, None) and (default.args.lam, default.args.w_max) == (0.2, 1.2)
    assert paper.args.output_dir == str(run_dir(tmp_path, "paper", 0, None))
    for bad in (["mrtpo", "mrtpo"], ["a b=mrtpo"], ["x="]):
        with pytest.raises(BenchError):
            method_variants(bad)


# --------------------------------------------------------------------------------------------
# Policies x seeds (gym tasks only).
# --------------------------------------------------------------------------------------------
def test_policies_give_one_run_per_method_policy_and_seed(tmp_path):
    from mrtpo.bench.learn.plan import plan_configs, stable_settings

    overrides = {"max_steps": 3, "task_args": {"p_follow": 0.7, "policy": {"steps": 3, "batch_size": 8}}}
    plans = plan_configs(
        "gym-call", ["gdpo", "mrtpo"], [0, 4], {"model": "gym"}, "preset", [], overrides, tmp_path, policies=[1, 2]
    )
    assert sorted(plans) == sorted((m, p, s) for m in ("gdpo", "mrtpo") for p in (1, 2) for s in (0, 4))
    for (method, policy, seed), config in plans.items():
        assert config.args.output_dir == str(tmp_path / f"{method}-policy{policy}-seed{seed}")
        # the policy seed merged in; the other task_args (and policy keys) kept
        assert config.run.task_args == {"p_follow": 0.7, "policy": {"steps": 3, "batch_size": 8, "seed": policy}}
    a, b = stable_settings(plans[("gdpo", 1, 0)]), stable_settings(plans[("mrtpo", 2, 4)])
    assert [k for k in a if a[k] != b[k]] == ["task_args"]  # method/seed/folder are not in stable settings
    # without --policies: today's keys, folders and task_args
    plain = plan_configs("gym-call", ["gdpo"], [0], {"model": "gym"}, "preset", [], overrides, tmp_path)
    assert list(plain) == [("gdpo", None, 0)]
    assert plain[("gdpo", None, 0)].args.output_dir == str(tmp_path / "gdpo-seed0")
    assert plain[("gdpo", None, 0)].run.task_args == overrides["task_args"]


def test_only_the_policy_seed_may_differ_between_policies():
    from mrtpo.bench.learn.plan import _without_policy_seed

    def settings(**policy):
        return {"lr": 1.0, "task_args": {"p_follow": 0.7, "policy": policy}}

    assert _without_policy_seed(settings(seed=1, steps=3)) == _without_policy_seed(settings(seed=2, steps=3))
    assert _without_policy_seed(settings(seed=1, steps=3)) != _without_policy_seed(settings(seed=1, steps=4))
    assert _without_policy_seed(settings(seed=1)) == _without_policy_seed({"lr": 1.0, "task_args": {"p_follow": 0.7}})
    assert _without_policy_seed(settings(seed=1)) != _without_policy_seed({"lr": 2.0, "task_args": {"p_follow": 0.7}})


def test_policies_are_refused_off_the_gym_and_with_a_hand_set_policy_seed(tmp_path, capsys):
    from mrtpo.bench.learn import main
    from mrtpo.bench.learn.plan import BenchError, plan_configs

    with pytest.raises(BenchError, match="task 'sql' has none: use a gym-\\* task"):
        plan_configs("sql", ["gdpo"], [0], {}, "preset", [], {}, tmp_path, policies=[0])
    with pytest.raises(BenchError, match="policy.seed, which --policies sets"):
        plan_configs(
            "gym-call",
            ["gdpo"],
            [0],
            {"model": "gym"},
            "preset",
            [],
            {"task_args": {"policy": {"seed": 3}}},
            tmp_path,
            policies=[0],
        )
    assert main(["--task", "sql", "--policies", "0,1", "--dry-run", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--policies" in err[0] and "gym-* task" in err[0]


def test_dry_run_lists_every_policy_and_seed(tmp_path, capsys):
    from mrtpo.bench.learn import main

    assert (
        main(
            [
                "--task",
                "gym-call",
                "--preset",
                "gym",
                "--methods",
                "gdpo,mrtpo",
                "--seeds",
                "0,1",
                "--policies",
                "0,2",
                "--dry-run",
                "--out",
                str(tmp_path),
            ]
        )
        == 0
    )
    printed = capsys.readouterr().out
    for m in ("gdpo", "mrtpo"):
        for p in (0, 2):
            for s in (0, 1):
                assert f"{m:<9} policy {p} seed {s}: to do" in printed
    assert not any(tmp_path.iterdir())  # a dry run writes nothing
