"""Sample a group of completions of one prompt, the way the benchmarks and the demo need them."""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import Tensor

from mrtpo.fast_decode import fast_sampling
from mrtpo.shared_prompt import generate_with_shared_prefill


@torch.no_grad()
def sample_group(
    model: Any,
    tokenizer: Any,
    prompt_ids: list[int],
    group_size: int,
    max_new_tokens: int,
    temperature: float = 1.0,
    fast: bool = False,
) -> tuple[Tensor, Tensor]:
    """``group_size`` sampled completions of ``prompt_ids`` (pure temperature sampling, no top-k/p).
    ``fast``: through :func:`mrtpo.fast_decode.fast_sampling` where it supports the model (training's
    ``fast_generation``: the same distribution from another random stream), else ``generate``.

    Returns ``(completions, lengths)``: ``(G, T)`` ids, right-padded with the pad token, and ``(G,)``
    lengths that count the first end-of-sequence token (the policy chose it, so it is replayed
    and credited like any other token).
    """
    device = next(model.parameters()).device
    ids = torch.tensor([prompt_ids] * group_size, device=device)
    settings = {
        "do_sample": True,
        "temperature": temperature,
        "top_p": 1.0,
        "top_k": 0,
        "max_new_tokens": max_new_tokens,
        "pad_token_id": tokenizer.pad_token_id,
    }
    if fast:
        config = copy.deepcopy(model.generation_config)
        config.update(**settings)
        with fast_sampling(model):
            out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), generation_config=config)
    else:  # the group's prompt is prefilled once, not once per sample
        out = generate_with_shared_prefill(model, model.generate, ids, torch.ones_like(ids), **settings)
    completions = out[:, len(prompt_ids) :].cpu()
    stop = {tokenizer.eos_token_id, tokenizer.pad_token_id}
    lengths = [next((i + 1 for i, t in enumerate(row) if t in stop), len(row)) for row in completions.tolist()]
    t = max(lengths)
    completions = completions[:, :t].clone()
    for i, n in enumerate(lengths):
        completions[i, n:] = tokenizer.pad_token_id
    return completions, torch.tensor(lengths)


__all__ = ["sample_group"]
