"""``--field value`` flags for every config key, as ``HfArgumentParser`` / ``TrlParser`` take them.

``mrtpo train`` has a few named flags (``--task``, ``--max-steps``, ...) and takes any config key as
``key=value``. This module adds the TRL way, for every key and TRL's aliases (:mod:`mrtpo.trl_names`)::

    mrtpo train --num_generations 4 --model_name_or_path smollm2-135m --use_peft --lora_target_modules q_proj v_proj
    mrtpo train --dataset_name prompts.jsonl --reward_funcs think_format_reward my_rewards.fn ...   # a task, as TRL's

- ``--key value`` and ``--key=value``; ``-`` and ``_`` are the same in a name (``--max_steps`` is ``--max-steps``);
- a true/false key alone is true (``--use_peft``); it takes a following ``true`` / ``false`` as its value;
- a list key takes every value up to the next ``--flag`` or ``key=value`` (``--reward_weights 1 0.5``);
- values are YAML, as in ``key=value`` (``--model_init_kwargs '{use_kernels: true}'``).

:func:`split_argv` takes these out of the argument list before ``argparse`` sees the rest; their
names are checked with the other config keys (unknown ones with a suggestion or TRL's reason).
"""

from __future__ import annotations

import argparse
import dataclasses
import types
import typing
from typing import Any

import yaml

from mrtpo.config import ConfigError, RunSettings
from mrtpo.trl_names import ALIASES

_BOOL_WORDS = ("true", "false", "yes", "no", "1", "0")


def _kinds() -> dict[str, str]:
    """Config key (and TRL alias) -> how many arguments its flag takes: ``"bool"`` (none or a true/false),
    ``"list"`` (one or more: a list), ``"many"`` (one or more: one is the value itself, as for a list-or-text
    key such as ``lora_target_modules: all-linear``) or ``"value"`` (one)."""
    from mrtpo.trainer.config import MRTPOConfig

    kinds: dict[str, str] = {"use_peft": "bool", "reward_funcs": "list"}  # TRL's names (mrtpo.trl_names)
    for cls in (RunSettings, MRTPOConfig):
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            tp = hints.get(f.name, Any)
            union = typing.get_origin(tp) in (typing.Union, types.UnionType)
            options = [o for o in (typing.get_args(tp) if union else (tp,)) if o is not type(None)]
            lists = [o for o in options if typing.get_origin(o) is list or o is list]
            if options == [bool]:
                kinds[f.name] = "bool"
            elif lists:
                kinds[f.name] = "list" if len(lists) == len(options) else "many"
            else:
                kinds[f.name] = "value"
    for alias, target in ALIASES.items():
        kinds[alias] = kinds.get(target, "value")
    return kinds


def _value(text: str, flag: str) -> Any:
    try:
        return yaml.safe_load(text) if text.strip() else ""
    except yaml.YAMLError as exc:
        raise ConfigError(f"{flag} {text!r}: the value is not valid YAML: {exc}") from None


def _is_flag(token: str) -> bool:
    return token.startswith("--") and len(token) > 2


def split_argv(argv: list[str], parser: argparse.ArgumentParser) -> tuple[list[str], dict[str, Any]]:
    """``(argv for parser, {key: value})``: every ``--key value`` whose name is not one of ``parser``'s own
    options becomes a config override (checked later with the other keys). A parser option spelled with
    ``_`` (``--max_steps``) is passed on as the parser spells it (``--max-steps``)."""
    own = {s for action in parser._actions for s in action.option_strings}
    kinds = _kinds()
    rest: list[str] = []
    fields: dict[str, Any] = {}
    i = 0
    while i < len(argv):
        token = argv[i]
        i += 1
        if token == "--":  # everything after it is positional
            rest += argv[i - 1 :]
            break
        if not _is_flag(token):
            rest.append(token)
            continue
        name, eq, text = token[2:].partition("=")
        dashed = "--" + name.replace("_", "-")
        key = name.replace("-", "_")
        if ("--" + name in own or dashed in own) and kinds.get(key) not in ("list", "many"):
            rest.append(("--" + name if "--" + name in own else dashed) + (eq + text))
            continue
        kind = kinds.get(key, "value")  # a list key (report_to) takes several values even where a named flag has it
        if eq:
            fields[key] = _value(text, token)
        elif kind == "bool":
            if i < len(argv) and argv[i].lower() in _BOOL_WORDS:
                fields[key], i = argv[i].lower() in ("true", "yes", "1"), i + 1
            else:
                fields[key] = True
        elif kind in ("list", "many"):
            values = []
            while i < len(argv) and not _is_flag(argv[i]) and "=" not in argv[i]:
                values.append(_value(argv[i], token))
                i += 1
            if not values:
                raise ConfigError(f"{token} needs one or more values (e.g. {token} a b), or {token}=[a, b]")
            one = len(values) == 1 and (kind == "many" or isinstance(values[0], list))
            fields[key] = values[0] if one else values
        else:
            if i >= len(argv):
                raise ConfigError(f"{token} needs a value ({token} VALUE or {token}=VALUE)")
            fields[key], i = _value(argv[i], token), i + 1
    return rest, fields


__all__ = ["split_argv"]
