"""The rows of a micro-batch the update runs under ``skip_zero_advantage``, the same count on every process.

A completion whose advantage is 0 at every token adds exactly nothing to the loss and its gradient
(where :meth:`mrtpo.trainer.MRTPOTrainer._skips_zero_rows` allows the skip), so the update may leave
it out. But TRL's loss gathers per-row tensors across processes (``clip_ratio/low_min`` and
``high_max``), and a gather of unequal sizes aborts under gloo ("Received data size doesn't match")
or hangs under NCCL. So the processes first agree on one row count: the largest number of rows that
move on any of them (at least one, so that every process still makes its forward and backward: DDP's
gradient all-reduce, ZeRO-3 / FSDP parameter gathers). Each keeps all its moving rows and pads up to
that count with its own zero-advantage rows, which add nothing.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from mrtpo.trainer.config import ROW_KEYS


def rows_to_keep(zero: Tensor, count: int) -> Tensor:
    """``(B,)`` bool: every row not in ``zero`` (``(B,)`` bool), then the first zero rows until
    ``count`` rows are kept (all rows when ``count`` reaches ``B``). Rows keep their order."""
    keep = ~zero
    extra = count - int(keep.sum())
    if extra > 0:
        keep = keep.clone()
        keep[zero.nonzero().flatten()[:extra]] = True
    return keep


def rows_that_move(inputs: dict[str, Any], zero: Tensor, accelerator: Any) -> tuple[dict[str, Any], int]:
    """The micro-batch ``inputs`` with only the rows the update must run (``zero`` ``(B,)`` bool: the
    rows whose advantage is 0 at every token), padded to the count all processes agree on, and the
    number of rows left out on all processes together.

    Every process calls this for each micro-batch: with several processes it gathers two integers
    (one process: no collective). A batch carrying keys other than per-row tensors
    (:data:`mrtpo.trainer.config.ROW_KEYS`) cannot be cut and asks for all its rows.
    ``num_items_in_batch`` is kept, so the DAPO / CISPO normaliser is unchanged.
    """
    cuttable = set(inputs) <= ROW_KEYS | {"num_items_in_batch"}
    mine = torch.tensor([max(1, int((~zero).sum())) if cuttable else len(zero), len(zero)])
    every = mine.view(1, 2)  # (processes, [rows wanted, rows held])
    if accelerator.num_processes > 1:
        every = accelerator.gather(mine.to(accelerator.device)).view(-1, 2).cpu()
    count = int(every[:, 0].max())
    left_out = int((every[:, 1] - count).clamp_min(0).sum())
    keep = rows_to_keep(zero, count)
    if bool(keep.all()):
        return inputs, left_out
    return {
        key: value[keep] if key != "num_items_in_batch" and torch.is_tensor(value) else value
        for key, value in inputs.items()
    }, left_out


__all__ = ["rows_that_move", "rows_to_keep"]
