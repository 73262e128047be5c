"""``mrtpo train``: MRTPO (or a baseline) on a task, from YAML configs and flags, to a run folder.

    mrtpo train --task sql --method mrtpo --config configs/cpu-demo.yaml
    mrtpo train --task toolcall --method gdpo --max-steps 50 learning_rate=2e-6 temperature=0.9
    mrtpo train --resume runs/sql-mrtpo-20260101-120000          # continue that run

Settings come in layers, later ones winning: the built-in defaults (:data:`TRAIN_DEFAULTS`,
with CPU-safe overrides when no GPU is present), the saved ``config.yaml`` of a resumed run,
each ``--config`` file in order, the named flags, then ``key=value`` overrides. Every key is
either a run-level setting (:class:`RunSettings`) or a field of
:class:`~mrtpo.trainer.MRTPOConfig` (TRL's GRPOConfig plus the credit knobs); an unknown key is
an error that suggests the closest valid one. ``mrtpo train --list-keys`` prints them all.

The run folder (``--output-dir``, default ``runs/<task>-<method>-<time>``) holds
``config.yaml`` (every setting used, loadable with ``--config``), ``metrics.jsonl`` (one line per
logged step), ``credit_samples.jsonl`` (token weights of a few completions per step),
``checkpoint-N/`` folders (HF Trainer checkpoints, resumable) and, at the end, ``report.html`` /
``report.md`` / ``curves.png`` (:func:`mrtpo.report.make_report`).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as _dt
import difflib
import importlib.util
import itertools
import json
import math
import os
import sys
import time
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# The model hub is unreachable here; nothing may wait on a network timeout.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

import yaml

TASK_NAMES = ("toolcall", "instructions", "sql")
CONFIG_NAME = "config.yaml"
KEYS_HINT = "the full list: `mrtpo train --list-keys` (or docs/training.md)"

__all__ = [
    "CONFIG_NAME",
    "TRAIN_DEFAULTS",
    "ConfigError",
    "RunConfig",
    "RunSettings",
    "build_trainer",
    "find_checkpoint",
    "load_config",
    "main",
    "valid_keys",
]


class ConfigError(ValueError):
    """A mistake in the run's settings (unknown key, bad value, missing checkpoint); says the fix."""


# --------------------------------------------------------------------------------------------
# Settings.
# --------------------------------------------------------------------------------------------
@dataclass
class RunSettings:
    """Run-level settings: what to train on and how to build the model (not trainer fields)."""

    task: str = "sql"
    """task to train on: toolcall, instructions or sql"""
    model: str = "qwen2.5-coder-0.5b"
    """preset name, local model folder, .gguf file or hub id (anything mrtpo.models.load_policy takes)"""
    dtype: str = "float32"
    """dtype the weights are loaded in: float32 (trainable; bf16=true then means mixed precision) or bfloat16"""
    train_size: int | None = None
    """train examples used: the first N of the task's train split (None: all of it)"""
    eval_size: int = 0
    """held-out examples TRL scores when eval_strategy is set (0: no eval dataset)"""
    task_args: dict[str, Any] = field(default_factory=dict)
    """keyword arguments of the task's constructor, e.g. sql: {sample_rows: 0} for a DDL-only schema"""
    lora_r: int = 0
    """LoRA rank (peft); 0: full fine-tuning"""
    lora_alpha: float | None = None
    """LoRA scaling alpha (None: 2 x lora_r)"""
    lora_dropout: float = 0.0
    """dropout on the LoRA branch"""
    lora_target_modules: list[str] | str = "all-linear"
    """modules that get adapters: "all-linear" or a list of module names such as [q_proj, v_proj]"""
    lora_learning_rate: float = 2e-5
    """learning_rate used with LoRA when learning_rate is not set explicitly"""
    report: bool = True
    """write report.html / report.md / curves.png into the run folder when training ends"""
    report_samples: int = 2
    """completions of the first and of the last step shown in the report's token-credit view"""


#: Trainer settings that differ from MRTPOConfig's (TRL's) defaults: small, CPU-sized runs.
TRAIN_DEFAULTS: dict[str, Any] = {
    "method": "mrtpo",
    "num_generations": 4,
    "per_device_train_batch_size": 4,  # one prompt x 4 completions per step on one process
    "max_completion_length": 128,
    "learning_rate": 2e-6,
    "max_steps": 20,
    "temperature": 1.0,
    "logging_steps": 1,
    "save_strategy": "steps",
    "save_steps": 50,
    "report_to": "none",
    "activation_checkpointing": False,
    "seed": 42,
}


