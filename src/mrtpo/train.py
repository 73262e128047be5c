"""``mrtpo train``: MRTPO (or a baseline) on a task, from YAML configs and flags, to a run folder.

    mrtpo train --task sql --method mrtpo --config configs/cpu-demo.yaml
    mrtpo train --task toolcall --method gdpo --max-steps 50 learning_rate=2e-6 temperature=0.9
    mrtpo train --resume runs/sql-mrtpo-20260101-120000          # continue that run

The settings (:mod:`mrtpo.config`) come in layers, later ones winning: the built-in defaults, the
saved ``config.yaml`` of a resumed run, each ``--config`` file in order, the named flags, then
``key=value`` overrides. ``mrtpo train --list-keys`` prints every key. This module builds the
trainer for a resolved config (:func:`build_trainer`) and runs it.

The run folder (``--output-dir``, default ``runs/<task>-<method>-<time>``) holds
``config.yaml`` (every setting used, loadable with ``--config``), ``metrics.jsonl`` (one line per
logged step), ``credit_samples.jsonl`` (token weights of a few completions per step),
``checkpoint-N/`` folders (HF Trainer checkpoints, resumable) and, at the end, ``model/`` (the final
model or LoRA adapter with its tokenizer and model card, :mod:`mrtpo.run_outputs`), ``README.md``
(TRL's model card) and ``report.html`` / ``report.md`` / ``curves.png`` (:func:`mrtpo.report.make_report`;
``mrtpo report RUN`` rebuilds them, ``mrtpo export RUN`` merges a LoRA adapter). A folder holds one run
(:mod:`mrtpo.run_folder`): a fresh run refuses a used folder unless ``--overwrite``, nothing is
written there until the settings, the task data and the model have loaded, and ``--resume`` takes
the newest complete checkpoint of that same run.
"""

from __future__ import annotations

import argparse
import dataclasses
import errno
import logging
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

# Offline only where the user or the machine says so: main() asks mrtpo.hub before anything loads.
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

from mrtpo.cli_help import HelpFormatter  # noqa: E402
from mrtpo.config import (  # noqa: E402
    CONFIG_NAME,
    TASK_NAMES,
    TRAIN_DEFAULTS,
    ConfigError,
    RunConfig,
    RunSettings,
    load_config,
    parse_overrides,
    read_yaml,
    valid_keys,
    write_config,
)
from mrtpo.run_folder import (  # noqa: E402
    ConfigStamp,
    check_fresh_folder,
    check_writable,
    checkpoint_step,
    clear_run,
    config_differences,
    find_checkpoint,
    run_files,
    saved_config,
)
from mrtpo.trainer.metrics import trim_jsonl  # noqa: E402

logger = logging.getLogger(__name__)

__all__ = ["PromptMismatchError", "TaskData", "build_trainer", "find_checkpoint", "load_model", "load_task_data",
           "main", "resolve_from_argv"]


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


@dataclasses.dataclass
class TaskData:
    """A run's task, its train and eval examples, and every example by id (what the rewards look up)."""

    task: Any
    train: list
    evals: list
    examples: dict


def load_task_data(config: RunConfig) -> TaskData:
    """The task and its examples for ``config``; a ConfigError (before any model loads) for task
    arguments that do not fit, an empty train split, or fewer prompts than one generation batch needs."""
    from mrtpo.tasks import get_task

    run, args = config.run, config.args
    try:
        task = get_task(run.task, **run.task_args)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"task_args {run.task_args!r} do not fit task {run.task!r}: {exc}") from None
    if run.model == "gym":
        if not hasattr(task, "policy"):
            raise ConfigError(f"model: gym is the credit gym's tiny policy; task {run.task!r} has none "
                              "(use a gym-* task)")
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
        raise ConfigError(f"task {run.task!r} gives {len(train)} train examples, fewer than the {prompts_per_step} "
                          "prompts one generation batch needs (generation_batch_size / num_generations)")
    evals = task.load("eval", run.eval_size) if run.eval_size else []
    examples = {}
    for ex in [*train, *evals]:
        if ex.id in examples:
            raise ConfigError(f"task {run.task!r} has two examples with id {ex.id!r}; ids must be unique")
        examples[ex.id] = ex
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


