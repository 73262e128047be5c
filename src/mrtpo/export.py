"""``mrtpo export``: a run's final model as one standalone model folder.

    mrtpo export runs/sql-mrtpo-20260101-120000                    # -> <run>/export/
    mrtpo export runs/sql-mrtpo-20260101-120000 --output-dir merged/

A LoRA run's ``model/`` holds only the adapter: export loads the base model the run started from
(its ``config.yaml``: the preset, folder or warm start), applies the adapter and merges it
(peft ``merge_and_unload``, in float32), and saves the merged weights with the tokenizer and model
card. A full fine-tuning run's ``model/`` is already whole: export copies it. ``--dtype`` saves the
weights in ``float32`` (a LoRA merge's default), ``bfloat16`` or ``float16`` (half the size; a copied
model is cast only when asked). A run without
``model/`` (stopped before the end) exports its newest complete checkpoint, with a note. The output
appears whole or not at all (written next to it, renamed last). It replaces only a folder an earlier
export wrote (its mark file), and only with ``--overwrite``: a run folder, a folder inside or holding
one, and a folder of other files are refused (:func:`mrtpo.run_folder.check_output_folder`). A run that a
training is writing is refused with its pid (:mod:`mrtpo.run_lock`: export reads a run under a shared lock,
and writes into it, the default ``RUN/export``, under the exclusive one).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path

from mrtpo.cli_help import HelpFormatter
from mrtpo.config import CONFIG_NAME, ConfigError, load_config
from mrtpo.run_folder import OUTPUT_MARK, check_output_folder, find_checkpoint, mark_output
from mrtpo.run_lock import RunLockError, lock_run_folder
from mrtpo.run_outputs import FINAL_DIR, is_adapter

__all__ = ["export_model", "main"]

#: The default output folder inside the run folder.
EXPORT_DIR = "export"
_COPIED = (
    "README.md",
    "tokenizer.json",
    "tokenizer_config.json",
    "chat_template.jinja",
    "special_tokens_map.json",
    "generation_config.json",
)


def _source(run: Path) -> tuple[Path, str | None]:
    """The folder to export (``model/``, else the newest complete checkpoint) and a note on the latter."""
    if (run / FINAL_DIR).is_dir():
        return run / FINAL_DIR, None
    if not (run / CONFIG_NAME).is_file():
        raise ConfigError(f"{run} is not a run folder of mrtpo train (no {CONFIG_NAME})")
    checkpoint, _ = find_checkpoint(run)
    return checkpoint, f"note: {run} has no {FINAL_DIR}/ (the run did not finish); exporting {checkpoint.name}"


#: ``--dtype`` choices.
DTYPES = ("float32", "bfloat16", "float16")
_WEIGHTS = ("*.safetensors", "*.bin", "*.safetensors.index.json")


def export_model(
    run: str | Path, output_dir: str | Path | None = None, overwrite: bool = False, dtype: str | None = None
) -> Path:
    """Write the standalone model of run folder ``run`` to ``output_dir`` (default ``<run>/export``), its
    weights in ``dtype`` (None: float32 for a merged adapter, a full model's own dtype). Holds the run's lock
    meanwhile (:mod:`mrtpo.run_lock`): shared while it only reads the run, exclusive when it writes into it
    (the default output); a run that a training holds is refused, naming its pid."""
    return _export(run, output_dir, overwrite, dtype)[0]


def _export(run: str | Path, output_dir: str | Path | None, overwrite: bool, dtype: str | None) -> tuple[Path, bool]:
    """:func:`export_model`, and whether the exported model is a merged LoRA adapter."""
    if dtype is not None and dtype not in DTYPES:
        raise ConfigError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    run = Path(run)
    if not run.is_dir():
        raise ConfigError(f"no such run folder: {run}")
    dest = Path(output_dir) if output_dir else run / EXPORT_DIR
    into_run = Path(os.path.abspath(dest)).is_relative_to(os.path.abspath(run))
    advice = "export reads model/ and the checkpoints a run writes: wait for it to end, then export"
    lock = lock_run_folder(run, "mrtpo export", shared=not into_run, advice=advice)
    try:
        source, note = _source(run)
        if note:
            print(note, flush=True)
        check_output_folder(dest, overwrite, slot=run / EXPORT_DIR)
        _write(run, source, dest, dtype)
        return dest, is_adapter(source)
    finally:
        lock.release()


def _write(run: Path, source: Path, dest: Path, dtype: str | None) -> None:
    """The export of ``source`` (``model/`` or a checkpoint of ``run``), written next to ``dest`` and renamed to it."""
    partial = dest.with_name(f".{dest.name}.partial")
    shutil.rmtree(partial, ignore_errors=True)
    skip = (
        "optimizer.pt",
        "scheduler.pt",
        "rng_state*",
        "trainer_state.json",
        "training_args.bin",
        "*.yaml",
        OUTPUT_MARK,
    )
    try:
        if is_adapter(source):
            _merge(run, source, partial, dtype or "float32")
        elif dtype is None:
            shutil.copytree(source, partial, ignore=shutil.ignore_patterns(*skip))
        else:  # the files but the weights, then the weights in dtype
            import torch
            from transformers import AutoModelForCausalLM

            shutil.copytree(source, partial, ignore=shutil.ignore_patterns(*skip, *_WEIGHTS))
            model = AutoModelForCausalLM.from_pretrained(source, dtype=getattr(torch, dtype), local_files_only=True)
            model.save_pretrained(partial, safe_serialization=True)
        mark_output(partial)
    except BaseException:  # a full disk, Ctrl-C: no half-written folder left next to the output
        shutil.rmtree(partial, ignore_errors=True)
        raise
    if dest.exists():
        shutil.rmtree(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    partial.rename(dest)


def _merge(run: Path, adapter: Path, dest: Path, dtype: str) -> None:
    """The run's base model (float32) with ``adapter`` merged in, saved to ``dest`` in ``dtype``."""
    import torch
    from peft import PeftModel

    from mrtpo.tasks import get_task
    from mrtpo.train import load_model

    config = load_config([run / CONFIG_NAME], {"dtype": "float32", "output_dir": str(run)})
    task = get_task(config.run.task, **config.run.task_args)
    base, tokenizer, _ = load_model(config, task)
    merged = PeftModel.from_pretrained(base, str(adapter), is_trainable=False).merge_and_unload()
    card_name = _card_base(adapter)
    if card_name:
        merged.config._name_or_path = card_name
    merged.to(getattr(torch, dtype))
    merged.save_pretrained(dest, safe_serialization=True)
    tokenizer.save_pretrained(dest)
    for name in _COPIED:  # the tokenizer saved with the adapter wins over the base's (same files)
        if (adapter / name).is_file():
            shutil.copyfile(adapter / name, dest / name)


def _card_base(adapter: Path) -> str | None:
    import json

    return json.loads((adapter / "adapter_config.json").read_text()).get("base_model_name_or_path")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="mrtpo export",
        formatter_class=HelpFormatter,
        description="Write a run's final model as one standalone model folder: a LoRA adapter merged into its "
        "base model (peft merge_and_unload), or a copy of a fully fine-tuned model.",
    )
    p.add_argument("run", metavar="RUN", help="run folder of mrtpo train")
    p.add_argument(
        "--output-dir",
        "--out",
        dest="output_dir",
        metavar="DIR",
        help="where to write the model (default: <RUN>/export)",
    )
    p.add_argument("--overwrite", action="store_true", help="replace DIR if it holds files")
    p.add_argument(
        "--dtype",
        choices=DTYPES,
        help="dtype of the saved weights (default: float32 for a merged LoRA adapter, a fully fine-tuned model's own)",
    )
    return p


def main(argv: list[str] | None = None) -> int:
    ns = _parser().parse_args(argv)
    from mrtpo.models import ModelLoadError

    try:
        dest, merged = _export(ns.run, ns.output_dir, ns.overwrite, ns.dtype)
    except (ConfigError, ModelLoadError, RunLockError) as exc:
        print(f"mrtpo export: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # a full disk, a read-only folder: the run is untouched, the output not written
        print(
            f"mrtpo export: error: cannot write {exc.filename or ns.output_dir}: {exc.strerror or exc}", file=sys.stderr
        )
        return 2
    print(f"exported ({'merged LoRA adapter' if merged else 'copy'}): {dest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
