"""Task families. Each task module owns loading its benchmark, building prompts, its verifiers and
its held-out scoring; it knows nothing about trainers or the credit math.

Tasks register themselves by name with :func:`register_task`; :func:`get_task` looks them up.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any, Protocol

from mrtpo.verifiers import Example, Verifier


class Task(Protocol):
    """What the trainer and ``mrtpo eval`` need from a task."""

    name: str

    def load(self, split: str, limit: int | None = None) -> list[Example]:
        """Examples of ``split`` ("train" or "eval"), in a fixed documented order."""
        ...

    def verifiers(self) -> list[Verifier]:
        """The rewards, in a fixed order (the columns of R[N, K])."""
        ...

    def evaluate(self, outputs: list[str], examples: list[Example]) -> dict[str, Any]:
        """Score model outputs on held-out examples with the benchmark's own checker."""
        ...

    # Optional: ``render_prompt(example, tokenizer) -> str``, the exact prompt string the policy
    # sees. Generation and the evidence replays both use it (see mrtpo.counterfactual.prompt_renderer);
    # without it the chat template is applied to ``example.messages`` with ``example.tools``.
    #
    # Optional, for ``mrtpo bench lift``: ``checked_spans(example, text)`` -> ``[(reward name, span
    # kind, [(start, end), ...])]``, the characters of ``text`` each reward's checker reads, and
    # ``may_have_checked_spans(example) -> bool``, which prompts can have one.


_TASKS: dict[str, Callable[..., Task]] = {}
# Built-in task modules, imported lazily so one task's optional assets never block another.
_BUILTIN_MODULES: dict[str, str] = {
    "toolcall": "mrtpo.tasks.toolcall",
    "instructions": "mrtpo.tasks.instructions",
    "sql": "mrtpo.tasks.sql",
    "gym-constraints": "mrtpo.gym.task",
    "gym-answer": "mrtpo.gym.task",
    "gym-call": "mrtpo.gym.task",
    "gym-overlap": "mrtpo.gym.task",
    "gym-tradeoff": "mrtpo.gym.task",
}
#: Names of the built-in tasks (the real benchmarks, then the credit gym's synthetic families).
TASK_NAMES: tuple[str, ...] = tuple(_BUILTIN_MODULES)


def register_task(name: str) -> Callable[[Callable[..., Task]], Callable[..., Task]]:
    """Class decorator: ``@register_task("sql")`` makes the task available as ``--task sql``."""

    def wrap(factory: Callable[..., Task]) -> Callable[..., Task]:
        _TASKS[name] = factory
        return factory

    return wrap


def get_task(name: str, **kwargs: Any) -> Task:
    """Instantiate the task registered under ``name``; a clear error lists the known ones."""
    if name not in _TASKS and name in _BUILTIN_MODULES:
        importlib.import_module(_BUILTIN_MODULES[name])
    if name not in _TASKS:
        known = sorted(set(_TASKS) | set(_BUILTIN_MODULES))
        raise KeyError(f"unknown task {name!r}; known tasks: {', '.join(known)}")
    return _TASKS[name](**kwargs)


__all__ = ["TASK_NAMES", "Task", "get_task", "register_task"]