def _cpu_defaults() -> dict[str, Any]:
    """On a machine without CUDA: train on the CPU in fp32 (TRL defaults to bf16 + checkpointing)."""
    import torch

    if torch.cuda.is_available():
        return {}
    return {"use_cpu": True, "bf16": False, "activation_checkpointing": False}


#: Deprecated transformers names accepted in configs and stored under the new name.
_ALIASES = {"gradient_checkpointing": "activation_checkpointing",
            "gradient_checkpointing_kwargs": "activation_checkpointing_kwargs"}


#: TRL refuses both at once: setting one in a later layer replaces the other from earlier layers.
_EXCLUSIVE = {"steps_per_generation": "generation_batch_size", "generation_batch_size": "steps_per_generation"}


def _field_docs() -> dict[str, str]:
    """RunSettings field -> its one-line doc (the string literal under each field)."""
    import ast
    import inspect

    tree = ast.parse(inspect.getsource(RunSettings))
    docs, body = {}, tree.body[0].body
    for node, nxt in itertools.pairwise(body):
        if isinstance(node, ast.AnnAssign) and isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant):
            docs[node.target.id] = str(nxt.value.value)
    return docs


def _trainer_fields() -> dict[str, dataclasses.Field]:
    from mrtpo.trainer import MRTPOConfig

    return {f.name: f for f in dataclasses.fields(MRTPOConfig) if f.init}


def valid_keys() -> dict[str, str]:
    """Every config key → one line of help (run settings first, then MRTPOConfig fields)."""
    keys = dict(_field_docs())
    for name, f in _trainer_fields().items():
        keys[name] = " ".join(str(f.metadata.get("help", "")).split())
    return keys


# --------------------------------------------------------------------------------------------
# Value coercion (YAML 1.1 reads 1e-6 as a string; key=value overrides arrive as text).
# --------------------------------------------------------------------------------------------
def _type_hints(cls) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _is_union(tp) -> bool:
    return typing.get_origin(tp) in (typing.Union, types.UnionType)


def _coerce(key: str, value: Any, tp: Any, source: str) -> Any:
    """``value`` as type ``tp`` where it is a plain scalar type; other types pass through."""
    options = typing.get_args(tp) if _is_union(tp) else (tp,)
    if value is None:
        if type(None) in options or tp is Any:
            return None
        if options and all(o in (int, float, bool) for o in options):
            raise ConfigError(f"{key} (from {source}) cannot be null; give a {options[0].__name__}")
        return None
    scalar = [o for o in options if o in (bool, int, float)]
    if not scalar or len(scalar) != len([o for o in options if o is not type(None)]):
        return value  # str, lists, dicts, enums, mixed unions: validated by the config itself
    if bool in scalar:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false", "yes", "no", "1", "0"):
            return value.lower() in ("true", "yes", "1")
        raise ConfigError(f"{key} (from {source}) must be true or false, got {value!r}")
    if int in scalar and float not in scalar:
        if isinstance(value, bool):
            raise ConfigError(f"{key} (from {source}) must be an integer, got {value!r}")
        if isinstance(value, int):
            return value
        try:
            as_float = float(value)
        except (TypeError, ValueError):
            raise ConfigError(f"{key} (from {source}) must be an integer, got {value!r}") from None
        if not as_float.is_integer():
            raise ConfigError(f"{key} (from {source}) must be an integer, got {value!r}")
        return int(as_float)
    if isinstance(value, bool):
        raise ConfigError(f"{key} (from {source}) must be a number, got {value!r}")
    try:
        return float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{key} (from {source}) must be a number, got {value!r}") from None


# --------------------------------------------------------------------------------------------
# Loading and merging layers.
# --------------------------------------------------------------------------------------------
@dataclass
class RunConfig:
    """A resolved run: the run settings, the trainer config, and which keys were set explicitly."""

    run: RunSettings
    args: Any  # MRTPOConfig
    explicit: dict[str, str] = field(default_factory=dict)  # key -> where it was set

    def to_flat(self) -> dict[str, Any]:
        """Every setting as one flat mapping, as ``config.yaml`` stores it (round-trips via --config)."""
        out = dataclasses.asdict(self.run)
        trainer = self.args.to_dict()
        # Derived pair: TRL refuses both at once; keep the one that was set (default: steps).
        derived = "steps_per_generation" if "generation_batch_size" in self.explicit else "generation_batch_size"
        for key in list(trainer):
            if key == derived or key in _ALIASES or key.endswith("_token"):
                trainer.pop(key)
        out.update(trainer)
        return out