def build_trainer(config: RunConfig, data: TaskData | None = None):
    """The :class:`~mrtpo.trainer.MRTPOTrainer` for ``config``: task data (``data``, else loaded),
    verifier rewards, model.

    Checks that TRL renders the first prompt exactly as the task does (the evidence replays and
    ``mrtpo eval`` use the task's rendering), and puts the reward into the progress bar.
    """
    from datasets import Dataset
    from transformers import set_seed
    from transformers.trainer_callback import ProgressCallback

    from mrtpo.counterfactual import prompt_renderer
    from mrtpo.model_names import base_model_names
    from mrtpo.rewards import VerifierReward
    from mrtpo.trainer import MRTPOTrainer

    run, args = config.run, config.args
    data = data if data is not None else load_task_data(config)
    task, train, evals, examples = data.task, data.train, data.evals, data.examples
    rewards = [VerifierReward(v, examples, getattr(task, "checked_spans", None)) for v in task.verifiers()]

    def rows(exs):
        return Dataset.from_list([{"prompt": ex.messages, "example_id": ex.id} for ex in exs])

    model, tokenizer, warm_folder = load_model(config, task)
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
    card_name, adapter_name = base_model_names(run.model, run.task)
    trainer.name_base_model(card_name, None if warm_folder else adapter_name)  # a warm start's adapter: on its folder
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
    run = RunSettings()
    p = argparse.ArgumentParser(
        prog="mrtpo train",
        description="Train a policy with MRTPO or a baseline method on a task (see docs/training.md).",
        epilog="Any config key can be given as key=value after the flags, e.g. `temperature=0.9 lam=0.5`. "
               "Precedence: defaults < saved config (resume) < --config files < flags < key=value.",
        formatter_class=HelpFormatter,
    )
    # Defaults stay None here so a flag left out does not override a --config file; the help names
    # the value the run then gets.
    p.add_argument("--task", help=f"task to train on: {', '.join(TASK_NAMES)}, one a plugin registers (MRTPO_PLUGINS), "
                                  f"or a task file path/to/task.yaml (default: {run.task})")
    p.add_argument("--method", help=f"credit method: grpo, gdpo, mrtpo, mrtpo-contrastive, contrast, entropy; "
                                    f"controls mrtpo-shuffled, mrtpo-swapped "
                                    f"(default: {TRAIN_DEFAULTS['method']})")
    p.add_argument("--config", action="append", default=[], metavar="YAML", help="config file (repeatable; later wins)")
    p.add_argument("--model", help=f"preset, model folder, .gguf file or hub id (default: {run.model})")
    p.add_argument("--output-dir", metavar="DIR", help="run folder (default: runs/<task>-<method>-<time>)")
    p.add_argument("--max-steps", type=int, help=f"optimizer steps (default: {TRAIN_DEFAULTS['max_steps']})")
    p.add_argument("--seed", type=int, help=f"seed of data order, sampling and initialisation "
                                            f"(default: {TRAIN_DEFAULTS['seed']})")
    p.add_argument("--learning-rate", type=float, help=f"learning rate (default: {TRAIN_DEFAULTS['learning_rate']}; "
                                                       f"{run.lora_learning_rate} with LoRA)")
    p.add_argument("--lora-r", type=int, help=f"LoRA rank, 0: full fine-tuning (default: {run.lora_r})")
    p.add_argument("--report-to", help=f"none, tensorboard, wandb, trackio (comma-separated for several) "
                                       f"(default: {TRAIN_DEFAULTS['report_to']})")
    p.add_argument("--resume", nargs="?", const="", metavar="CHECKPOINT",
                   help="continue a run: a checkpoint folder, a run folder (its latest checkpoint), or nothing "
                        "(the latest checkpoint in --output-dir)")
    p.add_argument("--overwrite", action="store_true",
                   help="start over in an --output-dir that holds a run: remove that run's files (config.yaml, logs, "
                        "reports, checkpoint-N/) once the new run's settings and model have loaded")
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
    """The run's config and, when resuming, the checkpoint to resume from: the newest complete one
    (notes on newer ones passed over go into ``config.notes``), which must have been saved under the
    run folder's settings except those this command sets."""
    flags = {"task": ns.task, "method": ns.method, "model": ns.model, "output_dir": ns.output_dir,
             "max_steps": ns.max_steps, "seed": ns.seed, "learning_rate": ns.learning_rate,
             "lora_r": ns.lora_r, "report_to": ns.report_to}
    overrides = {k: v for k, v in flags.items() if v is not None}
    overrides.update(parse_overrides(ns.overrides))
    checkpoint, base, notes = None, None, []
    if ns.resume is not None:
        if ns.overwrite:
            raise ConfigError("--overwrite starts a new run; it cannot be combined with --resume")
        where = ns.resume
        if not where:
            where = overrides.get("output_dir")
            if where is None:
                for path in ns.config:
                    where = read_yaml(path).get("output_dir", where)
            if not where:
                raise ConfigError("--resume without a path needs the run folder: "
                                  "give --output-dir (or --resume <folder>)")
        checkpoint, notes = find_checkpoint(where)
        run_dir = checkpoint.parent
        given = overrides.get("output_dir")
        if given is not None and Path(given).resolve() != run_dir.resolve():
            raise ConfigError(f"--resume {checkpoint} continues the run in {run_dir}, but --output-dir is {given}; "
                              "drop --output-dir (resuming keeps the run's folder)")
        overrides["output_dir"] = str(run_dir)
        saved = run_dir / CONFIG_NAME
        if saved.is_file():
            base = read_yaml(saved)
            base.pop("resume_from_checkpoint", None)
    source = str(run_dir / CONFIG_NAME) if base else ""
    config = load_config(ns.config, overrides, base=base, base_source=source)
    if checkpoint is not None:
        _check_same_run(checkpoint, base, {k for k, where in config.explicit.items() if where != source}, notes)
        config.args.resume_from_checkpoint = str(checkpoint)
    config.notes.extend(notes)
    return config, checkpoint


