"""The settings of a training run: layers, aliases, validation, and the ``config.yaml`` of a run.

Settings come in layers, later ones winning: the built-in defaults (:data:`TRAIN_DEFAULTS`,
with CPU-safe overrides when no GPU is present, :func:`mrtpo.machine.cpu_run_defaults`), a base
(the saved ``config.yaml`` of a resumed run, a benchmark preset), each config file in order, then the
overrides (named flags and ``key=value``). Every key is either a run-level setting (:class:`RunSettings`) or a field of
:class:`~mrtpo.trainer.config.MRTPOConfig` (TRL's GRPOConfig plus the credit knobs); deprecated
transformers names are stored under their new name; an unknown key is an error that suggests the
closest valid one (:func:`valid_keys` lists them all).
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import importlib.util
import itertools
import os
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from mrtpo.tasks import TASK_NAMES, task_label, task_problem, task_ref, task_settings
from mrtpo.trl_names import (
    SCRIPT_KEYS,
    optional_dependency_problem,
    script_task,
    task_cache,
    translate,
    unknown_key_message,
)
from mrtpo.validation import SettingError, check_finite, check_trainer_numbers

CONFIG_NAME = "config.yaml"
KEYS_HINT = "the full list: `mrtpo train --list-keys` (or docs/training.md)"

__all__ = [
    "CONFIG_NAME",
    "TASK_NAMES",
    "TRAIN_DEFAULTS",
    "ConfigError",
    "RunConfig",
    "RunSettings",
    "load_config",
    "parse_overrides",
    "read_yaml",
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
    (
        "task to train on: a registered name (toolcall, instructions, sql, gym-*, a plugin's) or a task file path; "
        "a config file may hold a task: block (dataset, prompt, rewards; see mrtpo.tasks.from_config)"
    )
    model: str = "qwen2.5-coder-0.5b"
    """preset name, local model folder, .gguf file or hub id (anything mrtpo.models.load_policy takes)"""
    dtype: str = "float32"
    (
        "dtype the weights are loaded in: float32 (trainable; bf16=true then means mixed precision) "
        "or bfloat16 (unset on a CPU: chosen by its bf16 features)"
    )
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
    warm_start: Any = "auto"
    (
        "supervised LoRA warm start before RL (mrtpo.warm_start, built and cached on first use): auto (toolcall on "
        "the default model: the measured default dose), none, true, or a mapping of its settings such as "
        "{steps: 16, data: pairs.jsonl}"
    )
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


def _update_path_note(merged: dict[str, Any]) -> str:
    """How the update will run, and why: activation checkpointing excludes the shared-prompt update."""
    if merged.get("activation_checkpointing"):
        return (
            "activation checkpointing on (as configured), so the update runs every row whole "
            "(checkpointed layers drop the KV cache the shared-prompt update needs)"
        )
    if merged.get("shared_prompt_update", True) is False:
        return "activation checkpointing off; shared_prompt_update off, so the update runs every row whole"
    return "activation checkpointing off; the update runs each distinct prompt once (shared_prompt_update)"


#: Deprecated transformers names accepted in configs and stored under the new name.
_ALIASES = {
    "gradient_checkpointing": "activation_checkpointing",
    "gradient_checkpointing_kwargs": "activation_checkpointing_kwargs",
}


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
    from mrtpo.trainer.config import MRTPOConfig

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
        if (
            isinstance(value, bool)
            and not scalar
            and any(o is str or isinstance(o, type) and issubclass(o, str) for o in options)
        ):
            return "yes" if value else "no"  # YAML reads `save_strategy: no` as false; the setting means "no"
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
    notes: list[str] = field(default_factory=list)  # what was chosen for this machine, and why (printed by train)

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


def read_yaml(path: str | os.PathLike) -> dict[str, Any]:
    """A config file's mapping ({} for an empty file); ConfigError if missing or not a mapping."""
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
            hint = unknown_key_message(key, known)
            raise ConfigError(
                f"unknown config key {key!r} in {source}{hint}. Valid keys are the run settings "
                f"and the MRTPOConfig fields; {KEYS_HINT}"
            )
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
            from transformers.integrations.integration_utils import INTEGRATION_TO_CALLBACK

            if name not in INTEGRATION_TO_CALLBACK:
                raise ConfigError(
                    f"report_to={name!r} is not a logging integration; choose none, all or any of "
                    f"{', '.join(sorted(INTEGRATION_TO_CALLBACK))}"
                )
            continue  # another transformers integration: transformers checks its package
        if name == "tensorboard":
            ok = any(importlib.util.find_spec(p) is not None for p in ("tensorboard", "tensorboardX"))
        else:
            ok = importlib.util.find_spec(pkg) is not None
        if not ok:
            raise ConfigError(
                f"report_to={name!r} needs the {pkg!r} package, which is not installed: "
                f"`pip install {pkg}` (or `pip install mrtpo[{pkg}]`), or use report_to=none"
            )


