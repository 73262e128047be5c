"""Building a run's trainer from a resolved config: its task data, its model, its trainer.

:func:`build_trainer` is the library's entry point for a run (``mrtpo train`` calls it after its
checks; a script can call it with :func:`mrtpo.config.load_config`'s result), :func:`load_task_data`
loads and checks the task's examples before any model loads, :func:`load_model` the policy (a preset,
folder or hub id; a warm start where the run asks for one).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
from collections.abc import Mapping, Sequence
from typing import Any

# Offline only where the user or the machine says so: main() asks mrtpo.hub before anything loads.
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

from mrtpo.config import (  # noqa: E402
    ConfigError,
    RunConfig,
)
from mrtpo.task_base import implements, task_hook  # noqa: E402
from mrtpo.tasks import is_task_file  # noqa: E402
from mrtpo.tasks.lazy_rows import DuplicateIdError, examples_by_id  # noqa: E402
from mrtpo.validation import SettingError  # noqa: E402

logger = logging.getLogger("mrtpo.train")


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
            self.training_bar.set_postfix(
                reward=f"{logs.get('reward', float('nan')):.3f}", loss=f"{logs.get('loss', float('nan')):.3g}"
            )
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
    times = [
        f"{k} {logs[f'time/{k}']:.1f}s"
        for k in ("generation", "scoring", "replay", "update")
        if isinstance(logs.get(f"time/{k}"), (int, float))
    ]
    if times:
        parts.append(" ".join(times))
    return " | ".join(parts)


@dataclasses.dataclass
class TaskData:
    """A run's task, its train and eval examples, and every example by id (what the rewards look up). A task
    file's are lazy (:mod:`mrtpo.tasks.lazy_rows`): sequences and a mapping whose examples are built on access."""

    task: Any
    train: Sequence
    evals: Sequence
    examples: Mapping


def load_task_data(config: RunConfig) -> TaskData:
    """The task and its examples for ``config``; a ConfigError (before any model loads) for task
    arguments that do not fit, an empty train split, or fewer prompts than one generation batch needs."""
    from mrtpo.tasks import get_task

    run, args = config.run, config.args
    try:
        task = get_task(run.task, **run.task_args)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"task_args {run.task_args!r} do not fit task {run.task!r}: {exc}") from None
    names = [v.name for v in task.verifiers()]
    for key in ("reward_weights", "reward_lam"):  # TRL checks reward_weights only once the model has loaded
        given = getattr(args, key)
        if given is not None and len(given) != len(names):
            raise ConfigError(
                f"{key} has {len(given)} entries for the {len(names)} rewards of task {run.task!r} "
                f"({', '.join(names)}): give one per reward, in that order"
            )
    if run.model == "gym":
        if not implements(task, "policy"):
            raise ConfigError(
                f"model: gym is the credit gym's tiny policy; task {run.task!r} has none (use a gym-* task)"
            )
        from mrtpo.gym.policy import policy_spec

        try:
            policy_spec(task)
        except TypeError as exc:
            raise ConfigError(f"task_args policy {task.settings.policy!r} does not fit the gym policy: {exc}") from None
    train = task.load("train", run.train_size)
    if not train:
        raise ConfigError(f"task {run.task!r} has no train examples (task_args {run.task_args!r}); nothing to train on")
    prompts_per_step = args.generation_batch_size // args.num_generations
    if len(train) < prompts_per_step:
        raise ConfigError(
            f"task {run.task!r} gives {len(train)} train examples, fewer than the {prompts_per_step} "
            "prompts one generation batch needs (generation_batch_size / num_generations)"
        )
    evals = task.load("eval", run.eval_size) if run.eval_size else []
    try:  # a task file's own evidence (a built-in task's may sit in the rendered tools: the trainer checks those)
        task.check_evidence([train, evals]) if is_task_file(run.task) else None
    except SettingError as exc:
        raise ConfigError(str(exc)) from None
    try:  # a task file's: its ids as one sorted Arrow array, each example built when looked up
        examples = examples_by_id([train, evals])
    except DuplicateIdError as exc:
        raise ConfigError(f"task {run.task!r} has two examples with id {exc.id!r}; ids must be unique") from None
    return TaskData(task, train, evals, examples)