def _read_yaml(path: str | os.PathLike) -> dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file {path} does not exist")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {path} is not valid YAML: {exc}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must be a mapping of key: value lines, got {type(data).__name__}")
    return data


def parse_overrides(items: list[str]) -> dict[str, Any]:
    """``["lr=1e-5", "task_args={sample_rows: 0}"]`` → dict; values parsed as YAML."""
    out = {}
    for item in items:
        key, sep, text = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"override {item!r} is not of the form key=value")
        try:
            out[key.strip()] = yaml.safe_load(text) if text.strip() else ""
        except yaml.YAMLError as exc:
            raise ConfigError(f"override {item!r}: value is not valid YAML: {exc}") from None
    return out


def _check_keys(layer: dict[str, Any], source: str, known: dict[str, str]) -> dict[str, Any]:
    """Reject unknown keys (with the closest valid one) and map deprecated aliases."""
    out = {}
    for key, value in layer.items():
        if not isinstance(key, str):
            raise ConfigError(f"config key {key!r} in {source} is not a string")
        if key in _ALIASES:
            if _ALIASES[key] in layer:
                continue  # the new name is there too and wins
            key = _ALIASES[key]
        if key not in known:
            close = difflib.get_close_matches(key, list(known), n=1, cutoff=0.6)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ConfigError(f"unknown config key {key!r} in {source}{hint}. Valid keys are the run settings "
                              f"and the MRTPOConfig fields; {KEYS_HINT}")
        out[key] = value
    return out


def _check_report_to(value: Any) -> None:
    """report_to: none / all / a list of integrations; the optional ones must be installed."""
    names = value if isinstance(value, (list, tuple)) else [v.strip() for v in str(value).split(",")]
    packages = {"tensorboard": "tensorboard", "wandb": "wandb", "trackio": "trackio"}
    for name in names:
        if name in ("none", "all", "", None):
            continue
        pkg = packages.get(name)
        if pkg is None:
            continue  # another transformers integration: transformers checks it
        if name == "tensorboard":
            ok = importlib.util.find_spec("tensorboard") is not None or importlib.util.find_spec("tensorboardX") is not None
        else:
            ok = importlib.util.find_spec(pkg) is not None
        if not ok:
            raise ConfigError(f"report_to={name!r} needs the {pkg!r} package, which is not installed: "
                              f"`pip install {pkg}` (or `pip install mrtpo[{pkg}]`), or use report_to=none")


