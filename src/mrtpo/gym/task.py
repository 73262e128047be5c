"""The gym tasks: ``gym-constraints``, ``gym-answer``, ``gym-call``, ``gym-overlap`` (the control) and
``gym-tradeoff`` (rewards that trade off inside a response) and ``gym-long`` (long high-entropy filler,
rules read at 1–2 tokens). :mod:`mrtpo.tasks` registers them
(:data:`FAMILIES`) like the real ones; nothing here knows of the registry.

Each task generates its train and held-out prompts from a seed (held-out prompts from another
stream), names its rewards (verifiers with evidence), scores held-out outputs, reports each
reward's ground-truth relevant positions for a response, and produces the noisy demonstrations its
tiny policy is warm-started on (:mod:`mrtpo.gym.policy`). ``model: gym`` in a training config means
"this task's warm-started policy", built and cached on first use.
"""

from __future__ import annotations

import random
import warnings
from dataclasses import asdict, dataclass, field
from typing import Any

from mrtpo.counterfactual import DEFAULT_PRIVILEGED_HEADER, append_privileged
from mrtpo.gym import answer, call, constraints, long
from mrtpo.gym.base import GymVerifier, Words, example_rng
from mrtpo.task_base import Task
from mrtpo.verifiers import Example

SPLITS = ("train", "eval")
#: Held-out metrics of ``task.evaluate`` that ``mrtpo bench learn`` plots (the first is the headline).
HELDOUT_METRICS = ("reward_total", "all_correct")
_EVAL_STREAM = 1_000_003  # held-out prompts come from another seed stream
#: The constraints warm start's mixture: clauses per prompt up to this, typical lengths from this set.
WARM_MAX_CLAUSES = 6
WARM_LENGTHS = (8, 16, 32)


@dataclass
class GymSettings:
    """What defines a gym task's prompts and its warm start (every field goes into the cache key)."""

    seed: int = 0
    """seed of the train stream (held-out prompts use another stream)"""
    train_size: int = 4000
    """train prompts (RL revisits them; the warm start draws its own demonstrations)"""
    eval_size: int = 256
    """held-out prompts available"""
    p_follow: float = 0.5
    """the demonstrator's chance of meeting each reward: the warm-started policy's starting point"""
    num_clauses: int = 3
    """constraints: clauses (= rewards) per prompt"""
    length: int = 16
    """constraints: typical response length in words"""
    num_items: int = 3
    """answer: items per prompt"""
    privileged_header: str = DEFAULT_PRIVILEGED_HEADER
    """header of the reference block the warm start shows (the trainer's privileged_header)"""
    policy: dict[str, Any] = field(default_factory=dict)
    """overrides of mrtpo.gym.policy.PolicySpec (model size, warm-start steps)"""


