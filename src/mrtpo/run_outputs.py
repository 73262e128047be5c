"""What a finished run leaves besides its checkpoints: the final model (or LoRA adapter) in
``<run>/model/``, with its tokenizer and model card.

The folder is written whole or not at all: the trainer saves into ``<run>/.model.partial/``, which
replaces ``model/`` only once complete, so a run (or a resumed run) that fails while saving leaves
the previous ``model/`` as it was. ``mrtpo export`` (:mod:`mrtpo.export`) reads it.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

#: The final model's folder inside a run folder.
FINAL_DIR = "model"
_PARTIAL = ".model.partial"
_OLD = ".model.old"


def is_adapter(folder: Path) -> bool:
    """Whether ``folder`` holds a PEFT (LoRA) adapter rather than a whole model."""
    return (Path(folder) / "adapter_config.json").is_file()


def save_final_model(trainer: Any, out: Path) -> Path:
    """Save ``trainer``'s model (or adapter), tokenizer and model card into ``out/model``; call it on
    every process (the trainer gathers sharded weights), after training. Returns the folder."""
    out = Path(out)
    partial, final = out / _PARTIAL, out / FINAL_DIR
    main = trainer.accelerator.is_main_process
    if main and partial.exists():
        shutil.rmtree(partial)
    trainer.accelerator.wait_for_everyone()
    trainer.save_model(str(partial))
    if main:
        trainer.create_model_card(model_name=out.name)  # the run folder's README.md
        card = out / "README.md"
        if card.is_file():
            shutil.copyfile(card, partial / "README.md")
        (partial / "training_args.bin").unlink(missing_ok=True)  # a pickle; config.yaml says it all
        _swap_in(partial, final)
    trainer.accelerator.wait_for_everyone()
    return final


def _swap_in(new: Path, final: Path) -> None:
    """Put the complete folder ``new`` in place of ``final`` (two renames; the old one goes last)."""
    old = final.with_name(_OLD)
    if old.exists():
        shutil.rmtree(old)
    if final.exists():
        os.replace(final, old)
    os.replace(new, final)
    shutil.rmtree(old, ignore_errors=True)


__all__ = ["FINAL_DIR", "is_adapter", "save_final_model"]
