"""TRL conventions on ``mrtpo train``: ``--field value`` flags, TRL's names, and TRL's knobs (mrtpo.cli_args,
mrtpo.trl_names, mrtpo.model_init): each knob works, or is refused before any model loads with its reason."""

import importlib.util
import json
from pathlib import Path

import pytest
import torch

from mrtpo.cli_args import split_argv
from mrtpo.config import ConfigError, load_config, valid_keys
from mrtpo.train import _parser, main, resolve_from_argv
from mrtpo.trl_names import PEFT_DEFAULT_R, suggest


def _resolve(argv):
    parser = _parser()
    rest, fields = split_argv(argv, parser)
    ns = parser.parse_args(rest)
    ns.fields = fields
    return resolve_from_argv(ns)[0]


# --------------------------------------------------------------------------------------------
# --field value.
# --------------------------------------------------------------------------------------------
def test_field_flags_split_from_the_named_ones():
    parser = _parser()
    rest, fields = split_argv(
        [
            "--num_generations",
            "4",
            "--max_steps",
            "3",
            "--use_peft",
            "temperature=0.7",
            "--lora_target_modules",
            "q_proj",
            "v_proj",
            "--output_dir=runs/x",
            "--reward_weights",
            "1",
            "0.5",
            "--bf16",
            "false",
            "--beta=0.1",
            "--task",
            "sql",
        ],
        parser,
    )
    assert rest == ["--max-steps", "3", "temperature=0.7", "--output-dir=runs/x", "--task", "sql"]
    assert fields == {
        "num_generations": 4,
        "use_peft": True,
        "lora_target_modules": ["q_proj", "v_proj"],
        "reward_weights": [1, 0.5],
        "bf16": False,
        "beta": 0.1,
    }
    # one value of a list-or-text key is the value itself (peft reads "all-linear" as a keyword, not a module)
    assert split_argv(["--lora_target_modules", "all-linear"], parser)[1] == {"lora_target_modules": "all-linear"}
    assert split_argv(["--reward_weights", "[1, 2]"], parser)[1] == {"reward_weights": [1, 2]}
    assert split_argv(["--report_to", "wandb", "tensorboard"], parser) == ([], {"report_to": ["wandb", "tensorboard"]})
    assert split_argv(["--report-to", "none", "seed=1"], parser) == (["seed=1"], {"report_to": "none"})
    assert split_argv(["--model_init_kwargs", "{use_kernels: true}"], parser)[1] == {
        "model_init_kwargs": {"use_kernels": True}
    }
    with pytest.raises(ConfigError, match="--num_generations needs a value"):
        split_argv(["--num_generations"], parser)


def test_trl_style_command_line_resolves_with_aliases():
    config = _resolve(
        [
            "--num_generations",
            "4",
            "--model_name_or_path",
            "smollm2-135m",
            "--use_peft",
            "--torch_dtype",
            "bfloat16",
            "--per_device_train_batch_size",
            "8",
            "--max-steps",
            "2",
        ]
    )
    assert config.run.model == "smollm2-135m" and config.run.lora_r == PEFT_DEFAULT_R and config.run.dtype == "bfloat16"
    assert config.args.num_generations == 4 and config.args.per_device_train_batch_size == 8
    assert config.args.max_steps == 2
    assert config.args.learning_rate == config.run.lora_learning_rate  # LoRA's default, as with lora_r
    # precedence: named flags < --key value < key=value
    assert _resolve(["--seed", "1", "seed=3"]).args.seed == 3
    assert _resolve(["--seed", "1", "--num_generations", "2", "num_generations=4"]).args.num_generations == 4
    assert _resolve(["--max-steps", "5", "--max_steps", "6"]).args.max_steps == 6  # one option, the later wins


def test_use_peft_keeps_a_rank_that_is_set(tmp_path):
    first = tmp_path / "a.yaml"
    first.write_text("lora_r: 8\n")
    assert load_config([first], {"use_peft": True}).run.lora_r == 8  # an earlier layer's rank stays
    assert load_config([], {"use_peft": True, "lora_r": 4}).run.lora_r == 4
    assert load_config([first], {"use_peft": False}).run.lora_r == 0
    assert load_config([], {"model_name_or_path": "smollm2-135m", "model": "gym"}).run.model == "gym"  # target wins