class GymTask(Task):
    """A gym family as a task (see the module docstring). Subclasses set ``name`` and the family hooks."""

    name = "gym"
    heldout_metrics = HELDOUT_METRICS
    #: warm-start optimizer steps of the family's tiny policy (copying items takes longer than a wrapper)
    warm_start_steps = 1000
    splits = SPLITS

    def __init__(self, **settings: Any) -> None:
        unknown = set(settings) - set(GymSettings.__dataclass_fields__)
        if unknown:
            raise TypeError(
                f"unknown {self.name} setting(s) {sorted(unknown)}; "
                f"known: {', '.join(GymSettings.__dataclass_fields__)}"
            )
        self.settings = GymSettings(**settings)
        if not 0.0 <= self.settings.p_follow <= 1.0:
            raise ValueError(f"p_follow must be in [0, 1], got {self.settings.p_follow}")
        self._verifiers = self._make_verifiers()

    # --- family hooks -------------------------------------------------------------------------
    def _make_verifiers(self) -> list[GymVerifier]:
        raise NotImplementedError

    def _make_example(self, rng: random.Random, example_id: str, split: str) -> Example:
        raise NotImplementedError

    def warm_example(self, rng: random.Random) -> Example:
        """A fresh prompt for one warm-start demonstration (never one of the RL split's)."""
        return self._make_example(rng, "warm", "warm")

    def demonstration(self, example: Example, rng: random.Random) -> tuple[list[dict], Words]:
        """A warm-start pair ``(messages, response words)`` for ``example``: sometimes with an in-prompt
        clause hidden or the privileged reference shown, so the replays' contexts are in distribution."""
        raise NotImplementedError

    # --- the Task protocol ----------------------------------------------------------------------
    def cache_key(self) -> dict[str, Any]:
        """What the prompts and the warm start depend on (train_size and eval_size excluded)."""
        key = asdict(self.settings)
        key.pop("train_size")
        key.pop("eval_size")
        return {"task": self.name, **key}

    def load(self, split: str, limit: int | None = None) -> list[Example]:
        if split not in SPLITS:
            raise ValueError(f"unknown split {split!r} for task {self.name!r}; expected one of {SPLITS}")
        size = self.settings.train_size if split == "train" else self.settings.eval_size
        n = size if limit is None else min(limit, size)
        seed = self.settings.seed + (_EVAL_STREAM if split == "eval" else 0)
        return [self._make_example(example_rng(seed, split, i), f"{self.name}-{split}-{i}", split) for i in range(n)]

    def verifiers(self) -> list[GymVerifier]:
        return list(self._verifiers)

    @property
    def max_new_tokens(self) -> int:
        """Room for the longest answer the family asks for (and a few words of slack)."""
        if isinstance(self, LongTask):
            return self.settings.length + self.settings.length // 4 + 8
        return 2 * self.settings.length + 8 if isinstance(self, ConstraintsTask) else 4 * self.settings.num_items + 16

    def evaluate(self, outputs: list[str], examples: list[Example]) -> dict[str, Any]:
        """Mean of each reward, their sum (``reward_total``) and the share meeting every reward."""
        if len(outputs) != len(examples):
            raise ValueError(f"{len(outputs)} outputs for {len(examples)} examples")
        scores = [[v(o, ex) for v in self._verifiers] for o, ex in zip(outputs, examples)]
        n = max(len(scores), 1)
        metrics: dict[str, Any] = {
            f"reward/{v.name}": sum(s[i] or 0.0 for s in scores) / n for i, v in enumerate(self._verifiers)
        }
        metrics["reward_total"] = sum(sum(x or 0.0 for x in s) for s in scores) / n
        metrics["all_correct"] = sum(all(x == 1.0 for x in s) for s in scores) / n
        metrics["n"] = len(scores)
        return metrics

    def relevant_positions(self, example: Example, words: Words) -> dict[str, list[int]]:
        """Each reward's ground-truth relevant token positions in a response (``len(words)``: end of turn)."""
        return {v.name: v.positions(words, example) for v in self._verifiers}

    def reward_kind(self, example: Example, name: str) -> str:
        """What reward ``name`` checks in ``example`` (constraints: the clause kind; else the name)."""
        return name

    def may_have_checked_spans(self, example: Example) -> bool:
        return True

    def checked_spans(self, example: Example, text: str) -> list[tuple[str, str, list[tuple[int, int]]]]:
        """The ground truth as character spans of ``text`` (for ``mrtpo bench lift``; the end-of-turn
        token has no characters, so a position there is left out)."""
        words = text.split()
        starts, at = [], 0
        for w in words:
            at = text.index(w, at)
            starts.append(at)
            at += len(w)
        out = []
        for name, positions in self.relevant_positions(example, words).items():
            spans = [(starts[p], starts[p] + len(words[p])) for p in positions if p < len(words)]
            if spans:
                out.append((name, f"{self.name}/{name}", spans))
        return out

    def warm_init(self, model, spec) -> None:
        """Initialise ``model`` before its warm start (:func:`mrtpo.gym.policy.warm_start`); default: as built."""

    def policy(self, dtype=None):
        """``(model, tokenizer)``: this task's warm-started tiny policy: the shipped one where its settings
        are shipped (:mod:`mrtpo.gym.shipped`), else built and cached on first use."""
        from mrtpo.gym.policy import load_warm_start
        from mrtpo.gym.shipped import NOT_INSTALLED, load_shipped, policies_installed, shipped_policy

        folder = shipped_policy(self)
        if folder is not None:
            return load_shipped(folder, dtype)
        if not policies_installed():
            warnings.warn(NOT_INSTALLED, stacklevel=2)
        return load_warm_start(self, dtype=dtype)

    def _reference(self, messages: list[dict], text: str) -> list[dict]:
        return append_privileged(messages, text, self.settings.privileged_header)


