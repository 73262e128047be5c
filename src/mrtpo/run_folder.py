"""The run folder as a transaction: which folder a fresh run may use, which checkpoint a resume may
continue, and the settings copy each checkpoint carries.

- One process writes into a run folder at a time: the run holds an exclusive lock on it from before it
  writes anything until it ends (:mod:`mrtpo.run_lock`, which ``mrtpo report`` and ``mrtpo export`` take too).
- A folder that holds another run (:data:`RUN_FILES`, ``checkpoint-N/``) is refused to a fresh run;
  ``--overwrite`` removes that run's files, and only those (:func:`clear_run`).
- A checkpoint is *complete* when the HF Trainer finished writing it: ``trainer_state.json`` is the
  last file ``Trainer._save_checkpoint`` writes (after the weights, optimizer, scheduler and RNG
  states), so a checkpoint without a readable one was cut short (``kill -9``, a full disk) and is
  passed over. A checkpoint with one whose other files are missing or truncated was damaged later:
  that is an error naming the file and the previous complete checkpoint (:func:`find_checkpoint`).
- Each checkpoint gets a copy of the run's settings (:data:`STAMP_NAME`, :class:`ConfigStamp`), so a
  resume can tell a checkpoint of another run from one of this run (:func:`config_differences`).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import struct
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from mrtpo.config import CONFIG_NAME, ConfigError, RunConfig, read_yaml
from mrtpo.saved_config import write_config
from mrtpo.task_pin import read_pin, write_pin

#: Files a run writes into its folder (besides ``checkpoint-N/``).
RUN_FILES = (
    "config.yaml",
    "metrics.jsonl",
    "credit_samples.jsonl",
    "report.html",
    "report.md",
    "curves.png",
    "README.md",
    "model",
    "export",
    "task_pin.json",
)
#: The copy of the run's settings inside each checkpoint.
STAMP_NAME = "mrtpo_config.yaml"
#: Settings a resume may change without making the checkpoint another run's.
RESUMABLE_CHANGES = frozenset({"output_dir", "resume_from_checkpoint", "max_steps"})
#: Model weights of a checkpoint: full (one file or shards), LoRA adapter, or old-style .bin.
WEIGHT_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "adapter_model.safetensors",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
    "adapter_model.bin",
)

_CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")


# --------------------------------------------------------------------------------------------
# Which folder a run may use.
# --------------------------------------------------------------------------------------------
def run_files(folder: Path) -> list[Path]:
    """The files and ``checkpoint-N`` folders an earlier run left in ``folder`` (sorted)."""
    if not folder.is_dir():
        return []
    found = [folder / name for name in RUN_FILES if (folder / name).exists()]
    return sorted(found + checkpoints(folder))


def clear_run(folder: Path) -> None:
    """Remove an earlier run's files (:func:`run_files`); anything else in the folder stays."""
    for path in run_files(folder):
        shutil.rmtree(path) if path.is_dir() else path.unlink()


def check_fresh_folder(folder: Path, overwrite: bool) -> None:
    """A fresh run may use ``folder`` only when it holds no run, or when told to ``overwrite`` it."""
    used = run_files(folder)
    if used and not overwrite:
        names = ", ".join(p.name for p in used[:4]) + (", ..." if len(used) > 4 else "")
        raise ConfigError(
            f"{folder} already holds a run ({names}): continue it with --resume {folder}, "
            "start over in it with --overwrite (removes that run's files), or give another --output-dir"
        )


#: The mark a command leaves in an output folder it wrote whole (``mrtpo export``): the only non-empty
#: folder such a command replaces (:func:`check_output_folder`).
OUTPUT_MARK = ".mrtpo-output"


def _is_run(folder: Path) -> bool:
    """Whether ``folder`` holds a run: its settings, logs or checkpoints (a model card alone, which an
    export holds too, does not make one)."""
    return any((folder / name).exists() for name in RUN_FILES[:3]) or bool(checkpoints(folder))


def _run_above(path: Path) -> Path | None:
    """The run folder or checkpoint that ``path`` is, or is inside (None: neither)."""
    for folder in (path, *path.parents):
        if _CHECKPOINT.match(folder.name) or _is_run(folder):
            return folder
    return None


