"""The update's forward with each distinct prompt computed once.

In a GRPO micro-batch the ``G`` completions of a group follow the same (left-padded) prompt, and
the prompt is most of the tokens: 8 completions of ≤ 64 tokens after a ~330-token prompt are
~84 % prompt. TRL's update runs every row whole. Here the distinct prompts (less their last
token) run once, with gradient, and return their KV cache; the cache is gathered to the rows
(``index_select``: a copy of the keys and values, not a re-forward) and every row runs only
``[last prompt token, completion]`` on it, through the model's normal forward with TRL's fused LM
head. Positions, attention masks and labels are those of TRL's path (positions count from the
first, possibly padded, column as TRL's do), so per-token log-probabilities, entropies, the loss
and its gradient equal TRL's within float tolerance; the gradient of a shared prompt is the sum
over its rows, as autograd sums it through ``index_select``.

It needs a model whose layers keep the cache while training: under activation checkpointing a
layer drops it (its backward replay would write it twice), so :func:`can_share_prompts` says no
and the caller runs TRL's path.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor

from mrtpo.model_calls import cache_keyword, returned_cache, underlying_model


def can_share_prompts(model: Any, prompt_length: int) -> bool:
    """Whether :func:`shared_prompt_logps` can run: a prompt of at least 2 columns, and no activation
    checkpointing on a model that builds a graph (checkpointed layers drop the cache)."""
    inner = underlying_model(model)
    checkpointed = getattr(inner, "is_activation_checkpointing", None)
    if checkpointed is None:  # transformers < 5.25 names it is_gradient_checkpointing
        checkpointed = getattr(inner, "is_gradient_checkpointing", False)
    checkpointed = checkpointed and inner.training
    return prompt_length >= 2 and not (checkpointed and torch.is_grad_enabled())


def distinct_rows(prompt_ids: Tensor, prompt_mask: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """``(ids, mask, inverse)``: the distinct (ids, mask) rows ``(U, P)`` and, for every row ``(B,)``,
    the index of its prompt among them."""
    width = prompt_ids.size(1)
    keyed = torch.cat([prompt_ids, prompt_mask.to(prompt_ids.dtype)], dim=1)
    rows, inverse = torch.unique(keyed, dim=0, return_inverse=True)
    return rows[:, :width], rows[:, width:].to(prompt_mask.dtype), inverse


def shared_prompt_logps(
    model: Any,
    prompt_ids: Tensor,
    prompt_mask: Tensor,
    completion_ids: Tensor,
    completion_mask: Tensor,
    compute_entropy: bool = False,
) -> tuple[Tensor, Tensor | None]:
    """Per-token log-probabilities ``(B, T)`` of ``completion_ids`` (0 where ``completion_mask`` is 0)
    and, if asked, the entropies ``(B, T)``, as TRL's fused-head forward of ``[prompt, completion]``
    gives them, with each distinct prompt row run once.

    ``prompt_ids`` / ``prompt_mask`` ``(B, P)`` left-padded, ``P ≥ 2``; ``completion_ids`` /
    ``completion_mask`` ``(B, T)``. ``model`` must carry TRL's fused LM head
    (``trl.trainer.utils.add_fused_lm_head``). Two forward calls whatever the number of distinct
    prompts, so processes stay in lockstep under FSDP / ZeRO-3.
    """
    ids, mask, inverse = distinct_rows(prompt_ids, prompt_mask)
    head = model(input_ids=ids[:, :-1], attention_mask=mask[:, :-1], use_cache=True, logits_to_keep=1)
    cache = returned_cache(head)
    cache.batch_select_indices(inverse)
    tail_ids = torch.cat([prompt_ids[:, -1:], completion_ids], dim=1)
    labels = torch.cat(
        [torch.full_like(prompt_ids[:, -1:], -100), completion_ids.masked_fill(completion_mask == 0, -100)], dim=1
    )
    attention = torch.cat([prompt_mask, completion_mask], dim=1)
    out = model(
        input_ids=tail_ids, attention_mask=attention, labels=labels, fused_lm_head=True, **{cache_keyword(model): cache}
    )
    entropy = out.entropy if compute_entropy else None
    return out.log_probs, entropy


def prefill_shared_prompts(model: Any, input_ids: Tensor, attention_mask: Tensor) -> Any:
    """The KV cache ``generate`` would build for ``input_ids[:, :-1]`` ``(B, P − 1)``, computed for each
    distinct (ids, mask) row once and gathered to the ``B`` rows.

    Positions are ``generate``'s (the attention mask's running count, so a left-padded row starts at
    0), so ``generate(input_ids, attention_mask, cache=...)`` then runs only the last prompt token
    and continues exactly as if it had prefilled every row itself.
    """
    ids, mask, inverse = distinct_rows(input_ids, attention_mask)
    positions = (mask.long().cumsum(-1) - 1).clamp_min(0)
    out = model(
        input_ids=ids[:, :-1],
        attention_mask=mask[:, :-1],
        position_ids=positions[:, :-1],
        use_cache=True,
        logits_to_keep=1,
    )
    cache = returned_cache(out)
    cache.batch_select_indices(inverse)
    return cache


def generate_with_shared_prefill(
    model: Any, generate: Any, input_ids: Tensor, attention_mask: Tensor | None = None, **kwargs: Any
) -> Tensor:
    """``generate(input_ids, attention_mask, **kwargs)`` with each distinct prompt prefilled once
    (:func:`prefill_shared_prompts`): a group of ``G`` samples of one prompt pays its prompt once,
    not ``G`` times. Falls back to plain ``generate`` for prompts shorter than 2 tokens, a cache
    passed in, or extra per-row inputs (images)."""
    plain = (
        attention_mask is None
        or input_ids.size(1) < 2
        or any(k in kwargs for k in ("cache", "past_key_values"))
        or any(torch.is_tensor(v) for v in kwargs.values())
    )
    if plain:
        return generate(input_ids=input_ids, attention_mask=attention_mask, **kwargs)
    with torch.no_grad():
        cache = prefill_shared_prompts(model, input_ids, attention_mask)
    return generate(input_ids=input_ids, attention_mask=attention_mask, **{cache_keyword(model): cache}, **kwargs)


@contextmanager
def patched_generate(model: Any, replacement: Callable[[Any], Callable[..., Any]]) -> Iterator[None]:
    """Within the block, ``model.generate`` is ``replacement(original generate)``; the instance's own
    ``generate`` is restored after."""
    generate = model.generate
    model.generate = replacement(generate)
    try:
        yield
    finally:
        del model.generate
        if model.generate != generate:  # an instance attribute was there before us
            model.generate = generate


def shared_prefill(model: Any):
    """Within the block, ``model.generate`` prefills each distinct prompt once
    (:func:`generate_with_shared_prefill`)."""
    return patched_generate(model, lambda generate: functools.partial(generate_with_shared_prefill, model, generate))
