"""How reward functions are called: TRL 1.16's ``GRPOTrainer._calculate_rewards`` convention.

TRL calls each (non-model) reward function once per batch with keywords only::

    fn(prompts=[...], completions=[...], completion_ids=[[int]], trainer_state=TrainerState,
       log_extra=fn(column, values), log_metric=fn(name, value), **{column: [value per row]})

where every dataset column but ``prompt`` / ``completion`` / ``completion_ids`` comes as a list with
one entry per completion. A conversational prompt (a list of ``{role, content}`` messages) gives
message completions ``[{"role": "assistant", "content": text}]``; a text prompt is a raw
continuation and gives text completions.

The trainer is TRL itself, so training follows this by construction. This module holds what the
other callers need to match it: the check that a function can be called so (its required
arguments are TRL keywords or dataset columns, and it takes every keyword TRL passes), made
before any model loads, and :func:`call_reward`, which makes TRL's call outside a trainer
(``mrtpo eval``, ``mrtpo explain``).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any

#: The keywords TRL passes to every reward function besides the dataset columns.
TRL_KEYWORDS: tuple[str, ...] = ("prompts", "completions", "completion_ids", "trainer_state", "log_extra", "log_metric")
#: Dataset columns TRL keeps out of the keywords (the prompt comes as ``prompts``).
TRL_HELD_COLUMNS: tuple[str, ...] = ("prompt", "completion", "completion_ids")


def is_conversational(prompt: Any) -> bool:
    """Whether ``prompt`` is chat messages (TRL's conversational format) rather than raw text."""
    return isinstance(prompt, list) and bool(prompt) and all(isinstance(m, Mapping) and "role" in m for m in prompt)


def as_completion(text: str, prompt: Any) -> Any:
    """A completion as TRL hands it to rewards: one assistant message after a chat prompt, else the text."""
    return [{"role": "assistant", "content": text}] if is_conversational(prompt) else text


def reward_keywords(columns: Sequence[str]) -> list[str]:
    """Every keyword TRL passes to a reward function for a dataset with ``columns``."""
    return [*TRL_KEYWORDS, *(c for c in columns if c not in TRL_HELD_COLUMNS and c not in TRL_KEYWORDS)]


def call_problem(fn: Any, name: str, columns: Sequence[str]) -> str | None:
    """Why TRL's call of reward ``fn`` on a dataset with ``columns`` would fail, or None.

    Two failures a signature shows before any model loads: a required argument that is neither a TRL
    keyword nor a column (``accuracy_reward`` needs a ``solution`` column), and a function without
    ``**kwargs`` that does not take a keyword TRL passes (``trainer_state``, a column). Reward models
    (``torch.nn.Module``) and objects without a readable signature pass.
    """
    if _is_module(fn):
        return None
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return None
    params = signature.parameters.values()
    passed = reward_keywords(columns)
    positional_only = [p.name for p in params if p.kind is p.POSITIONAL_ONLY and p.default is p.empty]
    if positional_only:
        return (
            f"reward {name!r} takes {', '.join(positional_only)} positionally only; TRL passes every argument "
            "by keyword (prompts=, completions=, a column's name=)"
        )
    required = [p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.default is p.empty]
    missing = [a for a in required if a not in passed]
    if missing:
        s = "s" if len(missing) > 1 else ""
        return (
            f"reward {name!r} needs the argument{s} {', '.join(map(repr, missing))}, which TRL takes from the "
            f"dataset column{s} of that name; the dataset's columns are {', '.join(columns)} (TRL also passes "
            f"{', '.join(TRL_KEYWORDS)})"
        )
    if not any(p.kind is p.VAR_KEYWORD for p in params):
        accepted = {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
        extra = [k for k in passed if k not in accepted]
        if extra:
            return (
                f"reward {name!r} does not take **kwargs, but TRL also passes {', '.join(extra)}; add **kwargs "
                "to its parameters"
            )
    return None


def check_reward_calls(init: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
    """A ValueError (:func:`call_problem`) for a reward function in a trainer's arguments (``args`` /
    ``kwargs`` as ``init``, GRPOTrainer's ``__init__``, takes them) that TRL's call on its
    ``train_dataset`` would not bind. Datasets without column names (streaming) are not checked."""
    try:
        bound = inspect.signature(init).bind_partial(*args, **kwargs).arguments
    except TypeError:
        return  # GRPOTrainer reports its own argument errors
    funcs, dataset = bound.get("reward_funcs"), bound.get("train_dataset")
    columns = getattr(dataset, "column_names", None)
    if not isinstance(columns, list):
        return
    for fn in funcs if isinstance(funcs, (list, tuple)) else [funcs]:
        if callable(fn):
            problem = call_problem(fn, getattr(fn, "__name__", type(fn).__name__), columns)
            if problem is not None:
                raise ValueError(problem)


def _is_module(fn: Any) -> bool:
    try:
        import torch
    except ImportError:  # pragma: no cover -- torch is a dependency
        return False
    return isinstance(fn, torch.nn.Module)


def _ignore(*_args: Any, **_kwargs: Any) -> None:
    """``log_extra`` / ``log_metric`` outside a trainer: there is no completions table or metric log."""


def call_reward(
    fn: Any,
    prompts: list[Any],
    texts: list[str],
    columns: Mapping[str, list[Any]],
    *,
    completion_ids: list[list[int]] | None = None,
    trainer_state: Any = None,
    log_extra: Callable[..., None] = _ignore,
    log_metric: Callable[..., None] = _ignore,
) -> list[Any]:
    """``fn``'s values for completions ``texts`` of ``prompts``, called as TRL calls it (one batched call).

    ``columns``: the rows' other dataset columns, one list each (the prompt column left out).
    ``completion_ids`` default to empty lists where the caller has no token ids; ``trainer_state``
    to None (outside training there is none). An async reward is run to completion.
    """
    completions = [as_completion(t, p) for t, p in zip(texts, prompts, strict=True)]
    kwargs = {key: list(values) for key, values in columns.items() if key not in TRL_HELD_COLUMNS}
    ids = completion_ids if completion_ids is not None else [[] for _ in texts]
    out = fn(
        prompts=list(prompts),
        completions=completions,
        completion_ids=ids,
        trainer_state=trainer_state,
        log_extra=log_extra,
        log_metric=log_metric,
        **kwargs,
    )
    if inspect.isawaitable(out):
        import asyncio

        out = asyncio.run(out)
    return out


__all__ = [
    "TRL_HELD_COLUMNS",
    "TRL_KEYWORDS",
    "as_completion",
    "call_problem",
    "call_reward",
    "check_reward_calls",
    "is_conversational",
    "reward_keywords",
]