def check_output_folder(dest: Path, overwrite: bool, slot: Path | None = None) -> None:
    """A command that writes a whole folder (``mrtpo export``) may replace ``dest`` only when it is new,
    empty, or its own earlier output (:data:`OUTPUT_MARK`; ``slot``, the run's own output folder, counts as
    one) and ``overwrite`` is given. A file, a run folder or checkpoint, a folder inside one (other than
    ``slot``), one holding a run, or one holding other files is refused, with the reason."""
    dest = Path(os.path.abspath(dest))
    slot = Path(os.path.abspath(slot)) if slot is not None else None
    if dest.exists() and not dest.is_dir():
        raise ConfigError(f"{dest} is a file: give a folder (new or empty) as the output")
    if dest != slot and (above := _run_above(dest)) is not None:
        where = "is a run folder" if above == dest else f"is inside the run folder {above}"
        if _CHECKPOINT.match(above.name):
            where = "is a checkpoint" if above == dest else f"is inside the checkpoint {above}"
        raise ConfigError(f"{dest} {where}; replacing it would delete the run's files: give a new or empty folder")
    entries = sorted(dest.iterdir()) if dest.is_dir() else []
    if not entries:
        return
    runs = [p for p in entries if p.is_dir() and (_is_run(p) or _CHECKPOINT.match(p.name))]
    if runs:
        raise ConfigError(
            f"{dest} holds a run ({', '.join(p.name for p in runs[:3])}); replacing it would delete "
            "that run: give a new or empty folder"
        )
    written = _marked_files(dest)
    if written is None and dest == slot:  # an export by an older mrtpo, without the mark: its files, no folders
        written = {p.name for p in entries if p.is_file() and p.name not in RUN_FILES[:3]}
    foreign = [p.name for p in entries if p.name not in (written or set()) | {OUTPUT_MARK}]
    if foreign:
        names = ", ".join(foreign[:4]) + (", ..." if len(foreign) > 4 else "")
        raise ConfigError(
            f"{dest} holds files mrtpo export did not write ({names}); it replaces only a folder it "
            "wrote: give a new or empty folder"
        )
    if not overwrite:
        raise ConfigError(f"{dest} holds an earlier export: --overwrite replaces it, or give another folder")


def mark_output(folder: Path) -> None:
    """Mark ``folder`` as written whole by a command, listing its files (:func:`check_output_folder`)."""
    names = sorted(p.name for p in folder.iterdir() if p.name != OUTPUT_MARK)
    (folder / OUTPUT_MARK).write_text(json.dumps({"written_by": "mrtpo", "files": names}) + "\n")


