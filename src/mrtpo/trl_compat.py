"""What the previous TRL minor (1.15) lacks on a machine without Triton, supplied in PyTorch.

TRL puts a fused LM head on every policy it trains (``trl.trainer.utils.add_fused_lm_head``): a
forward with ``fused_lm_head=True`` returns per-token log-probabilities (and entropies) instead of
logits. TRL 1.15 computes them only with a Triton kernel, so on a CPU-only PyTorch its name for the
kernel is ``None`` and every update's forward fails (``'NoneType' object has no attribute
'apply'``); TRL 1.16 added a PyTorch path. :func:`ensure_fused_head_runs` gives 1.15 a PyTorch path
with the kernel's contract (:func:`head_statistics`); on 1.16 and later, or where the kernel
imported, it changes nothing. docs/design.md#trl-coupling lists this beside the trainer's overrides.
"""

from __future__ import annotations

from types import SimpleNamespace

import torch
from torch import Tensor

KERNEL_NAME = "_ChunkedLogProbFunction"
"""TRL 1.15's module-level name for the fused head's kernel in ``trl.trainer.utils`` (``None`` when
Triton did not import)."""


def head_statistics(
    hidden: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    targets: Tensor,
    temperature: float,
    chunk_size: int,
    final_logit_softcapping: float | None = None,
    logit_scale: float = 1.0,
    outputs: tuple[str, ...] = ("entropy", "log_sum_sq_probs", "mean_logits", "is_top1"),
) -> tuple[Tensor, Tensor | None, Tensor | None, Tensor | None, Tensor | None]:
    """Per-token statistics of the LM head's next-token distribution, as TRL's fused-head kernel
    returns them: ``(log_probs, entropy, log_sum_sq_probs, mean_logits, is_top1)``, each ``(N,)``
    float32 (``is_top1`` bool), ``None`` where ``outputs`` does not ask for it.

    ``hidden`` ``(N, H)``, ``weight`` ``(V, H)``, ``bias`` ``(V,)`` or None, ``targets`` ``(N,)``. The
    logits are ``z = hidden · weightᵀ + bias``, scaled by ``logit_scale``, soft-capped as
    ``c · tanh(z / c)`` when ``final_logit_softcapping`` is ``c``, then divided by ``temperature``;
    ``is_top1``: the target is the first index of the maximum. ``chunk_size`` is the kernel's vocabulary
    tile, unused here: the ``(N, V)`` logits are formed whole (float32), which costs ``4 N V`` bytes.
    """
    del chunk_size
    logits = torch.nn.functional.linear(hidden, weight, bias).float() * logit_scale
    if final_logit_softcapping is not None:
        logits = final_logit_softcapping * torch.tanh(logits / final_logit_softcapping)
    logits = logits / temperature
    log_softmax = logits.log_softmax(-1)
    log_probs = log_softmax.gather(-1, targets[:, None]).squeeze(-1)
    entropy = -(log_softmax.exp() * log_softmax).sum(-1) if "entropy" in outputs else None
    with torch.no_grad():
        log_sum_sq = torch.logsumexp(2 * log_softmax, -1) if "log_sum_sq_probs" in outputs else None
        mean_logits = logits.mean(-1) if "mean_logits" in outputs else None
        is_top1 = logits.argmax(-1) == targets if "is_top1" in outputs else None
    return log_probs, entropy, log_sum_sq, mean_logits, is_top1


def ensure_fused_head_runs() -> bool:
    """Give TRL's fused LM head a PyTorch kernel where the installed TRL has none (1.15 without
    Triton); True when it did. Idempotent; call before the first forward with ``fused_lm_head=True``."""
    from trl.trainer import utils

    if not hasattr(utils, KERNEL_NAME) or getattr(utils, KERNEL_NAME) is not None:
        return False
    setattr(utils, KERNEL_NAME, SimpleNamespace(apply=head_statistics))
    return True