class ConstraintsTask(GymTask):
    """Topic + ``num_clauses`` clauses (include, avoid, start, end, before, count, length)."""

    name = "gym-constraints"
    overlap = False
    warm_start_steps = 2000

    def _make_verifiers(self) -> list[GymVerifier]:
        return constraints.verifiers(self.settings.num_clauses, overlap=self.overlap)

    def cache_key(self) -> dict[str, Any]:
        """One warm start serves every ``num_clauses`` and ``length``: it is trained on a mixture."""
        key = super().cache_key()
        key.pop("num_clauses")
        key.pop("length")
        return key

    def reward_kind(self, example, name):
        if self.overlap:
            return name
        return example.gold["clauses"][int(name[1:]) - 1]["kind"]

    def warm_example(self, rng):
        """A prompt with 1..6 clauses and a typical length of 8, 16 or 32 words (the sweeps' range)."""
        num_clauses = 1 if self.overlap else rng.randint(1, WARM_MAX_CLAUSES)
        return constraints.make_example(
            rng, "warm", "warm", num_clauses=num_clauses, length=rng.choice(WARM_LENGTHS), overlap=self.overlap
        )

    def _make_example(self, rng, example_id, split):
        return constraints.make_example(
            rng,
            example_id,
            split,
            num_clauses=self.settings.num_clauses,
            length=self.settings.length,
            overlap=self.overlap,
        )

    def demonstration(self, example, rng):
        n = len(example.gold["clauses"])
        hidden = [False] * n
        if n > 0 and rng.random() < 0.3:
            hidden[rng.randrange(n)] = True
        words = constraints.demonstrate(example, rng, self.settings.p_follow, visible=[not h for h in hidden])
        return constraints.without_clauses(example, hidden), words


class OverlapTask(ConstraintsTask):
    """The control: two rewards (at least once, at least twice) on one clause, same evidence and positions."""

    name = "gym-overlap"
    overlap = True


class AnswerTask(GymTask):
    """Transform the items (copy / reverse / keep a category) inside ``<ans> </ans>``: format, valid, result."""

    name = "gym-answer"
    warm_start_steps = 2000

    def _make_verifiers(self):
        return answer.verifiers()

    def _make_example(self, rng, example_id, split):
        return answer.make_example(rng, example_id, split, num_items=self.settings.num_items)

    def demonstration(self, example, rng):
        u = rng.random()
        show_format, show_items, reference = u >= 0.15, not 0.15 <= u < 0.25, u >= 0.7
        words = answer.demonstrate(example, rng, self.settings.p_follow, show_format, show_items, reference)
        messages = answer.hidden_messages(example, show_format, show_items)
        if reference:
            messages = self._reference(messages, " ".join(example.gold["answer"]))
        return messages, words


class CallTask(GymTask):
    """One call against a listed schema, wrapped in ``<call> </call>``: format, correctness."""

    name = "gym-call"

    def _make_verifiers(self):
        return call.verifiers()

    def _make_example(self, rng, example_id, split):
        return call.make_example(rng, example_id, split)

    def demonstration(self, example, rng):
        u = rng.random()
        show_format, reference = u >= 0.2, u >= 0.7
        words = call.demonstrate(example, rng, self.settings.p_follow, show_format, reference)
        messages = example.messages if show_format else call.hidden_messages(example)
        if reference:
            messages = self._reference(messages, example.gold["call"])
        return messages, words


