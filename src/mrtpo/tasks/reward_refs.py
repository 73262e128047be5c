"""A task file's reward functions by path: ``file.py:fn`` (next to the YAML file), ``pkg.module:fn``
or ``pkg.module.fn``, optionally a factory called with ``args`` (``trl.rewards.get_soft_overlong_punishment``).

Part of :mod:`mrtpo.tasks.from_config`; every mistake is a :class:`TaskFileError` that says the fix.
"""

from __future__ import annotations

import difflib
import hashlib
import importlib
import importlib.util
import math
import sys
from pathlib import Path
from typing import Any


class TaskFileError(ValueError):
    """A task block that cannot work as written (the message names the key, file or column and the fix)."""


def close_match_hint(word: str, options: list[str]) -> str:
    """``" (did you mean 'x'?)"`` for the closest of ``options`` to a mistyped ``word``, else ``""``."""
    close = difflib.get_close_matches(word, options, n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


# --------------------------------------------------------------------------------------------
# Reward functions by path.
# --------------------------------------------------------------------------------------------
def _module_from_file(path: Path) -> Any:
    """Import a Python file as a module (once per file; registered in sys.modules under a unique name)."""
    name = "mrtpo_task_rewards_" + hashlib.sha1(str(path).encode()).hexdigest()[:12]
    if name in sys.modules:
        return sys.modules[name]
    loader_spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(loader_spec)
    sys.modules[name] = module
    try:
        loader_spec.loader.exec_module(module)
    except Exception:
        del sys.modules[name]
        raise
    return module


def _import_target(ref: str, folder: Path) -> tuple[Any, str, str]:
    """``(module, attribute, where)`` that ``ref`` names: ``file.py:fn``, ``pkg.module:fn`` or ``pkg.module.fn``."""
    if ":" in ref:
        where, attr = ref.split(":")
    else:
        where, _, attr = ref.rpartition(".")
    try:
        if where.endswith(".py") or "/" in where:
            path = (folder / where).resolve()
            if not path.is_file():
                raise TaskFileError(
                    f"reward {ref!r}: file {path} does not exist (paths are relative to the "
                    "folder of the task's YAML file)"
                )
            return _module_from_file(path), attr, where
        return importlib.import_module(where), attr, where
    except TaskFileError:
        raise
    except (Exception, SystemExit) as exc:  # noqa: BLE001 -- the user's module may raise (or exit) while importing
        raise TaskFileError(f"reward {ref!r}: {where} does not import ({type(exc).__name__}: {exc})") from None


def load_reward(ref: Any, folder: Path, args: dict[str, Any] | None = None) -> Any:
    """The function that ``ref`` names (``file.py:fn`` relative to ``folder``, ``pkg.module:fn`` or
    ``pkg.module.fn``); with ``args``, ``ref`` is a factory (``trl.rewards.get_soft_overlong_punishment``)
    and the reward is what it returns for those keyword arguments."""
    dotted = isinstance(ref, str) and ":" not in ref and "." in ref.strip(".") and not ref.endswith(".py")
    if not isinstance(ref, str) or not (dotted or ref.count(":") == 1 and all(ref.split(":"))):
        raise TaskFileError(
            f"reward {ref!r} must be 'file.py:function', 'package.module:function' or 'package.module.function'"
        )
    module, attr, where = _import_target(ref, folder)
    try:
        fn = getattr(module, attr)
    except AttributeError:
        defined = sorted(
            n
            for n, v in vars(module).items()
            if callable(v) and not n.startswith("_") and getattr(v, "__module__", None) == module.__name__
        )
        if not defined:  # a lazy module (trl.rewards) lists its names in __all__ / dir()
            defined = sorted(n for n in getattr(module, "__all__", dir(module)) if not n.startswith("_"))
        raise TaskFileError(
            f"reward {ref!r}: {where} has no {attr!r}{close_match_hint(attr, defined)}; "
            f"it defines {', '.join(defined) or 'no functions'}"
        ) from None
    if not callable(fn):
        raise TaskFileError(
            f"reward {ref!r} is a {type(fn).__name__}, not a function "
            "fn(prompts, completions, **columns) -> list[float]"
        )
    _check_extras(ref, fn)
    if args is None:
        return fn
    if not isinstance(args, dict):
        raise TaskFileError(f"args of reward {ref!r} must be a mapping of keyword arguments, got {args!r}")
    try:
        made = fn(**args)
    except Exception as exc:  # noqa: BLE001 -- a factory may refuse its arguments in any way
        raise TaskFileError(f"reward {ref!r} called with args {args!r} raised {type(exc).__name__}: {exc}") from None
    if not callable(made):
        raise TaskFileError(
            f"reward {ref!r} with args gave a {type(made).__name__}, not a reward function; "
            "give args only to a factory that returns one"
        )
    return made


#: TRL rewards that need an optional package (checked when the task loads, not at the first step).
_NEEDS = {
    "accuracy_reward": "math_verify",
    "reasoning_accuracy_reward": "math_verify",
    "get_cosine_scaled_reward": "math_verify",
}
_PIP = {"math_verify": "math-verify"}


def _check_extras(ref: str, fn: Any) -> None:
    if not str(getattr(fn, "__module__", "")).startswith("trl.rewards"):
        return
    package = _NEEDS.get(getattr(fn, "__name__", ""))
    if package and importlib.util.find_spec(package) is None:
        raise TaskFileError(
            f"reward {ref!r} needs the {package!r} package, which is not installed: "
            f"`pip install {_PIP.get(package, package)}`"
        )


def reward_list(rewards: list | dict, folder: Path) -> list[tuple[str, Any, float]]:
    """``(path, function, weight)`` for each reward of a task block's ``rewards`` (paths relative to
    ``folder``), in order. A mapping's value is the weight, or ``{weight: w, args: {...}}`` (args: the
    keyword arguments of a reward factory)."""
    items = rewards.items() if isinstance(rewards, dict) else ((r, 1.0) for r in rewards)
    out = []
    for ref, value in items:
        args = None
        if isinstance(value, dict):
            unknown = set(value) - {"weight", "args"}
            if unknown:
                raise TaskFileError(
                    f"reward {ref!r}: unknown key(s) {', '.join(map(str, sorted(unknown)))}; "
                    "a reward's mapping takes weight and args"
                )
            weight, args = value.get("weight", 1.0), value.get("args", {})
        else:
            weight = value
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not math.isfinite(weight):
            raise TaskFileError(
                f"the weight of reward {ref!r} must be a{' finite' * isinstance(weight, float)} number, got {weight!r}"
            )
        out.append((ref, load_reward(ref, folder, args), float(weight)))
    return out


__all__ = ["TaskFileError", "close_match_hint", "load_reward", "reward_list"]
