"""The math of SPEC §1: group advantages, relevance, token weights, token advantages, methods.

Pure torch functions; nothing here knows about models, tokenizers, TRL or tasks.
"""

from mrtpo.credit.advantages import (
    MIN_BATCH_STD,
    STD_EPS,
    batch_normalize,
    batch_statistics,
    gdpo_advantages,
    group_normalize,
    grpo_advantages,
    token_advantages,
    weighted_reward_sum,
)
from mrtpo.credit.methods import (
    NEEDS,
    CreditBatch,
    CreditConfig,
    CreditMethod,
    available_methods,
    compute_advantages,
    credit_weights,
    get_method,
    register_method,
)
from mrtpo.credit.relevance import (
    DEFAULT_CHUNK_BYTES,
    DEFAULT_CHUNK_SIZE,
    auto_chunk_size,
    JS_DISTANCE_MAX,
    RELEVANCE_KINDS,
    entropy,
    js_distance,
    js_divergence,
    kl_divergence,
    log_ratio,
    log_ratio_from_logprobs,
    relevance,
)
from mrtpo.credit.weights import MIN_MEAN_RELEVANCE, relevance_weights

__all__ = [
    "DEFAULT_CHUNK_BYTES",
    "DEFAULT_CHUNK_SIZE",
    "auto_chunk_size",
    "JS_DISTANCE_MAX",
    "MIN_BATCH_STD",
    "MIN_MEAN_RELEVANCE",
    "NEEDS",
    "RELEVANCE_KINDS",
    "STD_EPS",
    "CreditBatch",
    "CreditConfig",
    "CreditMethod",
    "available_methods",
    "batch_normalize",
    "batch_statistics",
    "compute_advantages",
    "credit_weights",
    "entropy",
    "gdpo_advantages",
    "get_method",
    "group_normalize",
    "grpo_advantages",
    "js_distance",
    "js_divergence",
    "kl_divergence",
    "log_ratio",
    "log_ratio_from_logprobs",
    "register_method",
    "relevance",
    "relevance_weights",
    "token_advantages",
    "weighted_reward_sum",
]
