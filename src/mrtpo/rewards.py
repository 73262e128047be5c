"""Reward functions with evidence, in TRL's reward-function interface.

Two ways to give a reward its evidence:

- decorate an ordinary TRL reward function::

      @evidence("constraint_sentence", placement="in_prompt")   # a dataset column, or a callable(row)
      def no_commas(completions, **kwargs):
          return [float("," not in c) for c in completions]

- wrap a task's :class:`~mrtpo.verifiers.Verifier` with :class:`VerifierReward`, which looks the
  example up by the dataset's ``example_id`` column.

The trainer asks :func:`evidence_for` for each (reward, dataset row) pair; a reward without
declared evidence gets uniform token weights. Every value a reward function returns must be a
finite number, or None / NaN ("not applicable", as in TRL); anything else stops training with an
error naming the function, the row and the value (:func:`check_reward_values`), and each call must
return within the trainer's ``reward_timeout`` (:func:`checked_reward_funcs`).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from mrtpo.verifiers import PLACEMENTS, Evidence, Example, Verifier

EVIDENCE_ATTR = "mrtpo_evidence"


@dataclass(frozen=True)
class EvidenceSpec:
    """Where a reward's evidence comes from: a dataset column name or ``callable(row) -> str | None``."""

    source: str | Callable[[Mapping[str, Any]], str | None]
    placement: str

    def resolve(self, row: Mapping[str, Any]) -> Evidence | None:
        if callable(self.source):
            text = self.source(row)
        else:
            if self.source not in row:
                raise KeyError(f"evidence column {self.source!r} is not in the dataset row (columns: {sorted(row)})")
            text = row[self.source]
        if text is None or (isinstance(text, str) and not text.strip()):
            return None
        return Evidence(str(text), self.placement)  # type: ignore[arg-type]


def evidence(source: str | Callable[[Mapping[str, Any]], str | None], placement: str = "in_prompt"):
    """Decorator declaring a TRL reward function's evidence (see the module docstring)."""
    if placement not in PLACEMENTS:
        raise ValueError(f"placement must be one of {PLACEMENTS}, got {placement!r}")

    def wrap(fn):
        setattr(fn, EVIDENCE_ATTR, EvidenceSpec(source, placement))
        return fn

    return wrap


def completion_text(completion: Any) -> str:
    """TRL passes a completion as a string, or as messages for conversational prompts."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, list) and completion and isinstance(completion[-1], Mapping):
        return str(completion[-1].get("content", ""))
    return str(completion)


class VerifierReward:
    """A task verifier as a TRL reward function; its evidence comes from the verifier itself.

    ``examples`` maps ``example_id`` → :class:`Example`; the dataset must carry that column.
    ``spans_of``: the task's ``checked_spans(example, text)``, where it has one: the characters each
    verifier reads, which the ``oracle`` credit method weights (:mod:`mrtpo.known_positions`).
    """

    def __init__(
        self,
        verifier: Verifier,
        examples: Mapping[str, Example],
        spans_of: Callable[[Example, str], list] | None = None,
    ):
        self.verifier = verifier
        self.examples = examples
        self.spans_of = spans_of
        self.__name__ = verifier.name

    def _example(self, example_id: str) -> Example:
        try:
            return self.examples[example_id]
        except KeyError:
            raise KeyError(f"reward {self.__name__!r}: no example with id {example_id!r}") from None

    def __call__(self, prompts=None, completions=None, example_id=None, **kwargs) -> list[float | None]:
        if example_id is None:
            raise ValueError(f"reward {self.__name__!r} needs the dataset column 'example_id'")
        return [self.verifier(completion_text(c), self._example(i)) for c, i in zip(completions, example_id)]

    def evidence_for(self, row: Mapping[str, Any]) -> Evidence | None:
        return self.verifier.evidence(self._example(row["example_id"]))


def evidence_for(reward_func: Any, row: Mapping[str, Any]) -> Evidence | None:
    """The evidence ``reward_func`` declares for this dataset row (None: uniform weights)."""
    if isinstance(reward_func, VerifierReward):
        return reward_func.evidence_for(row)
    spec = getattr(reward_func, EVIDENCE_ATTR, None)
    return spec.resolve(row) if spec is not None else None


def declares_evidence(reward_func: Any) -> bool:
    return isinstance(reward_func, VerifierReward) or getattr(reward_func, EVIDENCE_ATTR, None) is not None


#: The largest reward magnitude accepted: TRL scores in float32, where the group's std squares each
#: reward (a reward of 1e20 already overflows it to inf, and 1e300 is inf on arrival).
MAX_REWARD = 1e15


class RewardValueError(ValueError):
    """A reward function returned something that is not a reward (a string, ±inf, a non-list)."""


def check_reward_values(name: str, values: Any, example_ids: Sequence[Any] | None = None) -> Any:
    """``values`` unchanged if each is a real number (finite, or NaN: not applicable) or None; else a
    :class:`RewardValueError` naming reward function ``name``, the row (and its ``example_ids`` entry)
    and the value. ±inf and magnitudes beyond :data:`MAX_REWARD` are refused: they would turn every
    advantage of its group into NaN."""
    if isinstance(values, (str, bytes, Mapping)) or not isinstance(values, Sequence):
        raise RewardValueError(
            f"reward function {name!r} returned a {type(values).__name__} ({values!r:.60}), "
            "not a list with one reward per completion"
        )
    for row, value in enumerate(values):
        if value is None:
            continue
        number = _as_number(value)
        if number is not None and (abs(number) <= MAX_REWARD or math.isnan(number)):
            continue
        at = f"row {row}" + (f" (example_id {example_ids[row]!r})" if example_ids and row < len(example_ids) else "")
        kind = (
            f"a {type(value).__name__}"
            if number is None
            else "infinite"
            if math.isinf(number)
            else f"beyond ±{MAX_REWARD:g}, where the group's float32 std overflows"
        )
        raise RewardValueError(
            f"reward function {name!r} returned {value!r:.60} ({kind}) for {at}; a reward must "
            "be a finite number, or None (not applicable)"
        )
    return values


def _as_number(value: Any) -> float | None:
    """``value`` as a float if it is a number (int, float, numpy or 0-dim torch scalar), else None."""
    if isinstance(value, (str, bytes)):
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


class RewardTimeoutError(RewardValueError):
    """A reward function did not return within the trainer's ``reward_timeout``."""


