"""What a task is: the base class every task derives from, with every hook the code asks of one.

Three methods every task implements (:meth:`Task.load`, :meth:`Task.verifiers`, :meth:`Task.evaluate`);
the rest are optional hooks with a default here, each read by one command. A task overrides the hooks
it has; code that needs to know whether a task has one asks :func:`implements` (a plugin's task that
does not derive from :class:`Task` is read the same way, by its attributes). The registry lives in
:mod:`mrtpo.tasks`; this module sits below it so the credit gym's tasks can derive from :class:`Task`
without knowing the registry.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from mrtpo.counterfactual import default_render_prompt
from mrtpo.rewards import VerifierReward
from mrtpo.verifiers import Example, Verifier

#: ``(reward name, span kind, [(start, end), ...])``: the characters of a text one reward's checker reads.
CheckedSpans = list[tuple[str, str, list[tuple[int, int]]]]


class Task:
    """A task: its data, its rewards (the columns of R[N, K]) and its held-out scoring."""

    #: The name it is registered under (``--task NAME``).
    name: str = ""
    #: The split names :meth:`load` accepts (``mrtpo eval --split``); ``None``: not declared.
    splits: tuple[str, ...] | None = None
    #: Completion budget for ``mrtpo eval`` and the benchmarks; ``None``: the command's default for the task.
    max_new_tokens: int | None = None
    #: Top-level keys of :meth:`evaluate` that ``bench learn`` plots, the first the headline; empty: its default.
    heldout_metrics: tuple[str, ...] = ()

    def load(self, split: str, limit: int | None = None) -> Sequence[Example]:
        """Examples of ``split`` ("train" or "eval"), in a fixed documented order: a list, or a sequence that
        builds each when read (a task file's, :mod:`mrtpo.tasks.lazy_rows`)."""
        raise NotImplementedError(f"{type(self).__name__}.load")

    def verifiers(self) -> list[Verifier]:
        """The rewards, in a fixed order (the columns of R[N, K])."""
        raise NotImplementedError(f"{type(self).__name__}.verifiers")

    def evaluate(self, outputs: list[str], examples: list[Example]) -> dict[str, Any]:
        """Score model outputs on held-out examples with the benchmark's own checker."""
        raise NotImplementedError(f"{type(self).__name__}.evaluate")

    def reward_funcs(self, examples: Mapping[str, Example]) -> list[Any]:
        """The functions the trainer calls as TRL calls reward functions, one per reward in :meth:`verifiers`'
        order. Default: each verifier wrapped to find its example by ``example_id`` in ``examples`` (id -> example),
        with the task's :meth:`checked_spans` where it has them (the ``oracle``'s known positions)."""
        spans_of = self.checked_spans if implements(self, "checked_spans") else None
        return [VerifierReward(v, examples, spans_of) for v in self.verifiers()]

    def trainer_rows(self, examples: Sequence[Example]) -> Any:
        """The trainer's dataset rows for ``examples``: ``prompt`` (messages or text, as TRL takes it), the
        columns the reward functions read, and ``example_id``; a list of dicts, or a ``datasets.Dataset`` of
        them (a task file's). Default: the messages and the id."""
        return [{"prompt": ex.messages, "example_id": ex.id} for ex in examples]

    def render_prompt(self, example: Example, tokenizer: Any) -> str:
        """The exact prompt string the policy sees; generation and the evidence replays both use it
        (:func:`mrtpo.counterfactual.prompt_renderer`). Default: the chat template of ``example.messages``
        with ``example.tools`` and the generation prompt."""
        return default_render_prompt(example, tokenizer)

    def may_have_checked_spans(self, example: Example) -> bool:
        """Whether :meth:`checked_spans` can find a span in a completion of ``example`` (``bench lift``)."""
        return False

    def checked_spans(self, example: Example, text: str) -> CheckedSpans:
        """The characters of ``text`` each reward's checker reads (``bench lift``, the ``oracle`` on real tasks)."""
        return []

    def relevant_positions(self, example: Example, words: Any) -> dict[str, list[int]]:
        """Reward name -> the completion's word positions its reward reads, where the task knows them exactly
        (the credit gym: ``bench gym``'s precision)."""
        raise NotImplementedError(f"task {self.name!r} does not know its relevant positions")

    def policy(self, dtype: Any = None) -> tuple[Any, Any]:
        """``(model, tokenizer)``: the task's own warm-started policy (``--model gym``)."""
        raise NotImplementedError(f"task {self.name!r} ships no policy of its own (use a gym-* task)")

    def warm_start_pairs(self, limit: int | None = None) -> list[tuple[Example, str]]:
        """``(example, target completion)`` pairs for ``mrtpo sft`` when no data file is given."""
        raise NotImplementedError(f"task {self.name!r} has no warm start pairs of its own")

    def warm_start_identity(self) -> dict[str, Any]:
        """What identifies :meth:`warm_start_pairs`' data (recorded with a warm-started model)."""
        raise NotImplementedError(f"task {self.name!r} has no warm start pairs of its own")


#: Hooks with a default that says "this task has none": :func:`implements` tells whether a task overrides one.
OPTIONAL_HOOKS = ("checked_spans", "relevant_positions", "policy", "warm_start_pairs", "warm_start_identity")


def implements(task: Any, hook: str) -> bool:
    """Whether ``task`` has its own ``hook`` (one of :data:`OPTIONAL_HOOKS`), not :class:`Task`'s default.

    A task not derived from :class:`Task` (a plugin's) has the hook when it has the attribute.
    """
    if hook not in OPTIONAL_HOOKS:
        raise ValueError(f"unknown task hook {hook!r}; optional hooks: {', '.join(OPTIONAL_HOOKS)}")
    own = getattr(type(task), hook, None) or getattr(task, hook, None)
    return own is not None and own is not getattr(Task, hook)


def task_hook(task: Any, hook: str) -> Any:
    """``task``'s own ``hook``, or :class:`Task`'s default bound to it (a plugin's task need not derive from
    :class:`Task`): ``task_hook(task, "trainer_rows")(examples)``."""
    own = getattr(task, hook, None)
    return own if own is not None else getattr(Task, hook).__get__(task)


__all__ = ["OPTIONAL_HOOKS", "CheckedSpans", "Task", "implements", "task_hook"]
