"""mrtpo: multi-reward RL post-training with reward-specific token-level credit assignment.

Each reward's advantage is moved onto the tokens that reward is about, measured by replaying the
policy's own response with and without that reward's evidence (SPEC §1).
"""

__version__ = "0.1.0"

from mrtpo.verifiers import Evidence, Example, Verifier  # noqa: E402  (re-exported types)

__all__ = ["Evidence", "Example", "Verifier", "__version__"]