#: Seconds between the notes printed while a reward function runs long.
PROGRESS_EVERY_S = 30.0


def _late(name: str, timeout: float) -> RewardTimeoutError:
    return RewardTimeoutError(
        f"reward function {name!r} did not return within reward_timeout ({float(timeout)} s); "
        "make it faster, or raise reward_timeout (null: no deadline)"
    )


def _with_deadline(func: Callable[..., Any], name: str, timeout: float, kwargs: dict[str, Any]) -> Any:
    """``func(**kwargs)`` in a daemon thread, waited for until ``timeout`` seconds, with a note on stderr
    every :data:`PROGRESS_EVERY_S` seconds. Past the deadline: a :class:`RewardTimeoutError` (the thread
    cannot be stopped; it is left to finish or die with the process, which the error ends)."""
    import sys
    import threading
    import time

    import torch

    result: dict[str, Any] = {}
    grad = torch.is_grad_enabled()  # thread-local: the caller's no_grad() must hold in the worker too

    def run():
        try:
            with torch.set_grad_enabled(grad):
                result["value"] = func(**kwargs)
        except BaseException as exc:  # noqa: BLE001 -- raised again in the caller's thread
            result["error"] = exc

    worker = threading.Thread(target=run, name=f"reward {name}", daemon=True)
    start = time.monotonic()
    worker.start()
    while True:
        left = start + timeout - time.monotonic()
        worker.join(min(PROGRESS_EVERY_S, max(left, 0.0)))
        if not worker.is_alive():
            break
        if time.monotonic() - start >= timeout:
            raise _late(name, timeout)
        print(
            f"scoring: reward function {name!r} still running after {time.monotonic() - start:.1f} s "
            f"(reward_timeout {timeout} s)",
            file=sys.stderr,
            flush=True,
        )
    if "error" in result:
        raise result["error"]
    return result["value"]


def _checked(func: Any, name: str, timeout: float | None = None) -> Any:
    """``func`` with its values passed through :func:`check_reward_values` and, when ``timeout`` is set, a
    deadline of that many seconds per call (a model scores as logits: as is)."""
    import torch
    from trl.trainer.utils import is_async_callable

    if isinstance(func, torch.nn.Module):
        return func
    if is_async_callable(func):

        async def check_async(**kwargs):
            import asyncio

            try:
                values = await (asyncio.wait_for(func(**kwargs), timeout) if timeout else func(**kwargs))
            except TimeoutError:
                raise _late(name, timeout) from None
            return check_reward_values(name, values, kwargs.get("example_id"))

        return check_async

    def check(**kwargs):
        values = _with_deadline(func, name, timeout, kwargs) if timeout else func(**kwargs)
        return check_reward_values(name, values, kwargs.get("example_id"))

    return check


@contextlib.contextmanager
def checked_reward_funcs(trainer: Any) -> Iterator[None]:
    """Within the block, ``trainer``'s reward functions check their values as TRL calls them
    (TRL's ``_calculate_rewards`` stacks them into a float tensor, where a string fails without naming
    the function and ±inf passes), and each call must return within ``trainer.args.reward_timeout``
    seconds (None: no deadline)."""
    original = trainer.reward_funcs
    timeout = getattr(getattr(trainer, "args", None), "reward_timeout", None)
    trainer.reward_funcs = [_checked(f, n, timeout) for f, n in zip(original, trainer.reward_func_names)]
    try:
        yield
    finally:
        trainer.reward_funcs = original


__all__ = [
    "MAX_REWARD",
    "EvidenceSpec",
    "RewardTimeoutError",
    "RewardValueError",
    "VerifierReward",
    "check_reward_values",
    "checked_reward_funcs",
    "completion_text",
    "declares_evidence",
    "evidence",
    "evidence_for",
]
