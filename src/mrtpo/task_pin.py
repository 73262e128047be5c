"""A run pins its task: the task file, its reward sources and its data files, hashed into the run.

A run of a task file (``--task path/task.yaml`` or a ``task:`` block) writes :data:`PIN_NAME` into its
folder: the SHA-256 of the task file, of each reward's source file and of each local dataset file
(:func:`task_fingerprint`). ``--resume`` hashes them again and stops, naming what changed, before any
model loads (:func:`check_task_pin`): a resumed run would otherwise go on under edited rewards or
data without a word. ``--allow-task-change`` resumes anyway; the change is recorded in the pin
(``changes``: the step and the files) and the pin follows the new files. A built-in task is the
package's own code and pins nothing.
"""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path
from typing import Any

from mrtpo.config import ConfigError
from mrtpo.model_presets import sha256_file
from mrtpo.tasks import is_task_file

#: The pin in a run folder.
PIN_NAME = "task_pin.json"


def _label(path: Path, folder: Path) -> str:
    return str(path.relative_to(folder)) if path.is_relative_to(folder) else str(path)


def _reward_sources(spec: Any) -> list[Path]:
    refs = spec.rewards if isinstance(spec.rewards, list) else list(spec.rewards)
    out = []
    for ref in refs:
        where = str(ref).split(":")[0]
        if where.endswith(".py") or "/" in where:
            out.append((spec.folder / where).resolve())
        else:
            found = importlib.util.find_spec(where)
            if found is not None and found.origin and os.path.isfile(found.origin):
                out.append(Path(found.origin))
    return out


def _data_files(spec: Any) -> list[Path]:
    """The local files the dataset reads (a hub id has none)."""
    ref = spec.dataset
    refs = (
        [v for vs in ref.values() for v in ([vs] if isinstance(vs, str) else vs)]
        if isinstance(ref, dict)
        else [ref]
        if isinstance(ref, str)
        else list(ref)
    )
    out = []
    for value in refs:
        path = (spec.folder / str(value)).resolve()
        if path.is_file():
            out.append(path)
        elif path.is_dir():
            out += sorted(p for p in path.rglob("*") if p.is_file())
    return out


def task_fingerprint(task: Any) -> dict[str, str]:
    """``"<kind> <file>" -> sha256`` for a task file's own file, its reward sources and its data files
    (paths relative to the task file's folder); ``{}`` for a built-in or plugin task."""
    if not is_task_file(task):
        return {}
    from mrtpo.tasks.from_config import read_spec

    spec = read_spec(task)
    files = [("task file", Path(task).resolve())]
    files += [("reward source", p) for p in _reward_sources(spec)]
    files += [("dataset", p) for p in _data_files(spec)]
    return {f"{kind} {_label(path, spec.folder)}": sha256_file(path) for kind, path in files if path.is_file()}


def read_pin(run: Path) -> dict[str, Any] | None:
    path = Path(run) / PIN_NAME
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{path} is unreadable ({exc}); restore it, or remove it to resume unchecked") from None


def changed_files(run: Path, task: Any) -> tuple[list[str], dict[str, str]] | None:
    """What of the task changed since the run's pin (sorted as pinned, new files last), and the current
    fingerprint; None when the run has no pin (started by an older mrtpo, or a built-in task)."""
    pin = read_pin(run)
    if pin is None:
        return None
    now = task_fingerprint(task)
    before = pin.get("files", {})
    changed = [k for k in before if now.get(k) != before[k]] + [k for k in now if k not in before]
    if pin.get("task") != str(task):
        changed.insert(0, f"task {pin.get('task')!r} -> {str(task)!r}")
    return changed, now


def check_task_pin(run: Path, task: Any, allow: bool) -> list[str]:
    """On ``--resume``: a :class:`ConfigError` naming what changed in the task since ``run`` started,
    unless ``allow``; returns what changed (to record, :func:`write_pin`)."""
    found = changed_files(run, task)
    if not found or not found[0]:
        return []
    changed = found[0]
    if not allow:
        raise ConfigError(
            f"the task changed since this run started: {', '.join(changed)} (hashed in "
            f"{Path(run) / PIN_NAME}); restore them, or resume under the changed task with "
            "--allow-task-change (recorded in the run)"
        )
    return changed


def write_pin(run: Path, task: Any, changed: list[str] | None = None, step: int | None = None) -> None:
    """Pin ``task`` into ``run`` (a task without files to pin writes nothing); ``changed`` files allowed at
    ``step`` are appended to the pin's ``changes``."""
    files = task_fingerprint(task)
    pin = read_pin(run) or {}
    if not files and not pin:
        return
    changes = pin.get("changes", [])
    if changed:
        changes.append({"at_step": step, "changed": changed})
    record = {"task": str(task), "files": files, "changes": changes}
    path = Path(run) / PIN_NAME
    tmp = path.with_name(f".{PIN_NAME}.tmp")
    tmp.write_text(json.dumps(record, indent=1) + "\n")
    os.replace(tmp, path)


__all__ = ["PIN_NAME", "changed_files", "check_task_pin", "read_pin", "task_fingerprint", "write_pin"]
