"""``MRTPOConfig``: TRL's ``GRPOConfig`` plus the credit-assignment knobs, and the keys and loss
settings the trainer (:mod:`mrtpo.trainer`) shares with it.

Validation happens at construction, so a wrong setting fails before any model is loaded.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

from trl import GRPOConfig

from mrtpo.counterfactual import DEFAULT_PRIVILEGED_HEADER
from mrtpo.credit import (
    DEFAULT_LAM,
    DEFAULT_W_MAX,
    RELEVANCE_KINDS,
    CreditConfig,
    available_methods,
    get_method,
)
from mrtpo.validation import check_trainer_numbers

#: Loss settings whose objective is built on one advantage (or ratio) per sequence.
SEQUENCE_LEVEL_LOSSES = ("vespo", "luspo")
#: TRL's ``multi_objective_aggregation`` that computes a method's sequence advantages (by its
#: ``CreditMethod.sequence``); TRL's own advantages are then the ones the method averages to.
TRL_AGGREGATION = {"grpo": "sum_then_normalize", "gdpo": "normalize_then_sum"}
#: Key of the ``(B,)`` sequence advantages in the batches handed to TRL's loss.
SEQUENCE_ADVANTAGES_KEY = "mrtpo_sequence_advantages"
#: Key of the ``(B,)`` bool marking completions whose advantage is zero at every token (they cannot
#: move the policy; the update leaves them out where that is exact: :meth:`MRTPOTrainer._skips_zero_rows`).
ZERO_ADVANTAGE_KEY = "mrtpo_zero_advantage"
#: TRL loss types whose normaliser does not depend on the rows in the micro-batch: ``num_items_in_batch``,
#: the global token count of the generation batch, computed before the split. Dropping rows whose
#: per-token loss is 0 then leaves the loss and its gradient unchanged.
GLOBAL_NORMALISER_LOSSES = ("dapo", "cispo")
#: Every per-row key of a text-only batch from TRL's ``_generate_and_score_completions`` (and ours);
#: a batch with any other key (images, ...) is never split by row.
ROW_KEYS = frozenset(
    {
        "prompt_ids",
        "prompt_mask",
        "completion_ids",
        "completion_mask",
        "advantages",
        "old_per_token_logps",
        "sampling_per_token_logps",
        "ref_per_token_logps",
        "importance_sampling_ratio",
        "tool_mask",
        SEQUENCE_ADVANTAGES_KEY,
        ZERO_ADVANTAGE_KEY,
    }
)


def _setting(default, help_text: str):
    """A config field with its one-line help (what ``--help`` and ``mrtpo train --list-keys`` print)."""
    return field(default=default, metadata={"help": help_text})


@dataclass
class MRTPOConfig(GRPOConfig):
    """GRPOConfig plus the credit-assignment knobs of docs/design.md#settings (validated in ``__post_init__``)."""

    method: str = _setting("mrtpo", f"credit method: {', '.join(available_methods())} (the registry's)")
    relevance: str = _setting("js", "relevance of a replay: js (default), kl or logratio")
    lam: float = _setting(
        DEFAULT_LAM, ("weight interpolation: 0 uniform, 1 proportional to relevance (the paper's: lam 1, w_max None)")
    )
    reward_lam: list[float] | None = _setting(
        None,
        (
            "per-reward lam, one entry per reward function in order (overrides lam for per-reward maps); "
            "None: lam for all"
        ),
    )
    w_max: float | None = _setting(
        DEFAULT_W_MAX,
        (
            "cap on one token's weight (then renormalised); None: no cap. The moderate cap: lam 0.5, w_max 3 "
            "(weights in [0.5, 3])"
        ),
    )
    weighting: str = _setting(
        "relevance",
        (
            "token weight shape: relevance (proportional to the map, mixed by lam) or rank (by the token's rank "
            "in its response: E[w^2] fixed by construction)"
        ),
    )
    rank_power: float = _setting(1.0, "rank weighting's profile ((i + 1/2) / n) ** rank_power (1: a line 0..2)")
    weight_mean: str = _setting(
        "response",
        (
            "divide a map by its mean over the response (mean weight 1 per response) or over the batch "
            "(mean 1 over the batch only; a response's tokens then need not average to its sequence advantage)"
        ),
    )
    oracle_shuffle: float = _setting(
        0.0,
        (
            "method oracle only: share q of its known-position mask moved to random tokens of the response "
            "(0: the oracle; the dose-response runs q in 0, .25, .5, .75)"
        ),
    )
    relevance_chunk_size: int | None = _setting(None, "positions per relevance chunk; None: auto")
    relevance_top_k: int | None = _setting(None, "top-k approximation of the JS sum; None: exact")
    replay_micro_batch: int | None = _setting(
        None, ("completions replayed at once (bounds the replay's logits memory); None: a whole prompt group")
    )
    replay_groups_per_pass: int | None = _setting(
        1,
        (
            "prompt groups replayed in one pass of three forward calls (fewer calls; logits memory grows with it); "
            "None: all of a step's groups"
        ),
    )
    skip_zero_advantage: bool = _setting(
        True,
        (
            "leave out the replays and update rows that cannot move the policy (exact); false runs them anyway, "
            "e.g. to time whole steps on a random-weight model whose rewards are all 0"
        ),
    )
    privileged_header: str = _setting(DEFAULT_PRIVILEGED_HEADER, "header above appended privileged evidence")
    credit_batch_norm: bool = _setting(True, "normalise sequence scores over the global batch (GDPO step 3)")
    credit_samples: int = _setting(2, "completions per generation step saved for the token-credit view")
    log_credit_detail: bool = _setting(
        False,
        (
            "send every credit metric (15 a reward: deciles, Gini, entropy, overlaps) to the console and trackers; "
            "false: relevance_mean and top10_share a reward there, the full set in metrics.jsonl"
        ),
    )
    shared_prompt_generation: bool = _setting(
        True, ("prefill each distinct prompt once before sampling its group (transformers generation, text only)")
    )
    fast_generation: bool = _setting(
        True,
        (
            "sample with mrtpo.fast_decode's KV-cache loop instead of transformers' generate for Qwen2 / Llama "
            "models under plain temperature sampling (same distribution, another random stream)"
        ),
    )
    shared_prompt_update: bool = _setting(
        True,
        (
            "run each distinct prompt once in the update's forward and the completions on its KV cache "
            "(same loss and gradient; not under activation checkpointing, which drops the cache)"
        ),
    )
    packed_sequences: bool = _setting(
        False,
        (
            "in the update's forward, pack each prompt's completions behind it in one row under a block mask "
            "instead of padding each to the longest (mrtpo.packing: same values, fewer tokens where lengths vary)"
        ),
    )
    reward_timeout: float | None = _setting(
        300.0,
        (
            "seconds one call of a reward function may take (a call scores a whole batch); past it training stops "
            "naming the function; a note is printed every 30 s while one runs long; None: no deadline"
        ),
    )
    multi_objective_aggregation: str | None = _setting(
        None,
        ("set by method (sum_then_normalize for grpo, normalize_then_sum for the others); another value is refused"),
    )

    def __post_init__(self) -> None:
        check_trainer_numbers(lambda key: getattr(self, key), [f.name for f in fields(self) if f.init])
        super().__post_init__()
        if self.method not in available_methods():
            raise ValueError(f"unknown method {self.method!r}; choose one of {', '.join(available_methods())}")
        if self.relevance not in RELEVANCE_KINDS:
            raise ValueError(f"unknown relevance {self.relevance!r}; choose one of {', '.join(RELEVANCE_KINDS)}")
        if not 0.0 <= self.lam <= 1.0:
            raise ValueError(f"lam must be in [0, 1], got {self.lam}")
        if self.w_max is not None and self.w_max < 1.0:
            raise ValueError(f"w_max must be >= 1 (weights average to 1) or None, got {self.w_max}")
        if not 0.0 <= self.oracle_shuffle <= 1.0:
            raise ValueError(f"oracle_shuffle must be in [0, 1], got {self.oracle_shuffle}")
        if self.reward_lam is not None and not all(0.0 <= float(v) <= 1.0 for v in self.reward_lam):
            raise ValueError(f"every reward_lam entry must be in [0, 1], got {list(self.reward_lam)}")
        # the weight shape's own checks (a wrong weighting, weight_mean or rank_power fails here)
        CreditConfig(weighting=self.weighting, rank_power=self.rank_power, weight_mean=self.weight_mean)
        if self.relevance_chunk_size is not None and self.relevance_chunk_size < 1:
            raise ValueError(f"relevance_chunk_size must be >= 1 or None, got {self.relevance_chunk_size}")
        if self.replay_micro_batch is not None and self.replay_micro_batch < 1:
            raise ValueError(f"replay_micro_batch must be >= 1 or None, got {self.replay_micro_batch}")
        if self.replay_groups_per_pass is not None and self.replay_groups_per_pass < 1:
            raise ValueError(f"replay_groups_per_pass must be >= 1 or None, got {self.replay_groups_per_pass}")
        if self.relevance_top_k is not None:
            if self.relevance_top_k < 1:
                raise ValueError(f"relevance_top_k must be >= 1 or None, got {self.relevance_top_k}")
            if self.relevance != "js":
                raise ValueError("relevance_top_k approximates the JS sum; it needs relevance='js'")
        if not self.privileged_header.strip():
            raise ValueError("privileged_header must be a non-empty line")
        if self.credit_samples < 0:
            raise ValueError(f"credit_samples must be >= 0, got {self.credit_samples}")
        if self.loss_type in SEQUENCE_LEVEL_LOSSES:
            raise ValueError(
                f"loss_type={self.loss_type!r} assumes one advantage per sequence; token-level credit needs a "
                "token-level loss: use one of 'dapo' (default), 'grpo', 'bnpo', 'dr_grpo', 'cispo', 'sapo'"
            )
        aggregation = TRL_AGGREGATION[get_method(self.method).sequence]
        if self.multi_objective_aggregation not in (None, aggregation):
            raise ValueError(
                f"multi_objective_aggregation={self.multi_objective_aggregation!r} contradicts method={self.method!r}, "
                f"whose advantages aggregate the rewards as {aggregation!r}: the method decides how rewards are "
                "combined; leave multi_objective_aggregation unset (or choose another method)"
            )
        if self.scale_rewards != "group" and not (self.method == "grpo" and self.scale_rewards in ("batch", "none")):
            raise ValueError(
                f"scale_rewards={self.scale_rewards!r} is not supported with method={self.method!r}: the GDPO family "
                "(gdpo, mrtpo, contrast, entropy, ...) divides each reward by its group's std and the sum by the "
                "batch's (credit_batch_norm). Leave scale_rewards='group', or use method='grpo', which takes TRL's "
                "'group', 'batch' and 'none' (Dr. GRPO)"
            )
        if self.importance_sampling_level != "token":
            raise ValueError(
                "importance_sampling_level='sequence' (GSPO) weighs whole sequences; token-level credit needs "
                "importance_sampling_level='token'"
            )


__all__ = [
    "GLOBAL_NORMALISER_LOSSES",
    "ROW_KEYS",
    "SEQUENCE_ADVANTAGES_KEY",
    "SEQUENCE_LEVEL_LOSSES",
    "TRL_AGGREGATION",
    "ZERO_ADVANTAGE_KEY",
    "MRTPOConfig",
]