def load_config(
    config_files: list[str | os.PathLike] | None = None,
    overrides: dict[str, Any] | None = None,
    *,
    base: dict[str, Any] | None = None,
    base_source: str = "saved config",
) -> RunConfig:
    """Resolve defaults < ``base`` < each config file < ``overrides`` into a :class:`RunConfig`.

    Raises :class:`ConfigError` for unknown keys, badly typed values and values out of range
    (checked here, before any model loads), and passes MRTPOConfig's own validation errors on as
    ConfigError.
    """
    from mrtpo.machine import choose_cpu_dtype, cpu_flags, cpu_run_defaults
    from mrtpo.trainer.config import MRTPOConfig

    known = valid_keys()
    layers: list[tuple[str, dict[str, Any]]] = []
    if base:
        layers.append((base_source, base))
    for path in config_files or []:
        layers.append((str(path), read_yaml(path)))
    if overrides:
        layers.append(("command line", overrides))

    merged: dict[str, Any] = {**TRAIN_DEFAULTS, **cpu_run_defaults()}
    explicit: dict[str, str] = {}
    run_hints, trainer_hints = _type_hints(RunSettings), _type_hints(MRTPOConfig)
    run_names = {f.name for f in dataclasses.fields(RunSettings)}
    script: dict[str, Any] = {}  # TRL script arguments that make a task (dataset_name, reward_funcs, ...)
    for source, layer in layers:
        layer = translate(layer, merged)  # TRL's names (mrtpo.trl_names) too
        script.update({key: layer.pop(key) for key in list(layer) if key in SCRIPT_KEYS})
        checked = _check_keys(layer, source, known)
        for key, value in checked.items():
            other = _EXCLUSIVE.get(key)
            if other is not None and other not in checked:  # a later layer's choice replaces the pair
                merged.pop(other, None)
                explicit.pop(other, None)
            tp = run_hints[key] if key in run_names else trainer_hints.get(key, Any)
            merged[key] = _coerce(key, task_ref(value, source) if key == "task" else value, tp, source)
            explicit[key] = source

    if script:
        if "task" in explicit:
            raise ConfigError(
                f"task (from {explicit['task']}) and TRL's {', '.join(script)} both name the task: give one of them"
            )
        try:
            merged["task"] = str(script_task(script, Path.cwd(), task_cache()))
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        explicit["task"] = "command line"
    notes = []
    if merged.get("use_cpu"):
        given = merged["dtype"] if "dtype" in explicit else None
        merged["dtype"], why = choose_cpu_dtype(cpu_flags(), int(merged.get("lora_r") or 0) > 0, given)
        notes.append(f"{why}; {_update_path_note(merged)}")
    run_kwargs = {k: v for k, v in merged.items() if k in run_names}
    trainer_kwargs = {k: v for k, v in merged.items() if k not in run_names}
    run = RunSettings(**run_kwargs)
    _validate_run(run)
    trainer_kwargs.update({k: v for k, v in task_settings(run.task).items() if k not in explicit})
    if run.model != "gym":
        from mrtpo.warm_start import WarmStartError, resolve_for_run

        try:
            _, why = resolve_for_run(run.warm_start, run.task, run.model)
        except WarmStartError as exc:
            raise ConfigError(str(exc)) from None
        if why:
            notes.append(why)
    if run.lora_r > 0 and "learning_rate" not in explicit:
        trainer_kwargs["learning_rate"] = run.lora_learning_rate
    if trainer_kwargs.get("output_dir") in (None, ""):
        stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
        method = trainer_kwargs.get("method", "mrtpo")
        trainer_kwargs["output_dir"] = str(Path("runs") / f"{task_label(run.task)}-{method}-{stamp}")
    if "report_to" in trainer_kwargs:
        _check_report_to(trainer_kwargs["report_to"])
    if "steps_per_generation" in explicit and "generation_batch_size" in explicit:
        raise ConfigError(
            "set either steps_per_generation or generation_batch_size, not both "
            f"(steps_per_generation from {explicit['steps_per_generation']}, "
            f"generation_batch_size from {explicit['generation_batch_size']})"
        )
    if "generation_batch_size" in explicit:
        trainer_kwargs.pop("steps_per_generation", None)
    elif "steps_per_generation" not in explicit:
        trainer_kwargs.pop("generation_batch_size", None)
    _validate_trainer(trainer_kwargs)
    if (problem := optional_dependency_problem(trainer_kwargs)) is not None:
        raise ConfigError(problem)
    if str(trainer_kwargs.get("eval_strategy", "no")) not in ("no", "IntervalStrategy.NO") and not run.eval_size:
        raise ConfigError(
            f"eval_strategy={trainer_kwargs['eval_strategy']!r} needs held-out prompts: set eval_size "
            "(e.g. eval_size=16), or eval_strategy=no"
        )
    try:
        args = MRTPOConfig(**trainer_kwargs)
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"invalid trainer settings: {exc}") from None
    return RunConfig(run=run, args=args, explicit=explicit, notes=notes)


