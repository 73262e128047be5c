"""TRL's ``model_init_kwargs`` for the policies mrtpo loads itself.

TRL applies ``GRPOConfig.model_init_kwargs`` only when its trainer is given a model *name*; mrtpo
loads presets, ``.gguf`` files, folders, hub ids and the gym policy itself and applies them here:

- ``attn_implementation``: ``eager``, ``sdpa``, ... (transformers checks the name and its package);
- ``dtype``: ``float32``, ``bfloat16``, ``float16`` or ``auto`` (the checkpoint's own: bfloat16 for a
  preset); it replaces the run's ``dtype`` setting (both set to different values: an error);
- ``revision``: a branch, tag or commit of a **hub id**. A preset, folder, ``.gguf`` file or the gym
  policy has one version, so a revision there is an error, not silently ignored (training another
  version than the one asked for would go unnoticed);
- ``trust_remote_code``: run the code a folder or hub repo ships (default: TRL's ``trust_remote_code``);
- ``use_kernels``: transformers' hub kernels (``kernels`` package; TRL 1.16's replacement for Liger), applied
  at load or, for a model mrtpo builds itself, with ``set_use_kernels``; the model switches their
  training / inference mode with ``train()`` / ``eval()``. Layers without a kernel keep torch's code;
- ``device_map``: where ``from_pretrained`` puts the weights (``cpu``, ``cuda:0``, ``auto``, a mapping), for one
  process only: under several processes (DDP, FSDP, DeepSpeed) each holds its own copy, placed by
  accelerate, and a ``device_map`` is refused.

Quantized loading (``quantization_config``, ``load_in_4bit`` / ``load_in_8bit``: QLoRA) is refused with its
reason (:data:`mrtpo.trl_names.NOT_TAKEN`); any other key is an error that lists these.

    mrtpo train --model ./my-model model_init_kwargs="{attn_implementation: eager, dtype: bfloat16}"
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib.util
import json
import logging
import os
from typing import Any

import torch

from mrtpo.models import ModelLoadError, load_policy, resolve_model
from mrtpo.trl_names import NOT_TAKEN

__all__ = [
    "DTYPES",
    "KEYS",
    "ModelInit",
    "ModelInitError",
    "apply_model_init",
    "hand_to_trl",
    "load_with_init",
    "parse_model_init",
    "run_model_init",
]

KEYS = ("attn_implementation", "dtype", "revision", "trust_remote_code", "use_kernels", "device_map")
_ALIASES = {"torch_dtype": "dtype"}  # transformers' old name
DTYPES = ("float32", "bfloat16", "float16", "auto")


class ModelInitError(ModelLoadError):
    """``model_init_kwargs`` that mrtpo cannot apply; the message says which key and what fits."""


@dataclasses.dataclass(frozen=True)
class ModelInit:
    """The checked ``model_init_kwargs`` of a run."""

    dtype: str = "float32"
    attn_implementation: str | None = None
    revision: str | None = None
    trust_remote_code: bool = False
    use_kernels: bool = False
    device_map: Any = None

    @property
    def torch_dtype(self) -> torch.dtype | str:
        """``dtype`` for ``from_pretrained`` ("auto" stays a string)."""
        return self.dtype if self.dtype == "auto" else getattr(torch, self.dtype)

    def from_pretrained_kwargs(self) -> dict[str, Any]:
        """The keys besides ``dtype`` that ``from_pretrained`` gets (only those set)."""
        out: dict[str, Any] = {}
        if self.attn_implementation is not None:
            out["attn_implementation"] = self.attn_implementation
        if self.revision is not None:
            out["revision"] = self.revision
        if self.trust_remote_code:
            out["trust_remote_code"] = True
        if self.use_kernels:
            out["use_kernels"] = True
        if self.device_map is not None:
            out["device_map"] = self.device_map
        return out

    def trl_kwargs(self) -> dict[str, Any]:
        """Plain-value ``model_init_kwargs`` for TRL (its reference model is built from them)."""
        return {"dtype": self.dtype, **self.from_pretrained_kwargs()}


def parse_model_init(
    model: str, kwargs: Any, *, dtype: str = "float32", dtype_given: bool = False, trust_remote_code: bool = False
) -> ModelInit:
    """Check ``kwargs`` (a mapping, a JSON string or None) for loading ``model``; raise :class:`ModelInitError`.

    ``dtype``: the run's dtype setting, used unless ``kwargs`` names one; ``dtype_given``: the user set it
    (then a different ``kwargs`` dtype is an error). ``trust_remote_code``: TRL's field, the default.
    """
    if isinstance(kwargs, str):
        try:
            kwargs = json.loads(kwargs) if kwargs.strip() else None
        except ValueError:
            raise ModelInitError(f"model_init_kwargs must be a mapping, got the string {kwargs!r}") from None
    kwargs = dict(kwargs or {}) if isinstance(kwargs, dict) or kwargs is None else kwargs
    if not isinstance(kwargs, dict):
        raise ModelInitError(
            f"model_init_kwargs must be a mapping such as {{attn_implementation: eager}}, got {kwargs!r}"
        )
    given: dict[str, Any] = {}
    for key, value in kwargs.items():
        name = _ALIASES.get(key, key)
        if name not in KEYS and name in NOT_TAKEN:
            raise ModelInitError(f"model_init_kwargs: {key}: {NOT_TAKEN[name]}")
        if name not in KEYS:
            close = difflib.get_close_matches(str(key), KEYS, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ModelInitError(
                f"model_init_kwargs: unknown key {key!r}{hint}; mrtpo applies {', '.join(KEYS)} (see mrtpo.model_init)"
            )
        given[name] = value
    chosen = given.get("dtype", dtype)
    if isinstance(chosen, torch.dtype):
        chosen = str(chosen).removeprefix("torch.")
    if chosen not in DTYPES:
        raise ModelInitError(f"model_init_kwargs: dtype must be one of {', '.join(DTYPES)}, got {chosen!r}")
    if "dtype" in given and dtype_given and chosen != dtype:
        raise ModelInitError(f"dtype={dtype} and model_init_kwargs dtype={chosen} disagree; set only one")
    for key in ("attn_implementation", "revision"):
        if given.get(key) is not None and not isinstance(given[key], str):
            raise ModelInitError(f"model_init_kwargs: {key} must be a string, got {given[key]!r}")
    trust = given.get("trust_remote_code", trust_remote_code)
    if not isinstance(trust, bool):
        raise ModelInitError(f"model_init_kwargs: trust_remote_code must be true or false, got {trust!r}")
    use_kernels = given.get("use_kernels", False)
    if not isinstance(use_kernels, bool):
        raise ModelInitError(f"model_init_kwargs: use_kernels must be true or false, got {use_kernels!r}")
    if use_kernels and importlib.util.find_spec("kernels") is None:
        raise ModelInitError("model_init_kwargs: use_kernels needs the 'kernels' package: `pip install kernels`")
    device_map = given.get("device_map")
    if device_map is not None:
        if not isinstance(device_map, (str, dict)):
            raise ModelInitError(
                f"model_init_kwargs: device_map must be a device (cpu, cuda:0), auto or a mapping, got {device_map!r}"
            )
        if int(os.environ.get("WORLD_SIZE", "1")) > 1:
            raise ModelInitError(
                "model_init_kwargs: device_map places one copy of the model; under several "
                "processes each holds its own, placed by accelerate: remove device_map"
            )
        if model == "gym" and not isinstance(device_map, str):
            raise ModelInitError(
                f"model_init_kwargs: the gym policy is built in memory; device_map {device_map!r} must be one device"
            )
    revision = given.get("revision")
    if revision is not None:
        kind = "gym policy" if model == "gym" else resolve_model(model).kind
        if kind != "hub":
            what = {"preset": "a preset", "gguf": "a .gguf file", "local": "a local folder"}.get(kind, "the gym policy")
            raise ModelInitError(
                f"model_init_kwargs: revision {revision!r} applies to hub ids only; {model!r} is "
                f"{what}, which has one version: remove revision (or name a hub id)"
            )
    return ModelInit(
        dtype=chosen,
        attn_implementation=given.get("attn_implementation"),
        revision=revision,
        trust_remote_code=trust,
        use_kernels=use_kernels,
        device_map=device_map,
    )


def run_model_init(config) -> ModelInit:
    """The :class:`ModelInit` of a resolved run config (``mrtpo.config.RunConfig``)."""
    return parse_model_init(
        config.run.model,
        config.args.model_init_kwargs,
        dtype=config.run.dtype,
        dtype_given="dtype" in config.explicit,
        trust_remote_code=config.args.trust_remote_code,
    )


def _attn_error(init: ModelInit, err: Exception) -> ModelInitError:
    return ModelInitError(
        f"model_init_kwargs: attn_implementation={init.attn_implementation!r} cannot be used "
        f"here ({type(err).__name__}: {err}); eager and sdpa work everywhere"
    )


def load_with_init(spec, init: ModelInit, cache_dir=None):
    """``(model, tokenizer)`` of ``spec`` (anything :func:`mrtpo.models.load_policy` takes), loaded under ``init``."""
    try:
        return load_policy(spec, dtype=init.torch_dtype, cache_dir=cache_dir, **init.from_pretrained_kwargs())
    except (ValueError, ImportError) as err:
        if init.attn_implementation is None:
            raise
        raise _attn_error(init, err) from err


def apply_model_init(model, init: ModelInit):
    """Apply ``init``'s dtype and attention to a model mrtpo built another way (the gym policy, a warm start)."""
    if init.dtype != "auto" and model.dtype != init.torch_dtype:
        model.to(init.torch_dtype)
    if init.attn_implementation is not None and model.config._attn_implementation != init.attn_implementation:
        try:
            model.set_attn_implementation(init.attn_implementation)
        except (ValueError, ImportError) as err:
            raise _attn_error(init, err) from err
    if init.use_kernels and not model.use_kernels:
        model.set_use_kernels(True)
    if isinstance(init.device_map, str) and init.device_map != "auto":
        model.to(init.device_map)
    return model


class _AppliedFilter(logging.Filter):
    """Drops TRL's "model_init_kwargs will be ignored" warning: mrtpo applied them when it loaded the model."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "model_init_kwargs` will be ignored" not in record.getMessage()


_FILTER = _AppliedFilter()


def hand_to_trl(args, init: ModelInit) -> None:
    """After loading: give TRL the checked kwargs (its reference model is built from them) and silence its
    warning that they are ignored (they were applied). Nothing changes where the user gave none."""
    if args.model_init_kwargs is None:
        return
    args.model_init_kwargs = init.trl_kwargs()
    logging.getLogger("trl.trainer.grpo_trainer").addFilter(_FILTER)