@pytest.mark.parametrize(
    ("key", "expected"),
    [
        ("use_peft_x", None),  # no misleading suggestion (was: use_cpu for use_peft)
        ("learnig_rate", "learning_rate"),
        ("num_generation", "num_generations"),
        ("train_sise", "train_size"),
        ("lora_rank", None),  # not local_rank: a shared word alone is no typo
        ("gradient_accumulation", "gradient_accumulation_steps"),
        ("max_step", "max_steps"),
    ],
)
def test_suggestions_are_typos_only(key, expected):
    assert suggest(key, valid_keys()) == expected


@pytest.mark.parametrize(
    ("key", "reason"),
    [
        ("dataset_streaming", "streaming datasets are not supported"),
        ("load_in_4bit", "QLoRA"),
        ("attn_implementation", "model_init_kwargs={attn_implementation"),
        ("use_dora", "not supported"),
    ],
)
def test_trl_names_mrtpo_does_not_take_say_what_to_do(key, reason, capsys, tmp_path):
    assert main([f"--{key}", "x", "--output-dir", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert f"unknown config key {key!r}" in err and reason in err and "did you mean" not in err


def test_the_trl_command_trains_on_a_tiny_model(tmp_path, tiny_dir, capsys, one_thread):
    """``mrtpo train --num_generations 4 --model_name_or_path ...``: the issue's command, on the tiny model."""
    data = tmp_path / "data.jsonl"
    data.write_text(
        "".join(json.dumps({"prompt": [{"role": "user", "content": f"Say {i}."}]}) + "\n" for i in range(4))
    )
    (tmp_path / "task.yaml").write_text("dataset: data.jsonl\nrewards: [trl.rewards.think_format_reward]\n")
    rc = main(
        [
            "--task",
            str(tmp_path / "task.yaml"),
            "--num_generations",
            "4",
            "--model_name_or_path",
            str(tiny_dir),
            "--method",
            "gdpo",
            "--max_steps",
            "1",
            "--max_completion_length",
            "4",
            "--output_dir",
            str(tmp_path / "run"),
            "--report",
            "false",
            "--save_strategy",
            "no",
            "--use_peft",
            "--lora_r",
            "2",
        ]
    )
    assert rc == 0, capsys.readouterr().err[-2000:]
    saved = (tmp_path / "run" / "config.yaml").read_text()
    assert "num_generations: 4" in saved and "lora_r: 2" in saved and f"model: {tiny_dir}" in saved


def test_trl_script_arguments_make_a_task(tmp_path, tiny_dir, monkeypatch, capsys, one_thread):
    """``--dataset_name data.jsonl --reward_funcs think_format_reward my_rewards.lengths``, as TRL's grpo script
    takes them: a task file in the cache, the prompt column ``prompt``, a module of the working folder."""
    from mrtpo.tasks import get_task

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MRTPO_CACHE", str(tmp_path / "cache"))
    (tmp_path / "data.jsonl").write_text(
        "".join(
            json.dumps({"prompt": [{"role": "user", "content": f"Say {i}."}], "answer": str(i)}) + "\n"
            for i in range(4)
        )
    )
    (tmp_path / "my_rewards.py").write_text(
        "def lengths(completion_ids, **kwargs):\n    return [float(len(i)) for i in completion_ids]\n"
    )
    argv = [
        "--dataset_name",
        "data.jsonl",
        "--reward_funcs",
        "think_format_reward",
        "my_rewards.lengths",
        "--model_name_or_path",
        str(tiny_dir),
        "--method",
        "gdpo",
        "--max_steps",
        "1",
        "--max_completion_length",
        "4",
        "--output_dir",
        str(tmp_path / "run"),
        "--report",
        "false",
        "--save_strategy",
        "no",
    ]
    config = _resolve(argv)
    task_file = Path(config.run.task)
    assert task_file.parent == tmp_path / "cache" / "tasks" and task_file.is_file()
    task = get_task(config.run.task)
    assert task.name == "data" and [v.name for v in task.verifiers()] == ["think_format_reward", "lengths"]
    assert _resolve(argv).run.task == config.run.task  # the same arguments: the same file
    assert main(argv) == 0, capsys.readouterr().err[-2000:]
    assert f"task: {task_file}" in (tmp_path / "run" / "config.yaml").read_text()  # resumable from its config
    with pytest.raises(ConfigError, match="dataset_name needs reward_funcs"):
        load_config([], {"dataset_name": "data.jsonl"})
    with pytest.raises(ConfigError, match="both name the task"):
        load_config([], {"dataset_name": "data.jsonl", "reward_funcs": ["think_format_reward"], "task": "sql"})


# --------------------------------------------------------------------------------------------
# TRL's knobs: working, or refused before the model loads.
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("scale", ["none", "batch"])
def test_scale_rewards_other_than_group_is_refused_where_the_method_decides(scale):
    for method in ("mrtpo", "gdpo"):
        with pytest.raises(
            ConfigError,
            match=f"scale_rewards='{scale}' is not supported with method='{method}'.*credit_batch_norm.*method='grpo'",
        ):
            load_config([], {"scale_rewards": scale, "method": method})
    assert load_config([], {"scale_rewards": scale, "method": "grpo"}).args.scale_rewards == scale


@pytest.mark.parametrize("scale", ["none", "batch"])
def test_grpo_trains_with_trls_reward_scaling(tmp_path, one_thread, scale):
    """Dr. GRPO (``none``: no std division) and batch scaling, against the formula computed here from the
    step's own rewards: ``A = S - mean_group(S)``, divided by ``std_batch(S) + 1e-4`` for ``batch``."""
    from tests.test_trainer import char_code, has_letter_e, make_trainer, plain_length, record_batches

    trainer = make_trainer(
        tmp_path, [has_letter_e, char_code, plain_length], method="grpo", scale_rewards=scale, max_steps=1
    )
    seen = record_batches(trainer)
    trainer.train()
    batch = seen[0]
    total = batch["rewards"].double().nansum(1)  # reward_weights all 1
    centred = total - total.view(-1, 2).mean(1).repeat_interleave(2)  # num_generations 2
    expected = centred if scale == "none" else centred / (total.std() + 1e-4)
    mask = batch["out"]["completion_mask"].float()
    got = batch["out"]["advantages"]
    assert got.shape == mask.shape  # token-level, uniform over each completion's tokens
    torch.testing.assert_close(got.double(), expected.unsqueeze(1) * mask.double(), atol=1e-5, rtol=1e-5)
    assert centred.abs().max() > 0  # the rewards had spread: the check compared something
    grouped = centred / (total.view(-1, 2).std(1).repeat_interleave(2) + 1e-4)  # scale_rewards="group"
    assert not torch.allclose(expected, grouped)  # and the scaling asked for is not the default one


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vllm is installed here")
def test_use_vllm_without_vllm_is_refused_before_the_model_loads(tmp_path, capsys):
    assert main(["--use_vllm", "--output-dir", str(tmp_path / "run")]) == 2
    assert "needs the 'vllm' package" in capsys.readouterr().err


@pytest.mark.skipif(importlib.util.find_spec("liger_kernel") is not None, reason="liger-kernel is installed here")
def test_liger_without_its_package_points_to_use_kernels():
    with pytest.raises(ConfigError, match="liger-kernel.*use_kernels"):
        load_config([], {"use_liger_kernel": True})


def test_wrong_length_reward_weights_are_refused_before_the_model_loads(tmp_path, tiny_dir, capsys, monkeypatch):
    import mrtpo.run_build

    def no_load(*args, **kwargs):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(mrtpo.run_build, "load_model", no_load)  # what build_trainer calls
    rc = main(
        [
            "--task",
            "gym-constraints",
            "--model",
            str(tiny_dir),
            "--reward_weights",
            "1",
            "2",
            "--output-dir",
            str(tmp_path / "run"),
        ]
    )
    assert rc == 2
    err = capsys.readouterr().err
    assert "reward_weights has 2 entries for the 3 rewards of task 'gym-constraints'" in err
    assert "give one per reward" in err and not (tmp_path / "run").exists()


def test_quantized_loading_is_refused_with_the_reason():
    with pytest.raises(ConfigError, match="QLoRA"):
        load_config([], {"load_in_4bit": True})
    from mrtpo.model_init import ModelInitError, parse_model_init

    for kwargs in ({"load_in_4bit": True}, {"quantization_config": {"load_in_4bit": True}}):
        with pytest.raises(ModelInitError, match="QLoRA"):
            parse_model_init("smollm2-135m", kwargs)


def test_use_kernels_and_device_map_reach_the_model(tmp_path, tiny_dir, one_thread):
    from mrtpo.train import build_trainer

    config = load_config(
        [],
        {
            "task": "gym-constraints",
            "model": str(tiny_dir),
            "method": "gdpo",
            "max_steps": 1,
            "max_completion_length": 4,
            "output_dir": str(tmp_path / "run"),
            "report": False,
            "save_strategy": "no",
            "model_init_kwargs": {"use_kernels": True, "device_map": "cpu"},
        },
    )
    trainer = build_trainer(config)
    model = trainer.accelerator.unwrap_model(trainer.model)
    assert model.use_kernels is True and model.device.type == "cpu"
    trainer.train()
    assert trainer.state.global_step == 1


# --------------------------------------------------------------------------------------------
# The log line trackers see: credit summary only (metrics.jsonl keeps every key).
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("detail", [False, True])
def test_trackers_get_the_credit_summary_and_metrics_jsonl_everything(tmp_path, one_thread, detail):
    from transformers import TrainerCallback

    from mrtpo.trainer.metrics import credit_metric_keys, is_credit_detail
    from tests.test_trainer import char_code, has_letter_e, make_trainer, plain_length

    seen = []

    class Tracker(TrainerCallback):  # stands for TensorBoard / wandb / the console: added after the trainer's own
        def on_log(self, args, state, control, logs=None, **kwargs):
            seen.append(dict(logs))

    trainer = make_trainer(
        tmp_path,
        [has_letter_e, char_code, plain_length],
        max_steps=1,
        log_credit_detail=detail,
        skip_zero_advantage=False,
    )
    trainer.add_callback(Tracker())
    trainer.train()
    names = trainer.reward_func_names
    written = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    step = next(r for r in written if "loss" in r)
    logged = set(credit_metric_keys(names)) & set(step)
    assert sum(map(is_credit_detail, logged)) >= 20  # deciles, Gini, ... of 3 rewards: all in the file
    tracked = next(r for r in seen if "loss" in r)
    credit = {k for k in tracked if k.startswith("credit/")}
    if detail:
        assert credit == logged
    else:
        assert credit == {k for k in logged if not is_credit_detail(k)}
        assert credit and all(k.rsplit("/", 1)[1] in ("relevance_mean", "top10_share") for k in credit)
    assert trainer.state.log_history[0].keys() >= logged  # the trainer's own history keeps them all


# --------------------------------------------------------------------------------------------
# Smaller items: the GPU config on a default install, eval's help.
# --------------------------------------------------------------------------------------------
def test_the_gpu_config_loads_without_the_tracker_extras():
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    config = load_config([root / "configs" / "gpu.yaml"], {"use_cpu": True, "bf16": False})
    assert config.args.report_to in ([], ["none"], "none")
    if importlib.util.find_spec("tensorboard") is None and importlib.util.find_spec("tensorboardX") is None:
        with pytest.raises(ConfigError, match=r"pip install mrtpo\[tensorboard\]"):  # asked for: said how
            load_config([root / "configs" / "gpu.yaml"], {"report_to": "tensorboard"})


def test_eval_help_names_task_files(capsys):
    from mrtpo.evaluate import main as eval_main

    with pytest.raises(SystemExit):
        eval_main(["--help"])
    assert "task file: path/to/task.yaml" in " ".join(capsys.readouterr().out.split())


@pytest.mark.slow
def test_the_issues_command_on_smollm2(tmp_path):
    """The issue's command as written, on the preset it names (about 3 min on one shared CPU core)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    cmd = [
        sys.executable,
        "-m",
        "mrtpo.cli",
        "train",
        "--config",
        str(root / "examples" / "own-task" / "config.yaml"),
        "--num_generations",
        "4",
        "--model_name_or_path",
        "smollm2-135m",
        "--max_steps",
        "2",
        "--output_dir",
        str(tmp_path / "run"),
        "skip_zero_advantage=false",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    card = (tmp_path / "run" / "README.md").read_text()
    assert "Q4_1 GGUF, dequantised to bfloat16" in card and "HuggingFaceTB/SmolLM2-135M-Instruct" in card
