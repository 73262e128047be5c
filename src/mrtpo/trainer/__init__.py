"""The TRL side of MRTPO: :class:`MRTPOTrainer` (a ``GRPOTrainer`` subclass) and :class:`MRTPOConfig`.

- :mod:`mrtpo.trainer.core`: the trainer (rewards, token advantages into TRL's loss), with its two halves
  :mod:`mrtpo.trainer.replay_step` (the evidence replays) and :mod:`mrtpo.trainer.credit_log` (the credit logs);
- :mod:`mrtpo.trainer.config`: ``MRTPOConfig`` and the keys the trainer shares with it;
- :mod:`mrtpo.trainer.metrics`: the credit metrics and the JSONL logs, pure functions of tensors;
- :mod:`mrtpo.trainer.card`: the model card (MRTPO, its paper, the base model);
- :mod:`mrtpo.trainer.update_rows`: the rows an update runs, the same count on every process.

The names below load on first use, so resolving a config (:mod:`mrtpo.config` imports
:mod:`mrtpo.trainer.config`) does not import the trainer and its replay.
"""

from __future__ import annotations

import importlib

_DEFINED_IN = {
    "MRTPOTrainer": "mrtpo.trainer.core",
    "MRTPOConfig": "mrtpo.trainer.config",
    "SEQUENCE_ADVANTAGES_KEY": "mrtpo.trainer.config",
    "ZERO_ADVANTAGE_KEY": "mrtpo.trainer.config",
}


def __getattr__(name: str):
    if name in _DEFINED_IN:
        return getattr(importlib.import_module(_DEFINED_IN[name]), name)
    raise AttributeError(f"module 'mrtpo.trainer' has no attribute {name!r}")


__all__ = ["MRTPOConfig", "MRTPOTrainer", "SEQUENCE_ADVANTAGES_KEY", "ZERO_ADVANTAGE_KEY"]
