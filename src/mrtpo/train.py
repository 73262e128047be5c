"""``mrtpo train``: MRTPO (or a baseline) on a task, from YAML configs and flags, to a run folder.

    mrtpo train --task sql --method mrtpo --config configs/cpu-demo.yaml
    mrtpo train --task toolcall --method gdpo --max-steps 50 learning_rate=2e-6 temperature=0.9
    mrtpo train --resume runs/sql-mrtpo-20260101-120000          # continue that run

The settings (:mod:`mrtpo.config`) come in layers, later ones winning: the built-in defaults, the
saved ``config.yaml`` of a resumed run, each ``--config`` file in order, the named flags, then
``key=value`` overrides. ``mrtpo train --list-keys`` prints every key. The trainer for a resolved
config is built by :func:`mrtpo.run_build.build_trainer` (importable from here too); this module checks
and runs it.

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
)
from mrtpo.credit import available_methods  # noqa: E402
from mrtpo.run_build import (  # noqa: E402
    PromptMismatchError,
    TaskData,
    build_trainer,
    load_model,
    load_task_data,
)
from mrtpo.run_folder import (  # noqa: E402
    ConfigStamp,
    ScheduleOnResume,
    check_fresh_folder,
    check_writable,
    checkpoint_step,
    config_differences,
    find_checkpoint,
    open_run_folder,
    saved_config,
)
from mrtpo.run_lock import RunLockError, lock_run_folder  # noqa: E402
from mrtpo.run_outputs import FINAL_DIR  # noqa: E402
from mrtpo.task_pin import check_task_pin  # noqa: E402

logger = logging.getLogger(__name__)

__all__ = [
    "PromptMismatchError",
    "TaskData",
    "build_trainer",
    "find_checkpoint",
    "load_model",
    "load_task_data",
    "main",
    "resolve_from_argv",
]


# --------------------------------------------------------------------------------------------
# The command.
# --------------------------------------------------------------------------------------------
def _parser() -> argparse.ArgumentParser:
    run = RunSettings()
    p = argparse.ArgumentParser(
        prog="mrtpo train",
        description="Train a policy with MRTPO or a baseline method on a task (see docs/training.md).",
        epilog="Any config key can be given as --key value (TRL / HfArgumentParser style: --num_generations 4, "
        "--use_peft, --lora_target_modules q_proj v_proj) or as key=value after the flags "
        "(`temperature=0.9 lam=0.5`); TRL's names model_name_or_path, torch_dtype and use_peft are aliases, and "
        "TRL's --dataset_name with --reward_funcs make a task. "
        "Precedence: defaults < saved config (resume) < --config files < named flags < --key value < key=value.",
        formatter_class=HelpFormatter,
    )
    # Defaults stay None here so a flag left out does not override a --config file; the help names
    # the value the run then gets.
    p.add_argument(
        "--task",
        help=f"task to train on: {', '.join(TASK_NAMES)}, one a plugin registers (MRTPO_PLUGINS), "
        f"or a task file path/to/task.yaml (default: {run.task})",
    )
    p.add_argument(
        "--method", help=f"credit method: {', '.join(available_methods())} (default: {TRAIN_DEFAULTS['method']})"
    )
    p.add_argument("--config", action="append", default=[], metavar="YAML", help="config file (repeatable; later wins)")
    p.add_argument("--model", help=f"preset, model folder, .gguf file or hub id (default: {run.model})")
    p.add_argument("--output-dir", metavar="DIR", help="run folder (default: runs/<task>-<method>-<time>)")
    p.add_argument("--max-steps", type=int, help=f"optimizer steps (default: {TRAIN_DEFAULTS['max_steps']})")
    p.add_argument(
        "--seed", type=int, help=f"seed of data order, sampling and initialisation (default: {TRAIN_DEFAULTS['seed']})"
    )
    p.add_argument(
        "--learning-rate",
        type=float,
        help=f"learning rate (default: {TRAIN_DEFAULTS['learning_rate']}; {run.lora_learning_rate} with LoRA)",
    )
    p.add_argument("--lora-r", type=int, help=f"LoRA rank, 0: full fine-tuning (default: {run.lora_r})")
    p.add_argument(
        "--report-to",
        help=f"none, tensorboard, wandb, trackio (comma-separated for several) "
        f"(default: {TRAIN_DEFAULTS['report_to']})",
    )
    p.add_argument(
        "--resume",
        nargs="?",
        const="",
        metavar="CHECKPOINT",
        help="continue a run: a checkpoint folder, a run folder (its latest checkpoint), or nothing "
        "(the latest checkpoint in --output-dir)",
    )
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="start over in an --output-dir that holds a run: remove that run's files (config.yaml, logs, "
        "reports, checkpoint-N/) once the new run's settings and model have loaded",
    )
    p.add_argument(
        "--allow-task-change",
        action="store_true",
        help="--resume although the task file, its reward sources or data changed since the run started "
        "(recorded in the run's task_pin.json)",
    )
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
    flags = {
        "task": ns.task,
        "method": ns.method,
        "model": ns.model,
        "output_dir": ns.output_dir,
        "max_steps": ns.max_steps,
        "seed": ns.seed,
        "learning_rate": ns.learning_rate,
        "lora_r": ns.lora_r,
        "report_to": ns.report_to,
    }
    overrides = {k: v for k, v in flags.items() if v is not None}
    overrides.update(getattr(ns, "fields", {}))  # --key value (mrtpo.cli_args)
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
                raise ConfigError(
                    "--resume without a path needs the run folder: give --output-dir (or --resume <folder>)"
                )
        checkpoint, notes = find_checkpoint(where)
        run_dir = checkpoint.parent
        given = overrides.get("output_dir")
        if given is not None and Path(given).resolve() != run_dir.resolve():
            raise ConfigError(
                f"--resume {checkpoint} continues the run in {run_dir}, but --output-dir is {given}; "
                "drop --output-dir (resuming keeps the run's folder)"
            )
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
        notes.append(
            f"note: {checkpoint.name} carries no copy of its settings (saved by an older mrtpo), or the "
            "folder has no config.yaml; not checked against each other"
        )
        return
    differ = config_differences(saved, folder, given)
    if differ:
        raise ConfigError(
            f"{checkpoint} was saved under other settings than {checkpoint.parent / CONFIG_NAME} "
            f"(checkpoint vs config.yaml: {'; '.join(differ)}): it belongs to another run. Resume a "
            "checkpoint of this run, or set those keys on the command line to resume under them"
        )


def _say(main_process: bool, text: str) -> None:
    if main_process:
        print(text, flush=True)


def _error(text: Any) -> int:
    print(f"mrtpo train: error: {text}", file=sys.stderr)
    return 2


def main(argv: list[str] | None = None) -> int:
    """The command. Every check runs before any model loads, and nothing is written into the run
    folder until the settings, the task data and the model have loaded: a command that fails leaves
    an existing run's files as they were. The main process holds the run folder's lock
    (:func:`~mrtpo.run_lock.lock_run_folder`) from before its checks until the command returns."""
    locks: list = []
    try:
        return _main(argv, locks)
    finally:
        for lock in locks:
            lock.release()


def _main(argv: list[str] | None, locks: list) -> int:
    from mrtpo.cli_args import split_argv

    parser = _parser()
    try:  # `--key value` flags for every config key (TRL's style) come out first
        rest, fields = split_argv(sys.argv[1:] if argv is None else list(argv), parser)
    except ConfigError as exc:
        return _error(exc)
    ns = parser.parse_intermixed_args(rest)  # key=value may sit between flags
    ns.fields = fields
    if ns.resume and "=" in ns.resume and not Path(ns.resume).exists():  # `--resume max_steps=6`: a setting
        ns.overrides, ns.resume = [ns.resume, *ns.overrides], ""
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
        finished = checkpoint is not None and (step := checkpoint_step(checkpoint)) >= args.max_steps
        save_only = finished and not (out / FINAL_DIR).is_dir()  # killed after its last checkpoint, before model/
        if save_only:
            config.notes.append(f"note: {out} has no {FINAL_DIR}/: writing it from {checkpoint.name} (no training)")
        elif finished:
            _say(
                main_process,
                f"mrtpo train: {out} is already finished: {checkpoint.name} is at step {step} of "
                f"max_steps {args.max_steps}; give --max-steps N (N > {step}) to train it longer",
            )
            return 0
        data = load_task_data(config)
        if main_process:
            check_writable(out)
            locks.append(lock_run_folder(out))  # before the folder is judged, and held while writing it
            if checkpoint is None:
                check_fresh_folder(out, ns.overwrite)
        changed = check_task_pin(out, run.task, ns.allow_task_change) if checkpoint is not None else []
    except (ConfigError, ModelLoadError, HubError, RunLockError) as exc:
        return _error(exc)
    t0 = time.perf_counter()
    mode = f"LoRA r={run.lora_r}" if run.lora_r else "full fine-tuning"
    _say(
        main_process,
        f"mrtpo train · task {run.task} · method {args.method} · model {run.model} ({mode}) · "
        f"{args.max_steps} steps × {args.generation_batch_size // args.num_generations} prompts × "
        f"{args.num_generations} completions · output {out}",
    )
    for note in config.notes:
        _say(main_process, note)
    from mrtpo.counterfactual import EvidenceNotFoundError
    from mrtpo.models import ModelLoadError

    try:
        trainer = build_trainer(config, data)
    except (ConfigError, ModelLoadError, EvidenceNotFoundError) as exc:
        return _error(exc)
    main_process = trainer.accelerator.is_main_process
    if main_process:
        try:
            open_run_folder(out, config, checkpoint, ns.overwrite, changed)
        except (ConfigError, OSError) as exc:
            return _error(exc)
    trainer.add_callback(ConfigStamp(config))
    trainer.add_callback(ScheduleOnResume())  # --resume --max-steps N: the schedule of a run planned for N steps
    trainer.accelerator.wait_for_everyone()
    _say(
        main_process,
        f"ready in {time.perf_counter() - t0:.0f} s: {len(trainer.train_dataset)} train prompts, "
        f"rewards {', '.join(trainer.reward_func_names)}",
    )
    from mrtpo.rewards import RewardValueError
    from mrtpo.run_outputs import save_final_model

    try:
        if save_only:
            trainer._load_from_checkpoint(str(checkpoint))
        else:
            trainer.train(resume_from_checkpoint=str(checkpoint) if checkpoint is not None else None)
        final = save_final_model(trainer, out)
    except RewardValueError as exc:
        return _error(exc)
    except OSError as exc:
        if exc.errno not in (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES):
            raise
        return _error(
            f"cannot write {exc.filename or out}: {exc.strerror}; the run's complete checkpoints are "
            f"intact: free the space (or fix the folder) and --resume {out}"
        )
    if not main_process:
        return 0
    print(f"model: {final} (`mrtpo export {out}` writes a standalone copy)")
    if run.report:
        from mrtpo.report.build import make_report

        try:
            paths = make_report(out, samples=run.report_samples)
        except OSError as exc:  # a full disk: the model is saved; `mrtpo report` writes the report later
            return _error(
                f"cannot write {exc.filename or out}: {exc.strerror or exc}; the model is saved in {final}: "
                f"free the space and run `mrtpo report {out}`"
            )
        print("report: " + ", ".join(str(p) for p in paths.values()))
    print(f"total {time.perf_counter() - t0:.0f} s · run folder {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