def load_config(
    config_files: list[str | os.PathLike] | None = None,
    overrides: dict[str, Any] | None = None,
    *,
    base: dict[str, Any] | None = None,
    base_source: str = "saved config",
) -> RunConfig:
    """Resolve defaults < ``base`` < each config file < ``overrides`` into a :class:`RunConfig`.

    Raises :class:`ConfigError` for unknown keys and badly typed values, and passes
    MRTPOConfig's own validation errors on as ConfigError.
    """
    from mrtpo.trainer import MRTPOConfig

    known = valid_keys()
    layers: list[tuple[str, dict[str, Any]]] = []
    if base:
        layers.append((base_source, base))
    for path in config_files or []:
        layers.append((str(path), _read_yaml(path)))
    if overrides:
        layers.append(("command line", overrides))

    merged: dict[str, Any] = {**TRAIN_DEFAULTS, **_cpu_defaults()}
    explicit: dict[str, str] = {}
    run_hints, trainer_hints = _type_hints(RunSettings), _type_hints(MRTPOConfig)
    run_names = {f.name for f in dataclasses.fields(RunSettings)}
    for source, layer in layers:
        checked = _check_keys(layer, source, known)
        for key, value in checked.items():
            other = _EXCLUSIVE.get(key)
            if other is not None and other not in checked:  # a later layer's choice replaces the pair
                merged.pop(other, None)
                explicit.pop(other, None)
            tp = run_hints[key] if key in run_names else trainer_hints.get(key, Any)
            merged[key] = _coerce(key, value, tp, source)
            explicit[key] = source

    run_kwargs = {k: v for k, v in merged.items() if k in run_names}
    trainer_kwargs = {k: v for k, v in merged.items() if k not in run_names}
    run = RunSettings(**run_kwargs)
    _validate_run(run)
    if run.lora_r > 0 and "learning_rate" not in explicit:
        trainer_kwargs["learning_rate"] = run.lora_learning_rate
    if trainer_kwargs.get("output_dir") in (None, ""):
        stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
        trainer_kwargs["output_dir"] = str(Path("runs") / f"{run.task}-{trainer_kwargs.get('method', 'mrtpo')}-{stamp}")
    if "report_to" in trainer_kwargs:
        _check_report_to(trainer_kwargs["report_to"])
    if "steps_per_generation" in explicit and "generation_batch_size" in explicit:
        raise ConfigError("set either steps_per_generation or generation_batch_size, not both "
                          f"(steps_per_generation from {explicit['steps_per_generation']}, "
                          f"generation_batch_size from {explicit['generation_batch_size']})")
    if "generation_batch_size" in explicit:
        trainer_kwargs.pop("steps_per_generation", None)
    elif "steps_per_generation" not in explicit:
        trainer_kwargs.pop("generation_batch_size", None)
    try:
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            args = MRTPOConfig(**trainer_kwargs)
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"invalid trainer settings: {exc}") from None
    return RunConfig(run=run, args=args, explicit=explicit)


