"""mrtpo: multi-reward RL post-training with reward-specific token-level credit assignment.

Each reward's advantage is moved onto the tokens that reward is about, measured by replaying the
policy's own response with and without that reward's evidence (docs/design.md#algorithm).

``from mrtpo import MRTPOConfig, MRTPOTrainer, evidence`` — the trainer pair is imported lazily
(it pulls in TRL), the rest is light.
"""

__version__ = "0.1.0"

from mrtpo.rewards import VerifierReward, evidence  # noqa: E402
from mrtpo.verifiers import Evidence, Example, Verifier  # noqa: E402

_LAZY = {"MRTPOConfig": "mrtpo.trainer.config", "MRTPOTrainer": "mrtpo.trainer.core"}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'mrtpo' has no attribute {name!r}")


__all__ = [
    "Evidence",
    "Example",
    "MRTPOConfig",
    "MRTPOTrainer",
    "Verifier",
    "VerifierReward",
    "__version__",
    "evidence",
]
