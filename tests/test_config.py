"""``mrtpo.config``: the settings layers, aliases, type coercion, validation and ``config.yaml``."""

import pytest
import yaml

from mrtpo.config import TRAIN_DEFAULTS, ConfigError, load_config
from mrtpo.saved_config import write_config


def test_unknown_key_names_it_suggests_the_closest_and_says_where_the_list_is(tmp_path):
    cfg = tmp_path / "run.yaml"
    cfg.write_text("task: sql\nlearnig_rate: 1.0e-5\n")
    with pytest.raises(ConfigError) as err:
        load_config([cfg])
    msg = str(err.value)
    assert "'learnig_rate'" in msg and str(cfg) in msg
    assert "did you mean 'learning_rate'?" in msg
    assert "mrtpo train --list-keys" in msg
    # A run-level key is suggested too, and a hopeless key gets no suggestion.
    with pytest.raises(ConfigError, match="did you mean 'train_size'"):
        load_config([], {"train_sise": 4})
    with pytest.raises(ConfigError) as err:
        load_config([], {"qqqqqq": 1})
    assert "did you mean" not in str(err.value)


def test_lora_learning_rate_default_and_deprecated_alias():
    assert load_config([], {"lora_r": 8}).args.learning_rate == 2e-5  # LoRA default
    assert load_config([], {"lora_r": 8, "learning_rate": 3e-6}).args.learning_rate == 3e-6  # explicit wins
    assert load_config([], {}).args.learning_rate == TRAIN_DEFAULTS["learning_rate"]
    assert load_config([], {"gradient_checkpointing": True}).args.activation_checkpointing is True


@pytest.mark.parametrize(
    "override, message",
    [
        ({"max_steps": "many"}, "max_steps (from command line) must be an integer, got 'many'"),
        ({"max_steps": 2.5}, "must be an integer"),
        ({"lam": 3}, "lam must be in [0, 1]"),
        ({"reward_lam": [0.5, 2]}, "every reward_lam entry must be in [0, 1], got [0.5, 2]"),
        ({"method": "gspo"}, "unknown method 'gspo'"),
        ({"task": "sqll"}, "unknown task 'sqll' (did you mean 'sql'?)"),
        ({"dtype": "int8"}, "dtype must be float32, bfloat16 or float16"),
        ({"use_cpu": "maybe"}, "use_cpu (from command line) must be true or false"),
        ({"num_generations": 3}, "divisible by num_generations"),
        ({"steps_per_generation": 2, "generation_batch_size": 8}, "not both"),
    ],
)
def test_bad_values_fail_with_clear_messages(override, message):
    with pytest.raises(ConfigError) as err:
        load_config([], override)
    assert message in str(err.value)


@pytest.mark.parametrize(
    "override, message",
    [
        (
            {"per_device_train_batch_size": 3},
            "per_device_train_batch_size x gradient_accumulation_steps x processes "
            "(3 x 1 x 2) must be divisible by num_generations (4)",
        ),
        ({"per_device_train_batch_size": 3, "gradient_accumulation_steps": 3}, "(3 x 3 x 2)"),
        (
            {"per_device_train_batch_size": 1, "steps_per_generation": 3},
            "per_device_train_batch_size x steps_per_generation x processes (1 x 3 x 2)",
        ),
    ],
)
def test_whole_prompt_groups_count_every_process(monkeypatch, override, message):
    monkeypatch.setenv("WORLD_SIZE", "2")  # as torchrun sets it in each of 2 processes
    with pytest.raises(ConfigError) as err:
        load_config([], override)
    assert message in str(err.value)


def test_write_config_replaces_the_file_whole_or_not_at_all(tmp_path, monkeypatch):
    import mrtpo.config

    path = tmp_path / "config.yaml"
    path.write_text("old")
    config = load_config([], {"max_steps": 3})

    def crash(src, dst):
        raise OSError(28, "No space left on device")

    with monkeypatch.context() as m:  # a failure before the rename leaves the old file as it was
        m.setattr(mrtpo.config.os, "replace", crash)
        with pytest.raises(OSError):
            write_config(config, path)
    assert path.read_text() == "old"
    write_config(config, path)
    assert yaml.safe_load(path.read_text())["max_steps"] == 3
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.yaml"]  # the temporary file was renamed


def test_report_to_needs_the_package():
    import importlib.util

    if importlib.util.find_spec("wandb") is None:
        with pytest.raises(ConfigError, match=r"report_to='wandb' needs the 'wandb' package.*pip install wandb"):
            load_config([], {"report_to": "wandb"})
    if importlib.util.find_spec("tensorboard") is None and importlib.util.find_spec("tensorboardX") is None:
        with pytest.raises(ConfigError, match=r"mrtpo\[tensorboard\]"):  # an extra, not installed by default
            load_config([], {"report_to": "tensorboard"})
    else:
        assert load_config([], {"report_to": "tensorboard"}).args.report_to == ["tensorboard"]
    assert load_config([], {}).args.report_to == []