def _validate_run(run: RunSettings) -> None:
    if run.task not in TASK_NAMES:
        close = difflib.get_close_matches(run.task, TASK_NAMES, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ConfigError(f"unknown task {run.task!r}{hint}; choose one of {', '.join(TASK_NAMES)}")
    if run.dtype not in ("float32", "bfloat16", "float16"):
        raise ConfigError(f"dtype must be float32, bfloat16 or float16, got {run.dtype!r}")
    if run.train_size is not None and run.train_size < 1:
        raise ConfigError(f"train_size must be >= 1 or null (all), got {run.train_size}")
    if run.eval_size < 0:
        raise ConfigError(f"eval_size must be >= 0, got {run.eval_size}")
    if not isinstance(run.task_args, dict):
        raise ConfigError(f"task_args must be a mapping (e.g. {{sample_rows: 0}}), got {run.task_args!r}")
    if run.lora_r < 0:
        raise ConfigError(f"lora_r must be >= 0 (0: full fine-tuning), got {run.lora_r}")
    if run.report_samples < 0:
        raise ConfigError(f"report_samples must be >= 0, got {run.report_samples}")


def write_config(config: RunConfig, path: str | os.PathLike) -> Path:
    """Write ``config.yaml``: run settings, then every MRTPOConfig field, as used."""
    path = Path(path)
    flat = config.to_flat()
    run_names = [f.name for f in dataclasses.fields(RunSettings)]
    run_part = {k: flat[k] for k in run_names}
    trainer_part = {k: v for k, v in flat.items() if k not in run_part}
    text = ("# mrtpo train: every setting this run used. Re-run with `mrtpo train --config <this file>`.\n"
            "# Run-level settings:\n" + yaml.safe_dump(run_part, sort_keys=False)
            + "# MRTPOConfig (TRL GRPOConfig + credit assignment) fields:\n"
            + yaml.safe_dump(trainer_part, sort_keys=False))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


# --------------------------------------------------------------------------------------------
# Checkpoints.
# --------------------------------------------------------------------------------------------
def find_checkpoint(where: str | os.PathLike) -> Path:
    """A checkpoint folder itself, or the latest ``checkpoint-N`` inside a run folder."""
    from transformers.trainer_utils import get_last_checkpoint

    path = Path(where)
    if (path / "trainer_state.json").is_file():
        return path
    if not path.is_dir():
        raise ConfigError(f"cannot resume from {path}: no such folder")
    last = get_last_checkpoint(str(path))
    if last is None or not (Path(last) / "trainer_state.json").is_file():
        raise ConfigError(f"cannot resume: {path} holds no checkpoint-N folder with a trainer_state.json "
                          "(checkpoints are written every save_steps steps and at the end)")
    return Path(last)


def _checkpoint_step(checkpoint: Path) -> int:
    return int(json.loads((checkpoint / "trainer_state.json").read_text())["global_step"])


def _trim_credit_samples(output_dir: Path, step: int) -> None:
    """Drop credit samples an interrupted run wrote after the checkpoint we resume from.

    A sample is tagged with the global step *before* its update, so step ``s`` belongs to the
    update that produced checkpoint ``s + 1``: keep those with ``step < checkpoint step``.
    """
    path = output_dir / "credit_samples.jsonl"
    if not path.exists():
        return
    kept = [line for line in path.read_text().splitlines() if line.strip() and json.loads(line).get("step", 0) < step]
    path.write_text("".join(line + "\n" for line in kept))


# --------------------------------------------------------------------------------------------
# Building the trainer.
# --------------------------------------------------------------------------------------------
class PromptMismatchError(ConfigError):
    """TRL would render the prompts differently from the task (the replays would be wrong)."""


_DTYPES = {"float32": "float32", "bfloat16": "bfloat16", "float16": "float16"}


def _progress_callback(reward_names: list[str]):
    from transformers.trainer_callback import ProgressCallback

    class RewardProgress(ProgressCallback):
        """The HF progress bar, with the reward in its postfix and one compact line per logged step."""

        def on_log(self, args, state, control, logs=None, **kwargs):
            if not state.is_world_process_zero or self.training_bar is None or not logs:
                return
            if "train_runtime" in logs:
                self.training_bar.write(f"done: {state.global_step} steps in {logs['train_runtime']:.0f} s")
                return
            if "reward" not in logs and "loss" not in logs:
                self.training_bar.write(str({k: v for k, v in logs.items() if isinstance(v, (int, float, str))}))
                return
            self.training_bar.set_postfix(reward=f"{logs.get('reward', float('nan')):.3f}",
                                          loss=f"{logs.get('loss', float('nan')):.3g}")
            self.training_bar.write(format_step(state.global_step, state.max_steps, logs, reward_names))

    return RewardProgress()


def format_step(step: int, max_steps: int, logs: dict[str, Any], reward_names: list[str]) -> str:
    """One line per logged step: total reward, each reward's mean, length, loss, time split."""
    def num(key, fmt):
        v = logs.get(key)
        return fmt.format(v) if isinstance(v, (int, float)) and math.isfinite(v) else "n/a"

    parts = [f"step {step}/{max_steps}", f"reward {num('reward', '{:.3f}')} ±{num('reward_std', '{:.2f}')}"]
    per = "  ".join(f"{n} {num(f'rewards/{n}/mean', '{:.2f}')}" for n in reward_names)
    if per:
        parts.append(per)
    parts.append(f"len {num('completions/mean_length', '{:.0f}')}")
    parts.append(f"loss {num('loss', '{:+.3g}')}")
    times = [f"{k} {logs[f'time/{k}']:.1f}s" for k in ("generation", "scoring", "replay", "update")
             if isinstance(logs.get(f"time/{k}"), (int, float))]
    if times:
        parts.append(" ".join(times))
    return " | ".join(parts)


def build_trainer(config: RunConfig):
    """The :class:`~mrtpo.trainer.MRTPOTrainer` for ``config``: task data, verifier rewards, model.

    Checks that TRL renders the first prompt exactly as the task does (the evidence replays and
    ``mrtpo eval`` use the task's rendering), and puts the reward into the progress bar.
    """
    import torch
    from datasets import Dataset
    from transformers import set_seed
    from transformers.trainer_callback import ProgressCallback

    from mrtpo.models import load_policy
    from mrtpo.replay import prompt_renderer
    from mrtpo.rewards import VerifierReward
    from mrtpo.tasks import get_task
    from mrtpo.trainer import MRTPOTrainer

    run, args = config.run, config.args
    try:
        task = get_task(run.task, **run.task_args)
    except TypeError as exc:
        raise ConfigError(f"task_args {run.task_args!r} do not fit task {run.task!r}: {exc}") from None
    train = task.load("train", run.train_size)
    prompts_per_step = args.generation_batch_size // args.num_generations
    if len(train) < prompts_per_step:
        raise ConfigError(f"train_size gives {len(train)} train examples, fewer than the {prompts_per_step} prompts "
                          "one generation batch needs (generation_batch_size / num_generations)")
    evals = task.load("eval", run.eval_size) if run.eval_size else []
    examples = {}
    for ex in [*train, *evals]:
        if ex.id in examples:
            raise ValueError(f"task {run.task!r} has two examples with id {ex.id!r}; ids must be unique")
        examples[ex.id] = ex
    rewards = [VerifierReward(v, examples) for v in task.verifiers()]

    def rows(exs):
        return Dataset.from_list([{"prompt": ex.messages, "example_id": ex.id} for ex in exs])

    model, tokenizer = load_policy(run.model, dtype=getattr(torch, _DTYPES[run.dtype]))
    peft_config = None
    if run.lora_r > 0:
        from peft import LoraConfig

        peft_config = LoraConfig(
            r=run.lora_r, lora_alpha=run.lora_alpha if run.lora_alpha is not None else 2 * run.lora_r,
            lora_dropout=run.lora_dropout, target_modules=run.lora_target_modules, task_type="CAUSAL_LM",
        )
    set_seed(args.seed)
    train_ds = rows(train)
    trainer = MRTPOTrainer(
        model=model, processing_class=tokenizer, reward_funcs=rewards, args=args,
        train_dataset=train_ds, eval_dataset=rows(evals) if evals else None, peft_config=peft_config,
    )
    ours = prompt_renderer(task, tokenizer)(train[0])
    theirs = trainer._render(train_ds[0]["prompt"])
    if ours != theirs:
        at = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), min(len(ours), len(theirs)))
        raise PromptMismatchError(
            f"TRL renders the prompt of {train[0].id!r} differently from task {run.task!r} (first difference at "
            f"character {at}: task {ours[at:at + 60]!r} vs TRL {theirs[at:at + 60]!r}). The trainer uses the "
            "tokenizer's plain chat template without tools=; the task must render its prompts the same way."
        )
    if any(isinstance(cb, ProgressCallback) for cb in trainer.callback_handler.callbacks):
        trainer.remove_callback(ProgressCallback)
        trainer.add_callback(_progress_callback(trainer.reward_func_names))
    trainer.mrtpo_task = task
    trainer.mrtpo_examples = examples
    return trainer


