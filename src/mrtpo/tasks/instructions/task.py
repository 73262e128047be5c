"""The ``instructions`` task: multi-constraint instruction following (docs/design.md#tasks).

Splits (fixed order):

* ``"train"`` — generated prompts (:mod:`.generate`): ``train_size`` examples of the stream
  defined by ``seed``, ``pool``, ``anchor``, ... (``limit`` overrides the size); ``classes``
  restricts the drawn constraints to those instruction ids (``"local"``: the classes a checker reads
  at a few positions, :data:`.pools.LOCAL_CLASSES`);
* ``"eval"`` (alias ``"eval_ifeval"``) — IFEval's 541 prompts; with ``classes`` set, ``"eval"`` is
  instead generated prompts of the same classes from indices :data:`HELD_OUT_START` on (IFEval's
  prompts carry other classes) and ``"eval_ifeval"`` stays IFEval;
* ``"eval_ifbench"`` — IFBench's 300 test prompts.

Rewards: ``constraint_1`` .. ``constraint_5`` (:mod:`.verifiers`). Held-out scoring:
:func:`.evaluate.evaluate` (prompt/instruction level, strict/loose).
"""

from __future__ import annotations

from typing import Any

from mrtpo.task_base import Task
from mrtpo.tasks import register_task
from mrtpo.tasks.instructions import data, evaluate as _evaluate, generate as _generate, spans as _spans
from mrtpo.tasks.instructions.verifiers import ConstraintVerifier, slot_verifiers
from mrtpo.verifiers import Example

__all__ = ["HELD_OUT_SIZE", "HELD_OUT_START", "InstructionsTask", "SPLITS"]

SPLITS = ("train", "eval", "eval_ifeval", "eval_ifbench")
#: With ``classes`` set, ``"eval"`` is the generator's stream from this index on (held out from any
#: training set shorter than it), ``HELD_OUT_SIZE`` prompts unless ``limit`` says otherwise.
HELD_OUT_START = 1_000_000
HELD_OUT_SIZE = 512


@register_task("instructions")
class InstructionsTask(Task):
    """IFEval/IFBench constraints, one reward per constraint slot."""

    name = "instructions"

    def __init__(
        self,
        train_size: int = 2000,
        seed: int = 0,
        min_constraints: int = 1,
        max_constraints: int = 5,
        pool: str = "ifeval",
        anchor: tuple[str, ...] | list[str] | str | None = (),
        min_words_range: tuple[int, int] = (40, 120),
        word_budget: int | None = None,
        reward_mode: str = "strict",
        classes: tuple[str, ...] | list[str] | str | None = (),
    ) -> None:
        if train_size < 0:
            raise ValueError(f"train_size must be >= 0, got {train_size}")
        self.train_size = train_size
        self.generator = _generate.GeneratorConfig(
            seed=seed,
            min_constraints=min_constraints,
            max_constraints=max_constraints,
            pool=pool,
            anchor=tuple([anchor] if isinstance(anchor, str) else (anchor or ())),
            min_words_range=tuple(min_words_range),
            word_budget=word_budget,
            classes=tuple([classes] if isinstance(classes, str) else (classes or ())),
        )
        self._verifiers = slot_verifiers(reward_mode)

    def load(self, split: str, limit: int | None = None) -> list[Example]:
        if split == "train":
            return _generate.generate(self.train_size if limit is None else limit, self.generator)
        if split == "eval" and self.generator.classes:
            return _generate.generate(HELD_OUT_SIZE if limit is None else limit, self.generator, start=HELD_OUT_START)
        if split in ("eval", "eval_ifeval"):
            return data.load_ifeval(limit, split=split)
        if split == "eval_ifbench":
            return data.load_ifbench(limit, split=split)
        raise ValueError(f"unknown split {split!r} for task 'instructions'; expected {SPLITS}")

    def verifiers(self) -> list[ConstraintVerifier]:
        return list(self._verifiers)

    def evaluate(self, outputs: list[str], examples: list[Example]) -> dict[str, Any]:
        return _evaluate.evaluate(outputs, examples)

    def may_have_checked_spans(self, example: Example) -> bool:
        """Some constraint of ``example`` reads a local span (:mod:`.spans`; ``mrtpo bench lift``)."""
        return _spans.has_span_constraint(example)

    def checked_spans(self, example: Example, text: str) -> list[tuple[str, str, list[tuple[int, int]]]]:
        """Where each constraint's checker reads ``text`` (:mod:`.spans`), for ``mrtpo bench lift``."""
        return _spans.checked_spans(example, text, [v.name for v in self._verifiers])
