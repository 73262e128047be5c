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
``checkpoint-N/`` folders (HF Trainer checkpoints, resumable) and, at the end, ``report.html`` /
``report.md`` / ``curves.png`` (:func:`mrtpo.report.make_report`).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

# The model hub is unreachable here; nothing may wait on a network timeout.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

from mrtpo.config import (  # noqa: E402
    CONFIG_NAME,
    TASK_NAMES,
    ConfigError,
    RunConfig,
    RunSettings,
    load_config,
    parse_overrides,
    read_yaml,
    valid_keys,
    write_config,
)

__all__ = ["PromptMismatchError", "build_trainer", "find_checkpoint", "main", "resolve_from_argv"]


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
    from mrtpo.counterfactual import prompt_renderer
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

    if run.model == "gym":  # a gym task's warm-started tiny policy, built and cached on first use
        if not hasattr(task, "policy"):
            raise ConfigError(f"model: gym is the credit gym's tiny policy; task {run.task!r} has none (use a gym-* task)")
        model, tokenizer = task.policy(getattr(torch, _DTYPES[run.dtype]))
    else:
        from mrtpo.warm_start import load_warm_start, resolve_for_run

        warm, _ = resolve_for_run(run.warm_start, run.task, run.model)
        if warm is not None:  # e.g. toolcall: a short LoRA SFT so the format reward has spread (built once)
            model, tokenizer, folder = load_warm_start(run.model, warm, task, dtype=getattr(torch, _DTYPES[run.dtype]))
            print(f"warm start: starting from {folder}", flush=True)
        else:
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
                    out = read_yaml(path).get("output_dir", out)
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
            base = read_yaml(saved)
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
        for note in config.notes:
            print(note, flush=True)
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