def test_resolved_config_round_trips_and_lists_every_field(tmp_path):
    import dataclasses

    from mrtpo.config import RunSettings
    from mrtpo.trainer import MRTPOConfig

    config = load_config(
        [],
        {
            "output_dir": str(tmp_path / "run"),
            "task": "toolcall",
            "temperature": 0.8,
            "task_args": {"sample_rows": 0},
            "lora_r": 4,
        },
    )
    path = write_config(config, tmp_path / "config.yaml")
    saved = yaml.safe_load(path.read_text())
    expected = {f.name for f in dataclasses.fields(RunSettings)} | {f.name for f in dataclasses.fields(MRTPOConfig)}
    # Only the derived half of a TRL pair, deprecated aliases, hub tokens and what the machine decided
    # (mrtpo.saved_config, written as comments) are left out.
    from mrtpo.saved_config import machine_decided

    assert expected - set(saved) == {
        "generation_batch_size",
        "gradient_checkpointing",
        "gradient_checkpointing_kwargs",
        "hub_token",
        *machine_decided(config),
    }
    assert saved["temperature"] == 0.8 and saved["task"] == "toolcall" and saved["learning_rate"] == 2e-5
    again = load_config([path])
    assert again.to_flat() == config.to_flat()


def test_a_later_layer_replaces_the_generation_pair(tmp_path):
    saved = tmp_path / "saved.yaml"
    saved.write_text("steps_per_generation: 2\nper_device_train_batch_size: 4\n")
    config = load_config([saved], {"generation_batch_size": 12})
    assert config.args.generation_batch_size == 12 and config.args.steps_per_generation == 3
    assert load_config([saved]).args.generation_batch_size == 8


AVX2 = frozenset({"fpu", "sse4_2", "avx", "avx2", "fma"})  # an AMD EPYC of this kind
SAPPHIRE = AVX2 | {"avx512f", "avx512_bf16", "amx_bf16", "amx_tile"}  # an Intel Xeon with AMX


@pytest.mark.parametrize(
    "flags, lora, given, dtype, line",
    [
        (AVX2, True, None, "float32", "CPU without AVX512-BF16/AMX: float32 weights (bf16 matmuls are slow here)"),
        (SAPPHIRE, True, None, "bfloat16", "CPU with AVX512_BF16/AMX_BF16: bfloat16 base weights"),
        (AVX2 | {"avx512_bf16"}, True, None, "bfloat16", "CPU with AVX512_BF16: bfloat16 base weights"),
        (AVX2 | {"avx512f"}, True, None, "float32", "CPU without AVX512-BF16/AMX: float32 weights"),
        (SAPPHIRE, False, None, "float32", "CPU with AVX512_BF16/AMX_BF16: float32 weights (full fine-tuning"),
        (frozenset(), True, None, "float32", "CPU without AVX512-BF16/AMX: float32 weights"),
        (AVX2, True, "bfloat16", "bfloat16", "bfloat16 weights as configured (bf16 matmuls are slow here; float32"),
        (SAPPHIRE, True, "float32", "float32", "CPU with AVX512_BF16/AMX_BF16: float32 weights as configured"),
    ],
)
def test_cpu_dtype_follows_the_cpus_bf16_features_and_the_user_wins(flags, lora, given, dtype, line):
    from mrtpo.machine import choose_cpu_dtype

    chosen, why = choose_cpu_dtype(flags, lora, given)
    assert chosen == dtype and line in why


def test_cpu_flags_read_from_cpuinfo(tmp_path):
    from mrtpo.machine import cpu_flags

    info = tmp_path / "cpuinfo"
    info.write_text(
        "processor\t: 0\nmodel name\t: Some CPU\nflags\t\t: fpu avx2 amx_bf16 avx512_bf16\n\n"
        "processor\t: 1\nflags\t\t: fpu\n"
    )
    assert cpu_flags(info) == {"fpu", "avx2", "amx_bf16", "avx512_bf16"}
    assert cpu_flags(tmp_path / "missing") == frozenset()


@pytest.mark.parametrize("flags, dtype", [(AVX2, "float32"), (SAPPHIRE, "bfloat16")])
def test_load_config_chooses_the_lora_base_dtype_on_a_cpu(monkeypatch, flags, dtype):
    import mrtpo.machine

    monkeypatch.setattr(mrtpo.machine, "cpu_flags", lambda: flags)
    config = load_config([], {"lora_r": 8, "use_cpu": True})
    assert config.run.dtype == dtype and len(config.notes) == 1
    assert config.notes[0].endswith(
        "; activation checkpointing off; the update runs each distinct prompt once (shared_prompt_update)"
    )
    checkpointed = load_config([], {"lora_r": 8, "use_cpu": True, "activation_checkpointing": True})
    assert "checkpointing on (as configured), so the update runs every row whole" in checkpointed.notes[0]
    unshared = load_config([], {"lora_r": 8, "use_cpu": True, "shared_prompt_update": False})
    assert unshared.notes[0].endswith("shared_prompt_update off, so the update runs every row whole")
    explicit = load_config([], {"lora_r": 8, "use_cpu": True, "dtype": "float16"})
    assert explicit.run.dtype == "float16" and "float16 weights as configured" in explicit.notes[0]
    assert load_config([], {"use_cpu": True}).run.dtype == "float32"  # full fine-tuning


def test_yaml_no_and_yes_stay_words_for_string_settings():
    """YAML reads `save_strategy=no` as false; a string setting gets the word back, a bool stays a bool."""
    from mrtpo.config import parse_overrides

    config = load_config([], parse_overrides(["save_strategy=no", "eval_strategy=no", "report=no"]))
    assert config.args.save_strategy == "no" and config.args.eval_strategy == "no"
    assert config.run.report is False
