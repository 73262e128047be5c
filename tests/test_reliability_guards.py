"""Issue 41's reliability probes that need no model: output folders that ``mrtpo export`` may not
replace, numeric settings checked once for the command line, task files and the Python API, one
writer per run folder, reward functions with a deadline, and a run that pins its task.

Every run folder here is made by hand (a ``config.yaml`` and a ``model/`` of a few bytes): exporting a
full fine-tuning run copies ``model/`` and loads nothing.
"""

import errno
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mrtpo.cli import main as cli_main
from mrtpo.config import ConfigError, load_config
from mrtpo.export import export_model


def make_run(folder: Path) -> Path:
    """A finished full fine-tuning run as ``mrtpo export`` sees it: config.yaml, a log, a checkpoint, model/."""
    (folder / "model").mkdir(parents=True)
    (folder / "model" / "config.json").write_text('{"model_type": "qwen2"}')
    (folder / "model" / "model.safetensors").write_bytes(b"weights")
    (folder / "config.yaml").write_text("task: sql\n")
    (folder / "metrics.jsonl").write_text('{"step": 1}\n')
    (folder / "checkpoint-1").mkdir()
    (folder / "checkpoint-1" / "trainer_state.json").write_text('{"global_step": 1}')
    return folder


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def export_error(capsys, *argv) -> str:
    """``mrtpo export`` refusing: exit 2, one line on stderr, no traceback."""
    assert cli_main(["export", *map(str, argv)]) == 2
    out, err = capsys.readouterr()
    lines = [line for line in err.splitlines() if line.strip()]
    assert "Traceback" not in out + err and len(lines) == 1 and lines[0].startswith("mrtpo export: error: "), err
    return lines[0]


# --------------------------------------------------------------------------------------------
# 1. Output folders export may not replace.
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("where, why", [
    ("run", "is a run folder"),  # --output-dir RUN --overwrite deleted the run, then crashed
    ("parent", "holds a run"),  # ... and the parent case every other run and file in it
    ("run/model", "is inside the run folder"),
    ("run/checkpoint-1", "is a checkpoint"),
    ("run/checkpoint-1/sub", "is inside the checkpoint"),
    ("other", "holds files mrtpo export did not write"),
    ("file.txt", "is a file"),
])
def test_export_refuses_an_output_that_is_or_holds_a_run_or_other_files(tmp_path, capsys, where, why):
    run = make_run(tmp_path / "run")
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("mine")
    (tmp_path / "file.txt").write_text("mine")
    dest = {"parent": tmp_path}.get(where, tmp_path / where)
    before = snapshot(tmp_path)
    line = export_error(capsys, run, "--output-dir", dest, "--overwrite")
    assert f"{dest} {why}" in line
    assert snapshot(tmp_path) == before
    assert not list(tmp_path.glob(".*.partial"))


def test_export_replaces_only_its_own_earlier_export(tmp_path, capsys):
    run = make_run(tmp_path / "run")
    dest = tmp_path / "merged"
    assert export_model(run, dest) == dest
    assert (dest / "model.safetensors").read_bytes() == b"weights"
    line = export_error(capsys, run, "--output-dir", dest)
    assert f"{dest} holds an earlier export: --overwrite replaces it" in line
    assert export_model(run, dest, overwrite=True) == dest
    # The run's own export slot (the default) is replaced like any earlier export.
    assert export_model(run) == run / "export"
    assert export_model(run, overwrite=True) == run / "export"
    (dest / "mine.txt").write_text("added by hand")  # an export with files of the user's: not replaced
    assert "holds files mrtpo export did not write (mine.txt)" in export_error(capsys, run, "--output-dir", dest,
                                                                                "--overwrite")
