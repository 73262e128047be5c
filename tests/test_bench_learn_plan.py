"""``mrtpo.bench.learn.plan``: the preset files, and one config per run from one base."""

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

    plans = plan_configs("gym-call", ["gdpo", "mrtpo"], [0], {"model": "gym"}, "preset", [], {"max_steps": 3},
                         tmp_path, {"mrtpo": {"learning_rate": 3e-4}})
    assert plans[("mrtpo", 0)].args.learning_rate == 3e-4
    assert plans[("gdpo", 0)].args.learning_rate != 3e-4 and plans[("gdpo", 0)].args.max_steps == 3
    with pytest.raises(BenchError, match="not benchmarked"):
        plan_configs("gym-call", ["gdpo"], [0], {}, "preset", [], {}, tmp_path, {"mrtpo": {"learning_rate": 1e-4}})
    with pytest.raises(BenchError, match="set by the benchmark"):
        plan_configs("gym-call", ["gdpo"], [0], {}, "preset", [], {}, tmp_path, {"gdpo": {"seed": 3}})