def _check_same_run(checkpoint: Path, folder: dict | None, given: set[str], notes: list[str]) -> None:
    """Refuse a checkpoint saved under other settings than the run folder's ``config.yaml`` (a checkpoint
    of another run): it would continue those weights under these settings without a word."""
    saved = saved_config(checkpoint)
    if saved is None or folder is None:
        notes.append(f"note: {checkpoint.name} carries no copy of its settings (saved by an older mrtpo), or the "
                     "folder has no config.yaml; not checked against each other")
        return
    differ = config_differences(saved, folder, given)
    if differ:
        raise ConfigError(f"{checkpoint} was saved under other settings than {checkpoint.parent / CONFIG_NAME} "
                          f"(checkpoint vs config.yaml: {'; '.join(differ)}): it belongs to another run. Resume a "
                          "checkpoint of this run, or set those keys on the command line to resume under them")


def _say(main_process: bool, text: str) -> None:
    if main_process:
        print(text, flush=True)


def _error(text: Any) -> int:
    print(f"mrtpo train: error: {text}", file=sys.stderr)
    return 2


def main(argv: list[str] | None = None) -> int:
    """The command. Every check runs before any model loads, and nothing is written into the run
    folder until the settings, the task data and the model have loaded: a command that fails leaves
    an existing run's files as they were."""
    ns = _parser().parse_args(argv)
    if ns.list_keys:
        _print_keys()
        return 0
    main_process = int(os.environ.get("RANK", "0")) == 0  # torchrun / accelerate launch: write files once
    from mrtpo.hub import HubError, prepare_hub
    from mrtpo.model_init import run_model_init
    from mrtpo.models import ModelLoadError

    try:
        config, checkpoint = resolve_from_argv(ns)
        run, args = config.run, config.args
        run_model_init(config)  # model_init_kwargs checked before anything loads
        prepare_hub(args.push_to_hub)  # offline only where the user or the machine says so; push_to_hub checked
        out = Path(args.output_dir)
        if checkpoint is not None and (step := checkpoint_step(checkpoint)) >= args.max_steps:
            _say(main_process, f"mrtpo train: {out} is already finished: {checkpoint.name} is at step {step} of "
                               f"max_steps {args.max_steps}; give --max-steps N (N > {step}) to train it longer")
            return 0
        data = load_task_data(config)
        if main_process:
            if checkpoint is None:
                check_fresh_folder(out, ns.overwrite)
            check_writable(out)
    except (ConfigError, ModelLoadError, HubError) as exc:
        return _error(exc)
    t0 = time.perf_counter()
    mode = f"LoRA r={run.lora_r}" if run.lora_r else "full fine-tuning"
    _say(main_process, f"mrtpo train · task {run.task} · method {args.method} · model {run.model} ({mode}) · "
                       f"{args.max_steps} steps × {args.generation_batch_size // args.num_generations} prompts × "
                       f"{args.num_generations} completions · output {out}")
    for note in config.notes:
        _say(main_process, note)
    from mrtpo.models import ModelLoadError

    try:
        trainer = build_trainer(config, data)
    except (ConfigError, ModelLoadError) as exc:
        return _error(exc)
    main_process = trainer.accelerator.is_main_process
    if main_process:
        try:
            _open_run_folder(out, config, checkpoint, ns.overwrite)
        except (ConfigError, OSError) as exc:
            return _error(exc)
    trainer.add_callback(ConfigStamp(config))
    trainer.accelerator.wait_for_everyone()
    _say(main_process, f"ready in {time.perf_counter() - t0:.0f} s: {len(trainer.train_dataset)} train prompts, "
                       f"rewards {', '.join(trainer.reward_func_names)}")
    from mrtpo.rewards import RewardValueError
    from mrtpo.run_outputs import save_final_model

    try:
        trainer.train(resume_from_checkpoint=str(checkpoint) if checkpoint is not None else None)
        final = save_final_model(trainer, out)
    except RewardValueError as exc:
        return _error(exc)
    except OSError as exc:
        if exc.errno not in (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES):
            raise
        return _error(f"cannot write {exc.filename or out}: {exc.strerror}; the run's complete checkpoints are "
                      f"intact: free the space (or fix the folder) and --resume {out}")
    if not main_process:
        return 0
    print(f"model: {final} (`mrtpo export {out}` writes a standalone copy)")
    if run.report:
        from mrtpo.report.build import make_report

        paths = make_report(out, samples=run.report_samples)
        print("report: " + ", ".join(str(p) for p in paths.values()))
    print(f"total {time.perf_counter() - t0:.0f} s · run folder {out}")
    return 0