# --------------------------------------------------------------------------------------------
# The command.
# --------------------------------------------------------------------------------------------
def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="mrtpo train",
        description="Train a policy with MRTPO or a baseline method on a task (see docs/training.md).",
        epilog="Any config key can be given as key=value after the flags, e.g. `temperature=0.9 lam=0.5`. "
               "Precedence: defaults < saved config (resume) < --config files < flags < key=value.",
    )
    p.add_argument("--task", choices=TASK_NAMES, help="task to train on (default sql)")
    p.add_argument("--method", help="credit method: grpo, gdpo, mrtpo, contrast, entropy (default mrtpo)")
    p.add_argument("--config", action="append", default=[], metavar="YAML", help="config file (repeatable; later wins)")
    p.add_argument("--model", help="preset, model folder, .gguf file or hub id (default qwen2.5-coder-0.5b)")
    p.add_argument("--output-dir", help="run folder (default runs/<task>-<method>-<time>)")
    p.add_argument("--max-steps", type=int, help="optimizer steps")
    p.add_argument("--seed", type=int, help="seed of data order, sampling and initialisation")
    p.add_argument("--learning-rate", type=float, help="learning rate")
    p.add_argument("--lora-r", type=int, help="LoRA rank (0: full fine-tuning)")
    p.add_argument("--report-to", help="none, tensorboard, wandb, trackio (comma-separated for several)")
    p.add_argument("--resume", nargs="?", const="", metavar="CHECKPOINT",
                   help="continue a run: a checkpoint folder, a run folder (its latest checkpoint), or nothing "
                        "(the latest checkpoint in --output-dir)")
    p.add_argument("--list-keys", action="store_true", help="print every config key with its help and exit")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="any config key")
    return p


def _print_keys() -> None:
    keys = valid_keys()
    run_names = [f.name for f in dataclasses.fields(RunSettings)]
    width = max(map(len, keys))
    print("Run settings:")
    for k in run_names:
        print(f"  {k:<{width}}  {keys[k]}")
    print("\nMRTPOConfig fields (TRL GRPOConfig / transformers TrainingArguments + credit assignment):")
    for k, v in keys.items():
        if k not in run_names:
            print(f"  {k:<{width}}  {v[:110]}")


