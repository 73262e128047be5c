"""Model plumbing the replay, decoding, shared-prompt generation and packing share.

Plain forwards and what they need from any model, whatever wraps it: the model under DDP / FSDP /
PEFT wrappers, its KV-cache keyword and the cache a forward returns, autocast's own outputs under
accelerate's mixed precision, a forward-call counter, and the logits of one replay pass. No relevance,
no plan: :mod:`mrtpo.replay` builds on this, and so do :mod:`mrtpo.fast_decode`,
:mod:`mrtpo.shared_prompt` and :mod:`mrtpo.packing`.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from types import MethodType
from typing import Any

import torch
from torch import Tensor


@torch.no_grad()
def completion_logits(model: Any, prompt_ids: Tensor, completion_ids: Tensor) -> Tensor:
    """Logits ``(T, V)`` predicting each of the ``T`` completion tokens after ``prompt_ids`` ``(P,)``.

    A plain forward of one unpadded sequence with ``logits_to_keep = T + 1``; the last logit
    (predicting past the completion) is dropped so position ``t`` predicts ``completion_ids[t]``.
    """
    ids = torch.cat([prompt_ids, completion_ids]).unsqueeze(0).to(model.device)
    t = completion_ids.numel()
    out = model(input_ids=ids, attention_mask=torch.ones_like(ids), logits_to_keep=t + 1, use_cache=False)
    return out.logits[0, :-1]


def underlying_model(model: Any) -> Any:
    """The transformers model under any wrappers: DDP / FSDP ``.module``, a PEFT model's base model."""
    seen: set[int] = set()
    while id(model) not in seen:
        seen.add(id(model))
        inner = getattr(model, "module", None)
        if isinstance(inner, torch.nn.Module):
            model = inner
            continue
        get_base = getattr(model, "get_base_model", None)
        if callable(get_base):
            model = get_base()
            continue
        break
    return model


@contextmanager
def autocast_outputs(model: Any) -> Iterator[None]:
    """While active, a model prepared by accelerate for mixed precision returns autocast's own
    (bf16 / fp16) outputs instead of an fp32 copy of them.

    accelerate wraps such a model's ``forward`` so that every output is upcast to fp32; for a
    replay that is a second, fp32 copy of ``(Σ C·G, T, V)`` logits next to the bf16 ones (2.5 →
    7.5 GB per group of 8 × 256 tokens at V = 152k), though the relevance kernels upcast each chunk
    anyway: the maps come out bit-identical. The wrapped forward of every module of ``model`` that
    has one (the model, or the module under DDP / FSDP wrappers, which call it) is swapped for the
    autocast forward underneath it, and restored on exit. A model without the wrapper is untouched.
    """
    from accelerate.utils.operations import ConvertOutputsToFp32

    swapped = []
    for module in model.modules() if isinstance(model, torch.nn.Module) else []:
        forward = module.__dict__.get("forward")
        converter = getattr(getattr(forward, "__func__", forward), "__wrapped__", None)
        if isinstance(converter, ConvertOutputsToFp32):
            inner = converter.model_forward
            module.forward = MethodType(inner, module) if hasattr(forward, "__func__") else inner
            swapped.append((module, forward))
    try:
        yield
    finally:
        for module, forward in swapped:
            module.forward = forward


def cache_keyword(model: Any) -> str:
    """The forward keyword for a KV cache: ``cache`` in recent transformers, ``past_key_values`` before.

    Read from the underlying model's forward: wrappers (PEFT, DDP) take ``**kwargs`` and pass them
    through, so their own signature says nothing, and a name the model does not know would be
    swallowed silently (the replay would then run without the prompt's cache).
    """
    params = inspect.signature(underlying_model(model).forward).parameters
    if "cache" in params:
        return "cache"
    if "past_key_values" in params:
        return "past_key_values"
    raise TypeError(
        f"{type(underlying_model(model)).__name__}.forward takes neither `cache` nor `past_key_values`: "
        "the replay needs a model that accepts a KV cache"
    )


def returned_cache(out: Any) -> Any:
    """The KV cache a forward returned (``cache`` in recent transformers, ``past_key_values`` before)."""
    cache = out.get("cache") if hasattr(out, "get") else None
    return cache if cache is not None else out.past_key_values


class ForwardCounter:
    """Counts model forward calls (every rank must make the same number under FSDP / ZeRO-3),
    and the seconds :func:`mrtpo.replay.group_relevance` spends in the relevance kernels (for ``bench cost``)."""

    def __init__(self) -> None:
        self.calls = 0
        self.kernel_s = 0.0


@dataclass
class PassLogits:
    """The logits of one replay pass: ``logits`` ``(Σ C·G, T, V)``, in the model's dtype;
    ``blocks[m][c]``: the first row of member ``m``'s context ``c`` (its ``sizes[m]`` completions'
    rows follow); ``widths[m]``: the member's own completion width ``≤ T``."""

    logits: Tensor
    blocks: list[list[int]]
    sizes: list[int]
    widths: list[int]

    def of(self, member: int, context: int) -> Tensor:
        """``(G, T_m, V)``: member ``member``'s completions under its context ``context``."""
        first = self.blocks[member][context]
        return self.logits[first : first + self.sizes[member], : self.widths[member]]


__all__ = [
    "ForwardCounter",
    "PassLogits",
    "autocast_outputs",
    "cache_keyword",
    "completion_logits",
    "returned_cache",
    "underlying_model",
]
