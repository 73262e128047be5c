"""The one check of a run's numeric settings, shared by the command line, task files and the Python API.

``MRTPOConfig.__post_init__`` calls :func:`check_trainer_numbers` on its own fields, so
``MRTPOConfig(temperature=0)`` fails at construction, as ``temperature=0`` on the command line or in a
config file does (``mrtpo.config.load_config`` builds an ``MRTPOConfig``); task files check their reward
weights with :func:`check_finite`. Every check runs before a model loads. The rules:

- every number is finite (NaN or ±inf in a weight, rate or length would train on NaN or fail late);
- the settings TRL checks late or not at all are in range (:data:`POSITIVE`, :data:`AT_LEAST`, ``top_p`` /
  ``min_p``): a temperature of 0 divides by zero while sampling, a batch of 0 fails once training starts.

Errors are :class:`SettingError` (a ``ValueError``), naming the key, the rule and the value.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any

#: Settings that must be > 0 (a zero learning rate trains nothing, silently; ``save_steps`` and
#: ``logging_steps`` below 1 are a share of max_steps).
POSITIVE = (
    "learning_rate",
    "temperature",
    "epsilon",
    "repetition_penalty",
    "save_steps",
    "logging_steps",
    "reward_timeout",
)
#: Settings that must be >= a minimum when set (None: unset).
AT_LEAST = {
    "max_steps": 1,
    "per_device_train_batch_size": 1,
    "gradient_accumulation_steps": 1,
    "max_completion_length": 1,
    "num_generations": 2,
    "num_iterations": 1,
    "generation_batch_size": 1,
    "steps_per_generation": 1,
    "per_device_eval_batch_size": 1,
    "num_generations_eval": 1,
    "top_k": 0,
    "beta": 0,
    "weight_decay": 0,
    "warmup_steps": 0,
}


class SettingError(ValueError):
    """A numeric setting that is not finite or out of its range."""


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def check_finite(key: str, value: Any) -> None:
    """``value`` (a number, or a list / tuple / mapping of them) holds no NaN or ±inf; other values pass."""
    items: Iterable[Any] = (
        value.values() if isinstance(value, dict) else value if isinstance(value, (list, tuple)) else (value,)
    )
    for item in items:
        if _is_number(item) and not math.isfinite(item):
            shown = list(value) if isinstance(value, tuple) else value
            raise SettingError(f"{key} must be finite, got {shown!r}")


def check_trainer_numbers(get: Callable[[str], Any], keys: Iterable[str], *, epochs: bool = True) -> None:
    """Check the trainer settings named in ``keys`` (``get(key)`` gives each value): every one finite,
    and those of :data:`POSITIVE` / :data:`AT_LEAST` / ``top_p`` and ``min_p`` in range. ``epochs``:
    ``max_steps=-1`` (train ``num_train_epochs``, transformers' default) is allowed."""
    keys = list(keys)
    for key in keys:
        check_finite(key, get(key))
    present = set(keys)
    for key in POSITIVE:
        v = get(key) if key in present else None
        if v is not None and not (_is_number(v) and v > 0):
            raise SettingError(f"{key} must be > 0, got {v}")
    for key, least in AT_LEAST.items():
        v = get(key) if key in present else None
        if v is None or (key == "max_steps" and epochs and v == -1):
            continue
        if not _is_number(v) or v < least:
            hint = " (GRPO compares the completions of a prompt)" if key == "num_generations" else ""
            raise SettingError(f"{key} must be >= {least}{hint}, got {v}")
    top_p, min_p = (get("top_p") if "top_p" in present else 1.0), (get("min_p") if "min_p" in present else None)
    if not 0 < top_p <= 1 or not 0 <= (min_p or 0) <= 1:
        raise SettingError(f"top_p must be in (0, 1] and min_p in [0, 1], got {top_p} and {min_p}")


def check_train_dataset(dataset: Any) -> None:
    """An empty ``train_dataset`` trains 0 steps and ends without a word: refused. (None: TRL's own error;
    an iterable dataset without a length: not checked.)"""
    try:
        empty = dataset is not None and len(dataset) == 0
    except TypeError:
        return
    if empty:
        raise SettingError("train_dataset is empty: give the trainer at least one prompt row")


def check_evidence_text(reward: str, example_id: str, found: Any, prompt: str) -> None:
    """``found`` (the :class:`~mrtpo.verifiers.Evidence` a reward gives for an example, or None), when
    ``in_prompt``, must occur in the example's prompt text (its messages' contents), checked before a model
    loads. The trainer checks, once the tokenizer has loaded, that it occurs exactly once in the rendered prompt."""
    if found is not None and found.placement == "in_prompt" and found.text not in prompt:
        raise SettingError(
            f"in_prompt evidence of reward {reward!r} for example {example_id!r} does "
            f"not occur in its prompt: {found.text[:120]!r}; the evidence must be a span of "
            "the prompt (or declare it placement='privileged')"
        )


__all__ = [
    "AT_LEAST",
    "POSITIVE",
    "SettingError",
    "check_evidence_text",
    "check_finite",
    "check_train_dataset",
    "check_trainer_numbers",
]