def resolve_from_argv(ns: argparse.Namespace) -> tuple[RunConfig, Path | None]:
    """The run's config and, when resuming, the checkpoint to resume from."""
    flags = {"task": ns.task, "method": ns.method, "model": ns.model, "output_dir": ns.output_dir,
             "max_steps": ns.max_steps, "seed": ns.seed, "learning_rate": ns.learning_rate,
             "lora_r": ns.lora_r, "report_to": ns.report_to}
    overrides = {k: v for k, v in flags.items() if v is not None}
    overrides.update(parse_overrides(ns.overrides))
    checkpoint, base = None, None
    if ns.resume is not None:
        if ns.resume:
            checkpoint = find_checkpoint(ns.resume)
        else:
            out = overrides.get("output_dir")
            if out is None:
                for path in ns.config:
                    out = _read_yaml(path).get("output_dir", out)
            if not out:
                raise ConfigError("--resume without a path needs the run folder: give --output-dir (or --resume <folder>)")
            checkpoint = find_checkpoint(out)
        run_dir = checkpoint.parent
        given = overrides.get("output_dir")
        if given is not None and Path(given).resolve() != run_dir.resolve():
            raise ConfigError(f"--resume {checkpoint} continues the run in {run_dir}, but --output-dir is {given}; "
                              "drop --output-dir (resuming keeps the run's folder)")
        overrides["output_dir"] = str(run_dir)
        saved = run_dir / CONFIG_NAME
        if saved.is_file():
            base = _read_yaml(saved)
            base.pop("resume_from_checkpoint", None)
    config = load_config(ns.config, overrides, base=base, base_source=str(run_dir / CONFIG_NAME) if base else "")
    if checkpoint is not None:
        config.args.resume_from_checkpoint = str(checkpoint)
    return config, checkpoint


def main(argv: list[str] | None = None) -> int:
    ns = _parser().parse_args(argv)
    if ns.list_keys:
        _print_keys()
        return 0
    try:
        config, checkpoint = resolve_from_argv(ns)
    except ConfigError as exc:
        print(f"mrtpo train: {exc}", file=sys.stderr)
        return 2
    run, args = config.run, config.args
    out = Path(args.output_dir)
    main_process = int(os.environ.get("RANK", "0")) == 0  # torchrun / accelerate launch: write files once
    if main_process:
        out.mkdir(parents=True, exist_ok=True)
        write_config(config, out / CONFIG_NAME)
    t0 = time.perf_counter()
    mode = f"LoRA r={run.lora_r}" if run.lora_r else "full fine-tuning"
    if main_process:
        print(f"mrtpo train · task {run.task} · method {args.method} · model {run.model} ({mode}) · "
              f"{args.max_steps} steps × {args.generation_batch_size // args.num_generations} prompts × "
              f"{args.num_generations} completions · output {out}", flush=True)
    from mrtpo.models import ModelLoadError

    try:
        trainer = build_trainer(config)
    except (ConfigError, ModelLoadError) as exc:
        print(f"mrtpo train: {exc}", file=sys.stderr)
        return 2
    main_process = trainer.accelerator.is_main_process
    if checkpoint is not None and main_process:
        step = _checkpoint_step(checkpoint)
        _trim_credit_samples(out, step)
        print(f"resuming from {checkpoint} (step {step})", flush=True)
    elif main_process:
        if any(out.glob("checkpoint-*")):
            print(f"note: {out} holds checkpoints of an earlier run; starting over in it (use --resume to continue "
                  "that run instead)", flush=True)
        _trim_credit_samples(out, 0)  # a fresh run: metrics.jsonl restarts the same way (MetricsJSONL)
    trainer.accelerator.wait_for_everyone()
    if main_process:
        print(f"ready in {time.perf_counter() - t0:.0f} s: {len(trainer.train_dataset)} train prompts, rewards "
              f"{', '.join(trainer.reward_func_names)}", flush=True)
    trainer.train(resume_from_checkpoint=str(checkpoint) if checkpoint is not None else None)
    if not main_process:
        return 0
    if run.report:
        from mrtpo.report.build import make_report

        paths = make_report(out, samples=run.report_samples)
        print("report: " + ", ".join(str(p) for p in paths.values()))
    print(f"total {time.perf_counter() - t0:.0f} s · run folder {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