def _marked_files(folder: Path) -> set[str] | None:
    """The files :func:`mark_output` listed in ``folder`` (None: no readable mark)."""
    try:
        return set(json.loads((folder / OUTPUT_MARK).read_text())["files"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


# --------------------------------------------------------------------------------------------
# The folder's disk.
# --------------------------------------------------------------------------------------------
def check_writable(folder: Path) -> None:
    """Create ``folder`` if needed and write a few bytes there, so a read-only or full disk is one
    clear error before the model loads rather than a traceback later."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=folder, prefix=".mrtpo-write-check-")
        try:
            os.write(fd, b"mrtpo\n")
            os.fsync(fd)
        finally:
            os.close(fd)
            os.unlink(probe)
    except OSError as exc:
        raise ConfigError(f"cannot write to the output folder {folder}: {exc.strerror or exc}") from None


# --------------------------------------------------------------------------------------------
# Checkpoints.
# --------------------------------------------------------------------------------------------
def checkpoints(folder: Path) -> list[Path]:
    """``checkpoint-N`` folders in ``folder``, newest (highest N) first."""
    if not folder.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in folder.iterdir() if (m := _CHECKPOINT.match(p.name)) and p.is_dir()]
    return [p for _, p in sorted(found, reverse=True)]


@dataclass(frozen=True)
class Problem:
    """What is wrong with a checkpoint: ``incomplete`` (its save was cut short) or a damaged file."""

    file: Path
    why: str
    incomplete: bool = False


def checkpoint_step(checkpoint: Path) -> int:
    return int(json.loads((checkpoint / "trainer_state.json").read_text())["global_step"])


def checkpoint_problem(checkpoint: Path) -> Problem | None:
    """None for a complete checkpoint; else the first problem found (see the module docstring)."""
    state = checkpoint / "trainer_state.json"
    try:
        checkpoint_step(checkpoint)
    except (OSError, ValueError, KeyError, TypeError):
        why = "is missing" if not state.exists() else "is unreadable"
        return Problem(state, f"{why} (it is written last, so this save was cut short)", incomplete=True)
    names = {p.name for p in checkpoint.iterdir()}
    if not names & set(WEIGHT_FILES):
        return Problem(checkpoint, "holds no model weights")
    # DeepSpeed (global_stepN/) and FSDP (optimizer_0/) keep optimizer states in their own layout.
    if not any(n.startswith(("global_step", "optimizer_0")) for n in names):
        for required in ("optimizer.pt", "scheduler.pt"):
            if required not in names:
                return Problem(checkpoint / required, "is missing")
        if not any(n.startswith("rng_state") for n in names):
            return Problem(checkpoint / "rng_state.pth", "is missing")
    for path in sorted(p for p in checkpoint.rglob("*") if p.is_file()):
        why = file_problem(path)
        if why:
            return Problem(path, why)
    return None


def file_problem(path: Path) -> str | None:
    """Why ``path`` cannot be loaded whole (empty, truncated, unreadable), or None. Reads only
    headers: a safetensors file must be as long as its header says, a torch zip file must end in
    its central directory, a JSON file must parse."""
    size = path.stat().st_size
    if size == 0:
        return "is empty"
    try:
        if path.suffix == ".safetensors":
            with path.open("rb") as f:
                (n,) = struct.unpack("<Q", f.read(8))
                header = json.loads(f.read(n)) if 8 + n <= size else None
            if header is None:
                return f"is truncated ({size} bytes, shorter than its header)"
            expected = 8 + n + max((v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"), default=0)
            if size < expected:
                return f"is truncated ({size} of {expected} bytes)"
        elif path.suffix in (".pt", ".pth", ".bin"):
            with path.open("rb") as f:
                zipped = f.read(4) == b"PK\x03\x04"
            if zipped:
                zipfile.ZipFile(path).close()
        elif path.suffix == ".json":
            json.loads(path.read_text())
    except (zipfile.BadZipFile, struct.error, ValueError, KeyError, TypeError, OSError):
        return "is truncated or corrupt"
    return None


def find_checkpoint(where: str | os.PathLike) -> tuple[Path, list[str]]:
    """The checkpoint to resume from, and notes on the newer ones passed over.

    ``where``: a ``checkpoint-N`` folder (it must be complete), or a run folder (its newest complete
    checkpoint; newer ones cut short are passed over with a note). A damaged checkpoint is a
    :class:`ConfigError` naming the file and the previous complete checkpoint.
    """
    path = Path(where)
    if not path.is_dir():
        raise ConfigError(f"cannot resume from {path}: no such folder")
    explicit = _CHECKPOINT.match(path.name) is not None or (path / "trainer_state.json").exists()
    candidates = [path] if explicit else checkpoints(path)
    if not candidates:
        raise ConfigError(
            f"cannot resume: {path} holds no checkpoint-N folder (checkpoints are written every "
            "save_steps steps and at the end)"
        )
    notes = []
    for checkpoint in candidates:
        problem = checkpoint_problem(checkpoint)
        if problem is None:
            return checkpoint, notes
        if explicit or not problem.incomplete:
            older = _previous_complete(checkpoint)
            hint = f"the previous complete checkpoint is {older}" if older else "no earlier checkpoint is complete"
            raise ConfigError(f"cannot resume from {checkpoint}: {problem.file} {problem.why}; {hint}")
        notes.append(f"note: passing over {checkpoint.name}: {problem.file.name} {problem.why}")
    raise ConfigError(f"cannot resume: no checkpoint in {path} is complete ({'; '.join(notes)})")


def _previous_complete(checkpoint: Path) -> Path | None:
    step = int(m.group(1)) if (m := _CHECKPOINT.match(checkpoint.name)) else None
    older = [c for c in checkpoints(checkpoint.parent) if step is None or int(c.name.split("-")[1]) < step]
    return next((c for c in older if checkpoint_problem(c) is None), None)


# --------------------------------------------------------------------------------------------
# The settings a checkpoint was saved under.
# --------------------------------------------------------------------------------------------
class ConfigStamp(TrainerCallback):
    """Writes the run's settings into each checkpoint as it is saved (:data:`STAMP_NAME`)."""

    def __init__(self, config: RunConfig):
        self.config = config

    def on_save(self, args, state, control, **kwargs):
        if state.is_world_process_zero:
            write_config(self.config, Path(args.output_dir) / f"checkpoint-{state.global_step}" / STAMP_NAME)


class ScheduleOnResume(TrainerCallback):
    """A resumed run follows the learning-rate schedule of its *current* ``max_steps``: step s gets the
    rate a run planned for max_steps from the start gets at step s. The scheduler is rebuilt for the new
    length, but the checkpoint's state carries the rate the old schedule set for the next step (0.0 after
    a finished linear schedule); this sets that rate from the new schedule before the first resumed step.
    Resuming with the same max_steps changes nothing (the same formula gives the same number)."""

    def on_train_begin(self, args, state, control, lr_scheduler=None, optimizer=None, **kwargs):
        from torch.optim.lr_scheduler import LambdaLR

        if state.global_step == 0 or not isinstance(lr_scheduler, LambdaLR) or optimizer is None:
            return  # a fresh run; or a scheduler without a closed-form rate per step (transformers' are LambdaLR)
        rates = [
            base * rule(lr_scheduler.last_epoch) for base, rule in zip(lr_scheduler.base_lrs, lr_scheduler.lr_lambdas)
        ]
        for group, rate in zip(optimizer.param_groups, rates):
            group["lr"] = rate
        lr_scheduler._last_lr = rates


def saved_config(checkpoint: Path) -> dict[str, Any] | None:
    """The settings ``checkpoint`` was saved under (None: saved without a copy, by an older mrtpo)."""
    stamp = checkpoint / STAMP_NAME
    return read_yaml(stamp) if stamp.is_file() else None


def config_differences(saved: dict[str, Any], folder: dict[str, Any], given: set[str]) -> list[str]:
    """``key: checkpoint value vs config.yaml value`` for each setting the two disagree on, leaving out
    those a resume may change (:data:`RESUMABLE_CHANGES`) and those this command sets (``given``)."""
    keys = sorted((set(saved) | set(folder)) - RESUMABLE_CHANGES - given)
    return [f"{k}: {saved.get(k)!r} vs {folder.get(k)!r}" for k in keys if saved.get(k) != folder.get(k)]


def open_run_folder(out: Path, config: RunConfig, checkpoint: Path | None, overwrite: bool, changed: list[str]) -> None:
    """Once everything has loaded: clear the earlier run (``--overwrite``), write ``config.yaml`` and the task's
    pin (:mod:`mrtpo.task_pin`; on resume only when ``changed`` was allowed or the run had none), and on
    resume drop what the interrupted run logged after its checkpoint, torn last lines included."""
    if checkpoint is None:
        if overwrite and run_files(out):
            print(f"--overwrite: removing the earlier run in {out}", flush=True)
            clear_run(out)
        write_config(config, out / CONFIG_NAME)
        write_pin(out, config.run.task)
        return
    from mrtpo.trainer.metrics import trim_jsonl

    step = checkpoint_step(checkpoint)
    if changed or read_pin(out) is None:
        write_pin(out, config.run.task, changed, step)
    print(f"resuming from {checkpoint} (step {step})", flush=True)
    # A sample is tagged with the global step *before* its update: step s belongs to checkpoint s + 1.
    logs = {
        "metrics.jsonl": lambda r: r.get("step", 0) <= step,
        "credit_samples.jsonl": lambda r: r.get("step", 0) < step,
    }
    for name, keep in logs.items():
        try:
            torn = trim_jsonl(out / name, keep)
        except ValueError as exc:
            raise ConfigError(f"{exc}; fix or remove that line to resume") from None
        if torn:
            print(
                f"note: dropped the torn last line of {name} (a write the interrupted run did not finish)", flush=True
            )
    write_config(config, out / CONFIG_NAME)


__all__ = [
    "OUTPUT_MARK",
    "RESUMABLE_CHANGES",
    "RUN_FILES",
    "STAMP_NAME",
    "ConfigStamp",
    "Problem",
    "ScheduleOnResume",
    "check_fresh_folder",
    "check_output_folder",
    "check_writable",
    "checkpoint_problem",
    "checkpoint_step",
    "checkpoints",
    "clear_run",
    "config_differences",
    "file_problem",
    "find_checkpoint",
    "mark_output",
    "open_run_folder",
    "run_files",
    "saved_config",
]