def load_model(config: RunConfig, task: Any):
    """``(model, tokenizer, warm start folder or None)``: the policy a run of ``config`` starts from, loaded
    under its ``model_init_kwargs`` (:mod:`mrtpo.model_init`)."""
    import torch

    from mrtpo.model_init import apply_model_init, hand_to_trl, load_with_init, run_model_init

    run, init = config.run, run_model_init(config)
    hand_to_trl(config.args, init)
    dtype = getattr(torch, _DTYPES[run.dtype if init.dtype == "auto" else init.dtype])
    if run.model == "gym":  # a gym task's warm-started tiny policy, built and cached on first use
        model, tokenizer = task.policy(dtype)
        return apply_model_init(model, init), tokenizer, None
    from mrtpo.warm_start import load_warm_start, resolve_for_run

    warm, _ = resolve_for_run(run.warm_start, run.task, run.model)
    if warm is not None:  # e.g. toolcall: a short LoRA SFT so the format reward has spread (built once)
        model, tokenizer, folder = load_warm_start(run.model, warm, task, dtype=dtype)
        logger.info("warm start: starting from %s", folder)
        return apply_model_init(model, init), tokenizer, folder
    return (*load_with_init(run.model, init), None)


def trainer_dataset(task: Any, examples: Sequence):
    """The trainer's ``datasets.Dataset`` of ``examples``: the task's :meth:`~mrtpo.task_base.Task.trainer_rows`
    (rows, or a task file's dataset itself)."""
    from datasets import Dataset

    rows = task_hook(task, "trainer_rows")(examples)
    return rows if isinstance(rows, Dataset) else Dataset.from_list(rows)


def build_trainer(config: RunConfig, data: TaskData | None = None):
    """The :class:`~mrtpo.trainer.MRTPOTrainer` for ``config``: task data (``data``, else loaded),
    verifier rewards, model.

    Checks that TRL renders the first prompt exactly as the task does (the evidence replays and
    ``mrtpo eval`` use the task's rendering), and puts the reward into the progress bar.
    """
    from transformers import set_seed
    from transformers.trainer_callback import ProgressCallback

    from mrtpo.counterfactual import prompt_renderer
    from mrtpo.model_names import base_model_names, base_weights_note
    from mrtpo.trainer import MRTPOTrainer

    run, args = config.run, config.args
    data = data if data is not None else load_task_data(config)
    task, train, evals, examples = data.task, data.train, data.evals, data.examples
    rewards = task_hook(task, "reward_funcs")(examples)  # a task file's: its own functions, called as TRL does
    model, tokenizer, warm_folder = load_model(config, task)
    peft_config = None
    if run.lora_r > 0:
        from peft import LoraConfig

        peft_config = LoraConfig(
            r=run.lora_r,
            lora_alpha=run.lora_alpha if run.lora_alpha is not None else 2 * run.lora_r,
            lora_dropout=run.lora_dropout,
            target_modules=run.lora_target_modules,
            task_type="CAUSAL_LM",
        )
    set_seed(args.seed)
    train_ds = trainer_dataset(task, train)
    trainer = MRTPOTrainer(
        model=model,
        processing_class=tokenizer,
        reward_funcs=rewards,
        args=args,
        train_dataset=train_ds,
        eval_dataset=trainer_dataset(task, evals) if evals else None,
        peft_config=peft_config,
    )
    card_name, adapter_name = base_model_names(run.model, run.task)
    trainer.name_base_model(
        card_name,
        None if warm_folder else adapter_name,  # a warm start's adapter: on its folder
        base_weights_note(run.model),
    )
    ours = prompt_renderer(task, tokenizer)(train[0])
    theirs = trainer._render(train_ds[0]["prompt"])
    if ours != theirs:
        at = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), min(len(ours), len(theirs)))
        raise PromptMismatchError(
            f"TRL renders the prompt of {train[0].id!r} differently from task {run.task!r} (first difference at "
            f"character {at}: task {ours[at : at + 60]!r} vs TRL {theirs[at : at + 60]!r}). The trainer uses the "
            "tokenizer's plain chat template without tools=; the task must render its prompts the same way."
        )
    if any(isinstance(cb, ProgressCallback) for cb in trainer.callback_handler.callbacks):
        trainer.remove_callback(ProgressCallback)
        trainer.add_callback(_progress_callback(trainer.reward_func_names))
    trainer.mrtpo_task = task
    trainer.mrtpo_examples = examples
    return trainer


__all__ = [
    "PromptMismatchError",
    "TaskData",
    "build_trainer",
    "format_step",
    "load_model",
    "load_task_data",
    "trainer_dataset",
]
