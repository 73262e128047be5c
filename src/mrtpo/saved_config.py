"""The text of a run's ``config.yaml``: what the user chose, apart from what the machine decided.

Some settings are decided by the machine the run started on unless the user set them: ``use_cpu``
(no CUDA here), the mixed-precision flags TRL derives from the device (``bf16``, ``fp16``), and the
weights' ``dtype`` a CPU picks from its bf16 features (:func:`mrtpo.machine.choose_cpu_dtype`).
Stored as settings, they would be re-applied wherever the file is loaded, so a GPU machine re-running
a CPU run's file would train on the CPU. They are written as comments instead, under their own
heading: a reader sees what this machine chose, and a re-run decides them again for its own machine.
A value the user set explicitly is a choice, and stays a setting.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

import yaml

from mrtpo.config import RunConfig, RunSettings

#: Settings the machine decides when the user leaves them unset.
MACHINE_KEYS = ("use_cpu", "bf16", "fp16", "dtype")

HEADER = "# mrtpo train: every setting this run used. Re-run with `mrtpo train --config <this file>`.\n"


def machine_decided(config: RunConfig) -> dict[str, Any]:
    """The settings of ``config`` that the machine decided (:data:`MACHINE_KEYS` the user did not set)."""
    flat = config.to_flat()
    return {k: flat[k] for k in MACHINE_KEYS if k in flat and k not in config.explicit}


def config_text(config: RunConfig) -> str:
    """``config.yaml``: run settings, the MRTPOConfig fields, then the machine's choices as comments."""
    flat = config.to_flat()
    machine = machine_decided(config)
    run_names = [f.name for f in dataclasses.fields(RunSettings)]
    run_part = {k: flat[k] for k in run_names if k not in machine}
    trainer_part = {k: v for k, v in flat.items() if k not in run_names and k not in machine}
    text = (
        HEADER
        + "# Run-level settings:\n"
        + yaml.safe_dump(run_part, sort_keys=False)
        + "# MRTPOConfig (TRL GRPOConfig + credit assignment) fields:\n"
        + yaml.safe_dump(trainer_part, sort_keys=False)
    )
    if machine:
        lines = yaml.safe_dump(machine, sort_keys=False).splitlines()
        text += (
            "# Decided by the machine this run started on, not set by the user: a re-run decides them\n"
            "# again for its own machine (GPU or CPU). Uncomment one to fix it.\n"
            + "".join(f"# {line}\n" for line in lines)
        )
    return text


def write_config(config: RunConfig, path: str | os.PathLike) -> Path:
    """Write ``config.yaml`` (:func:`config_text`), atomically: a crash leaves the old file or the new one."""
    path = Path(path)
    text = config_text(config)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
    return path


__all__ = ["MACHINE_KEYS", "config_text", "machine_decided", "write_config"]