class TradeoffTask(ConstraintsTask):
    """The conflict shape: two rules on disjoint tokens (``start with W``: the first word; ``end with Z``:
    the last) that the demonstrator, and so the warm-started policy, mostly meets one at a time.

    A demonstration meets both rules with probability :data:`TRADEOFF_BOTH` and exactly one otherwise
    (each half the time), so most sampled groups have ``c1 + c2`` constant: GDPO's two normalised
    advantages are then negatives of each other and sum to 0 for every completion, while per-reward
    token credit still pushes the first word toward ``W`` and the last toward ``Z``. Nothing in the task
    stops a response from meeting both: the trade-off is the starting policy's, for RL to undo.
    """

    name = "gym-tradeoff"
    warm_start_steps = 1000

    def _make_verifiers(self):
        return constraints.verifiers(2)

    def cache_key(self):
        return GymTask.cache_key(self)

    def reward_kind(self, example, name):
        return example.gold["clauses"][int(name[1:]) - 1]["kind"]

    def warm_example(self, rng):
        return self._make_example(rng, "warm", "warm")

    def _make_example(self, rng, example_id, split):
        return constraints.make_example(
            rng, example_id, split, num_clauses=2, length=self.settings.length, kinds=TRADEOFF_KINDS
        )

    def demonstration(self, example, rng):
        hidden = [False, False]
        if rng.random() < 0.3:
            hidden[rng.randrange(2)] = True
        one = rng.randrange(2)
        follow = [True, True] if rng.random() < TRADEOFF_BOTH else [i == one for i in range(2)]
        words = constraints.demonstrate(
            example, rng, self.settings.p_follow, visible=[not h for h in hidden], follow=follow
        )
        return constraints.without_clauses(example, hidden), words


class LongTask(GymTask):
    """64 or 128 words of uniform filler and ``num_clauses`` (3–6) rules each read at 1–2 tokens
    (:mod:`mrtpo.gym.long`); defaults: 4 rules, 64 words."""

    name = "gym-long"
    # short: long rows are slow on a CPU, and RL needs room above the start; the filler's unigram and the
    # end of turn are learnt in the first hundred steps
    warm_start_steps = 150

    def __init__(self, **settings: Any) -> None:
        settings.setdefault("num_clauses", 4)
        settings.setdefault("length", 64)
        super().__init__(**settings)

    def _make_verifiers(self):
        return long.verifiers(self.settings.num_clauses)

    def cache_key(self):
        """One warm start serves 3–6 rules and both lengths: it is trained on a mixture."""
        key = super().cache_key()
        key.pop("num_clauses")
        key.pop("length")
        key.pop("num_items")
        return {**key, "init": WARM_INIT}

    def warm_init(self, model, spec) -> None:
        """Start the warm start from ``gym-constraints``' warm start of the same seed: it already copies
        a rule's word from the prompt to the response, which 150 steps on long rows alone do not teach
        (the rule words' probability stays below the filler's); the 150 steps here teach the filler,
        the lengths and this prompt's form."""
        source, _ = ConstraintsTask(policy={"seed": spec.seed}).policy()
        model.load_state_dict(source.state_dict())

    def reward_kind(self, example, name):
        return example.gold["clauses"][int(name[1:]) - 1]["kind"]

    def warm_example(self, rng):
        return long.make_example(
            rng, "warm", "warm", num_rules=rng.randint(long.MIN_RULES, long.MAX_RULES), length=rng.choice(long.LENGTHS)
        )

    def _make_example(self, rng, example_id, split):
        return long.make_example(
            rng, example_id, split, num_rules=self.settings.num_clauses, length=self.settings.length
        )

    def demonstration(self, example, rng):
        n = len(example.gold["clauses"])
        hidden = [False] * n
        if rng.random() < 0.3:
            hidden[rng.randrange(n)] = True
        words = long.demonstrate(example, rng, self.settings.p_follow, visible=[not h for h in hidden])
        return long.without_rules(example, hidden), words


#: The family whose warm start of the same seed initialises gym-long's (:meth:`LongTask.warm_init`).
WARM_INIT = "gym-constraints"
#: The trade-off family's two rules and the demonstrator's chance of meeting both.
TRADEOFF_KINDS = ("start", "end")
TRADEOFF_BOTH = 0.1

#: Every gym family, in the order of :data:`mrtpo.tasks.GYM_TASK_NAMES` (which registers them by ``name``).
FAMILIES: tuple[type[GymTask], ...] = (ConstraintsTask, AnswerTask, CallTask, OverlapTask, TradeoffTask, LongTask)

__all__ = [
    "FAMILIES",
    "HELDOUT_METRICS",
    "SPLITS",
    "TRADEOFF_BOTH",
    "TRADEOFF_KINDS",
    "AnswerTask",
    "CallTask",
    "ConstraintsTask",
    "GymSettings",
    "GymTask",
    "LongTask",
    "OverlapTask",
    "TradeoffTask",
]
