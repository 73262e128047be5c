"""Task families. Each task module owns loading its benchmark, building prompts, its verifiers and
its held-out scoring; it knows nothing about trainers or the credit math.

Tasks register themselves by name with :func:`register_task`; :func:`get_task` looks them up. The
credit gym's synthetic families are tasks too: their classes live in :mod:`mrtpo.gym.task`, which
knows nothing of this registry; they are registered here (:data:`GYM_TASK_NAMES`) on first use.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from mrtpo.task_base import Task, implements

_TASKS: dict[str, Callable[..., Task]] = {}
# Built-in task modules, imported lazily so one task's optional assets never block another.
_BUILTIN_MODULES: dict[str, str] = {
    "toolcall": "mrtpo.tasks.toolcall",
    "instructions": "mrtpo.tasks.instructions",
    "sql": "mrtpo.tasks.sql",
}
#: The credit gym's families (classes in :mod:`mrtpo.gym.task`, listed there as ``FAMILIES``).
GYM_TASK_NAMES: tuple[str, ...] = (
    "gym-constraints",
    "gym-answer",
    "gym-call",
    "gym-overlap",
    "gym-tradeoff",
    "gym-long",
)
#: Names of the built-in tasks (the real benchmarks, then the credit gym's synthetic families).
TASK_NAMES: tuple[str, ...] = (*_BUILTIN_MODULES, *GYM_TASK_NAMES)


def register_task(name: str) -> Callable[[Callable[..., Task]], Callable[..., Task]]:
    """Class decorator: ``@register_task("sql")`` makes the task available as ``--task sql``."""

    def wrap(factory: Callable[..., Task]) -> Callable[..., Task]:
        _TASKS[name] = factory
        return factory

    return wrap


class UnknownTaskError(KeyError):
    """No task is registered under the name; the message lists the known ones."""

    def __str__(self) -> str:
        return str(self.args[0])


def task_names() -> list[str]:
    """Every task known now: the built-in ones and those registered since (plugins, task files)."""
    return sorted(set(_TASKS) | set(TASK_NAMES))


def _register_builtin(name: str) -> None:
    """Register the built-in task ``name``: a real benchmark's module registers its own task; the gym's
    families are registered from here (a name a plugin registered first keeps the plugin's task)."""
    if name in GYM_TASK_NAMES:
        from mrtpo.gym.task import FAMILIES

        for family in FAMILIES:
            _TASKS.setdefault(family.name, family)
    else:
        importlib.import_module(_BUILTIN_MODULES[name])


def _unknown(name: str) -> str:
    import difflib

    close = difflib.get_close_matches(str(name), task_names(), n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return (
        f"unknown task {name!r}{hint}; known tasks: {', '.join(task_names())}, or a task file "
        "(path/to/task.yaml with dataset, prompt and rewards; plugins register more through MRTPO_PLUGINS)"
    )


def get_task(name: str, **kwargs: Any) -> Task:
    """Instantiate the task registered under ``name``; a clear error lists the known ones. A name
    ending in ``.yaml`` is a task file (:mod:`mrtpo.tasks.from_config`), registered on first use."""
    if name not in _TASKS and name in TASK_NAMES:
        _register_builtin(name)
    if name not in _TASKS and is_task_file(name):
        from mrtpo.tasks.from_config import load_task_file

        task = load_task_file(name)  # loads the data now: a TaskFileError says what is wrong
        _TASKS[name] = lambda: task
    if name not in _TASKS:
        raise UnknownTaskError(_unknown(name))
    return _TASKS[name](**kwargs)


def is_task_file(name: Any) -> bool:
    """Whether ``name`` is a task file's path (ends in .yaml / .yml) rather than a registered name."""
    return isinstance(name, str) and name.lower().endswith((".yaml", ".yml"))


def task_ref(value: Any, source: str) -> Any:
    """A config layer's ``task`` value as a task name: a ``task:`` mapping in config file ``source``
    becomes that file's absolute path; a relative task-file path is taken from the config file's folder
    (the working directory for the command line). Anything else passes as is (checked by :func:`task_problem`)."""
    from pathlib import Path

    here = Path(source)
    if isinstance(value, dict):
        return str(here.resolve()) if here.is_file() else value
    if is_task_file(value):
        folder = here.parent if here.is_file() else Path.cwd()
        return str((folder / value).resolve())
    return value


def task_problem(name: Any) -> str | None:
    """Why ``name`` names no usable task (unknown, with a did-you-mean; a task file with a missing
    dataset, column or reward), or None. Consults the live registry, so plugin tasks count."""
    if isinstance(name, dict):
        return (
            "a task block (a mapping) must be in a config file (--config); on the command line name a task or "
            "a task file: --task path/to/task.yaml"
        )
    if not isinstance(name, str):
        return f"task must be a name or a task file path, got {name!r}"
    try:
        get_task(name) if is_task_file(name) else None
    except ValueError as exc:  # TaskFileError
        return str(exc)
    if name in _TASKS or name in TASK_NAMES:
        return None
    return _unknown(name)


def task_label(name: str) -> str:
    """A short name for run folders and messages: a task file's own ``name`` (or folder), else ``name``."""
    if is_task_file(name) and name in _TASKS:
        return str(getattr(_TASKS[name](), "name", name))
    return name


def task_settings(name: str) -> dict[str, Any]:
    """Trainer settings a task brings (a task file's reward weights, as ``reward_weights``)."""
    weights = getattr(_TASKS[name](), "reward_weights", None) if is_task_file(name) and name in _TASKS else None
    return {"reward_weights": list(weights)} if weights else {}


__all__ = [
    "GYM_TASK_NAMES",
    "TASK_NAMES",
    "Task",
    "UnknownTaskError",
    "get_task",
    "implements",
    "is_task_file",
    "register_task",
    "task_label",
    "task_names",
    "task_problem",
    "task_ref",
    "task_settings",
]