def _open_run_folder(out: Path, config: RunConfig, checkpoint: Path | None, overwrite: bool) -> None:
    """Once everything has loaded: clear the earlier run (``--overwrite``), write ``config.yaml``, and on
    resume drop what the interrupted run logged after its checkpoint, torn last lines included."""
    if checkpoint is None:
        if overwrite and run_files(out):
            print(f"--overwrite: removing the earlier run in {out}", flush=True)
            clear_run(out)
        write_config(config, out / CONFIG_NAME)
        return
    step = checkpoint_step(checkpoint)
    print(f"resuming from {checkpoint} (step {step})", flush=True)
    # A sample is tagged with the global step *before* its update: step s belongs to checkpoint s + 1.
    logs = {"metrics.jsonl": lambda r: r.get("step", 0) <= step,
            "credit_samples.jsonl": lambda r: r.get("step", 0) < step}
    for name, keep in logs.items():
        try:
            torn = trim_jsonl(out / name, keep)
        except ValueError as exc:
            raise ConfigError(f"{exc}; fix or remove that line to resume") from None
        if torn:
            print(f"note: dropped the torn last line of {name} (a write the interrupted run did not finish)",
                  flush=True)
    write_config(config, out / CONFIG_NAME)


if __name__ == "__main__":
    sys.exit(main())
