"""Floors for ``mrtpo bench cost``: what the hardware needs for a step's work, to put each phase's
time next to.

- **update floor**: a plain forward + backward (same LoRA / full setting) over only the tokens the
  update needs, each distinct prompt once and each completion once, as separate sequences (so
  attention from a completion to its prompt is not counted: a lower bound), with the LM head only
  where a completion token is scored. The update itself runs the way the trainer runs it: TRL's
  fused LM head over ``[prompt, completion]`` rows (``rows``, optionally under activation
  checkpointing) or each distinct prompt once (``shared``, :mod:`mrtpo.shared_prompt`).
- **decode floor**: the prompt's prefill once, then one batched single-token forward per new token
  on the expanded cache: the forwards sampling cannot avoid, without ``generate``'s bookkeeping.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from mrtpo.model_calls import cache_keyword, returned_cache, underlying_model
from mrtpo.shared_prompt import distinct_rows, shared_prompt_logps

#: Update variants :func:`update_seconds` times: TRL's rows under activation checkpointing, TRL's
#: rows, each distinct prompt once.
UPDATE_MODES = ("rows+checkpointing", "rows", "shared")


@dataclass
class UpdateBatch:
    """One update micro-batch as TRL hands it to the loss: ``prompt_ids`` / ``prompt_mask`` ``(B, P)``
    left-padded, ``completion_ids`` / ``completion_mask`` / ``advantages`` ``(B, T)``."""

    prompt_ids: Tensor
    prompt_mask: Tensor
    completion_ids: Tensor
    completion_mask: Tensor
    advantages: Tensor

    @classmethod
    def from_groups(
        cls, prompts: list[list[int]], completions: Tensor, mask: Tensor, advantages: Tensor, pad_id: int
    ) -> UpdateBatch:
        """From one prompt's ids per row (equal within a group) and right-padded completions ``(B, T)``."""
        width = max(map(len, prompts))
        ids = torch.tensor([[pad_id] * (width - len(p)) + list(p) for p in prompts])
        prompt_mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
        return cls(ids, prompt_mask, completions, mask.long(), advantages)

    def unique_tokens(self) -> dict[str, int]:
        """Tokens the update must see at least: distinct prompts once, completions once."""
        _, mask, _ = distinct_rows(self.prompt_ids, self.prompt_mask)
        return {
            "prompt": int(mask.sum()),
            "completion": int(self.completion_mask.sum()),
            "rows": int(self.prompt_mask.sum() + self.completion_mask.sum()),
        }


def _rows_logps(model: Any, batch: UpdateBatch) -> Tensor:
    """TRL 1.16's update forward: every row whole, fused head, completion positions kept."""
    input_ids = torch.cat([batch.prompt_ids, batch.completion_ids], 1)
    attention = torch.cat([batch.prompt_mask, batch.completion_mask], 1)
    labels = input_ids.masked_fill(attention == 0, -100)
    t = batch.completion_ids.size(1)
    labels[:, :-t] = -100
    return model(input_ids=input_ids, attention_mask=attention, labels=labels, fused_lm_head=True).log_probs[:, -t:]


def update_seconds(model: Any, batch: UpdateBatch, mode: str, lr: float = 1e-6) -> float:
    """Seconds of one update in ``mode`` (one of :data:`UPDATE_MODES`): forward, the token-level
    surrogate at ratio 1 (DAPO's, normalised by the batch's tokens), backward, an SGD step.
    ``model`` carries TRL's fused LM head."""
    inner = underlying_model(model)
    if mode == "rows+checkpointing":
        inner.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.SGD(params, lr=lr)
    start = time.perf_counter()
    if mode == "shared":
        logps, _ = shared_prompt_logps(
            model, batch.prompt_ids, batch.prompt_mask, batch.completion_ids, batch.completion_mask
        )
    else:
        logps = _rows_logps(model, batch)
    mask = batch.completion_mask
    loss = -(batch.advantages * torch.exp(logps - logps.detach()) * mask).sum() / mask.sum()
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    seconds = time.perf_counter() - start
    if mode == "rows+checkpointing":
        inner.activation_checkpointing_disable()
    model.eval()
    return seconds


def update_floor_seconds(model: Any, batch: UpdateBatch) -> float:
    """Seconds of a plain forward + backward over the update's unique tokens (see the module doc)."""
    inner = underlying_model(model)
    backbone, head = inner.base_model, inner.get_output_embeddings()
    ids, mask, _ = distinct_rows(batch.prompt_ids, batch.prompt_mask)
    model.train()
    start = time.perf_counter()
    prompt_hidden = backbone(input_ids=ids, attention_mask=mask, use_cache=False).last_hidden_state
    hidden = backbone(
        input_ids=batch.completion_ids, attention_mask=batch.completion_mask, use_cache=False
    ).last_hidden_state
    scored = hidden[batch.completion_mask.bool()]
    logps = torch.log_softmax(head(scored).float(), -1)
    targets = batch.completion_ids[batch.completion_mask.bool()]
    loss = logps.gather(-1, targets.view(-1, 1)).sum() + prompt_hidden.float().mean()
    loss.backward()
    seconds = time.perf_counter() - start
    model.zero_grad(set_to_none=True)
    model.eval()
    return seconds


@torch.no_grad()
def decode_floor_seconds(model: Any, prompt_ids: list[int], group_size: int, new_tokens: int) -> float:
    """Seconds of the forwards sampling ``group_size`` completions of ``new_tokens`` must make: the
    prompt's prefill once, then ``new_tokens − 1`` single-token forwards of the group on its cache."""
    key = cache_keyword(model)
    device = next(model.parameters()).device
    start = time.perf_counter()
    out = model(input_ids=torch.tensor([prompt_ids], device=device), use_cache=True, logits_to_keep=1)
    cache = returned_cache(out)
    cache.batch_repeat_interleave(group_size)
    token = torch.full((group_size, 1), prompt_ids[-1], device=device)
    for _ in range(new_tokens - 1):
        out = model(input_ids=token, use_cache=True, logits_to_keep=1, **{key: cache})
        cache = returned_cache(out)
        token = out.logits[:, -1:].argmax(-1)
    return time.perf_counter() - start


def profile_update(model: Any, batch: UpdateBatch, mode: str, rows: int = 12) -> str:
    """torch.profiler's table of the ``rows`` ops with the most CPU time in one update in ``mode``."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        update_seconds(model, batch, mode)
    return prof.key_averages().table(sort_by="cpu_time_total", row_limit=rows)