def _validate_run(run: RunSettings) -> None:
    for f in dataclasses.fields(run):
        try:
            check_finite(f.name, getattr(run, f.name))
        except SettingError as exc:
            raise ConfigError(str(exc)) from None
    if (problem := task_problem(run.task)) is not None:  # the live registry: plugin tasks and task files count
        raise ConfigError(problem)
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
    if not 0.0 <= run.lora_dropout < 1.0:
        raise ConfigError(f"lora_dropout must be in [0, 1), got {run.lora_dropout}")
    if not run.lora_learning_rate > 0:
        raise ConfigError(f"lora_learning_rate must be > 0, got {run.lora_learning_rate}")
    if run.lora_alpha is not None and not run.lora_alpha > 0:
        raise ConfigError(f"lora_alpha must be > 0 or null (2 x lora_r), got {run.lora_alpha}")
    modules = run.lora_target_modules
    if not (isinstance(modules, str) or isinstance(modules, list) and all(isinstance(m, str) for m in modules)):
        raise ConfigError(f"lora_target_modules must be all-linear or a list of module names, got {modules!r}")


#: TRL 1.16's loss types (the trainer refuses the sequence-level ones with its own reason).
_LOSS_TYPES = ("dapo", "grpo", "bnpo", "dr_grpo", "cispo", "sapo", "vespo", "luspo")


def _validate_trainer(kwargs: dict[str, Any]) -> None:
    """Ranges TRL checks late or not at all (a batch size of 0 or a temperature of 0 fail only once
    training starts, as tracebacks), and the divisibility it needs: each generation batch holds whole
    prompt groups. ``kwargs``: the MRTPOConfig fields given (the others take their defaults)."""
    fields = _trainer_fields()

    def value(key):
        return kwargs[key] if key in kwargs else fields[key].default

    try:  # the one numeric check (mrtpo.validation), as MRTPOConfig runs it; here max_steps=-1 (epochs) is refused
        check_trainer_numbers(value, fields, epochs=False)
    except SettingError as exc:
        raise ConfigError(str(exc)) from None
    if value("loss_type") not in _LOSS_TYPES:
        raise ConfigError(f"unknown loss_type {value('loss_type')!r}; choose one of {', '.join(_LOSS_TYPES[:6])}")
    if kwargs.get("generation_batch_size") is None:  # else TRL checks it against num_generations itself
        steps = "steps_per_generation" if kwargs.get("steps_per_generation") else "gradient_accumulation_steps"
        size, per_step = value("per_device_train_batch_size"), value(steps)
        processes = int(os.environ.get("WORLD_SIZE", "1"))
        if (size * per_step * processes) % value("num_generations"):
            raise ConfigError(
                f"per_device_train_batch_size x {steps} x processes ({size} x {per_step} x {processes}) "
                f"must be divisible by num_generations ({value('num_generations')}): "
                "a generation batch holds whole prompt groups"
            )
