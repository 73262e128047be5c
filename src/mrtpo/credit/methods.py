"""The credit methods of docs/design.md#methods, side by side, behind one registry.

Each method declares which relevance it *needs* (none, one map per reward, one joint map, or the
policy's entropy) so every caller runs exactly those replays and never branches on method names:
the contexts each ``needs`` kind replays are a row of :data:`mrtpo.replay_plan.CONTEXT_RULES`, whose
plan fills the batch's maps.

    method = get_method(config.method)
    plan = plan_replays(groups, evidences, lengths, method.needs)           # mrtpo.replay_plan
    maps = run_replay_plan(model, plan, contexts_of, completions, lengths)  # mrtpo.replay
    advantages = method(CreditBatch(rewards, g, mask, **maps), credit_config)   # (N, T)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from mrtpo.credit.advantages import gdpo_advantages, grpo_advantages, token_advantages
from mrtpo.credit.oracle import oracle_weights
from mrtpo.credit.weights import WEIGHT_MEANS, WEIGHTINGS, batch_mean_weights, rank_weights, relevance_weights

#: What a method's weights read; a new kind also needs its row in ``mrtpo.replay_plan.CONTEXT_RULES``.
NEEDS: tuple[str, ...] = ("none", "per_reward", "joint", "entropy", "contrastive", "oracle")
#: Sequence-level advantages a method's token advantages average to (per completion, over its mask).
SEQUENCE_ADVANTAGES: tuple[str, ...] = ("grpo", "gdpo")


#: The default weight shape of training, ``mrtpo explain`` and ``mrtpo demo``: every weight in [0.8, 1.2]
#: (lam 0.2, cap 1.2), chosen over the paper's (lam 1, no cap) by the rule written before the runs
#: (docs/results/gym-default-plan.md): no loss against GDPO on any gym family, where the paper's lost on one.
DEFAULT_LAM = 0.2
DEFAULT_W_MAX = 1.2


@dataclass(frozen=True)
class CreditConfig:
    """Knobs shared by all methods. Its defaults are the paper's formula (weights proportional to
    relevance, uncapped); the trainer passes :data:`DEFAULT_LAM` / :data:`DEFAULT_W_MAX` unless told otherwise."""

    lam: float = 1.0  # interpolation uniform (0) → proportional to relevance (1)
    reward_lam: Sequence[float] | None = None  # per-reward lam (one per reward, overrides lam); per_reward maps only
    w_max: float | None = None  # cap on one token's weight, then renormalise (None: no cap)
    batch_norm: bool = True  # GDPO step 3: normalise sequence scores over the global batch
    reward_weights: Sequence[float] | None = None  # ω_k, default all 1
    weighting: str = "relevance"  # "relevance": ∝ the map (λ-mixed); "rank": by rank in the response (weights.py)
    rank_power: float = 1.0  # rank weighting's profile ((i + ½) / n) ** rank_power
    weight_mean: str = "response"  # the map is divided by its mean over the "response" or the whole "batch"
    oracle_shuffle: float = 0.0  # oracle only: share of its mask moved to random tokens (mrtpo.credit.oracle)

    def __post_init__(self) -> None:
        if self.weighting not in WEIGHTINGS:
            raise ValueError(f"weighting must be one of {WEIGHTINGS}, got {self.weighting!r}")
        if self.weight_mean not in WEIGHT_MEANS:
            raise ValueError(f"weight_mean must be one of {WEIGHT_MEANS}, got {self.weight_mean!r}")
        if self.rank_power <= 0:
            raise ValueError(f"rank_power must be > 0, got {self.rank_power}")
        if self.weighting == "rank" and self.weight_mean == "batch":
            raise ValueError("weighting 'rank' ranks tokens within their response; weight_mean 'batch' does not apply")

    def shape(self, distance: Tensor, mask: Tensor, lam: float) -> Tensor:
        """``(B, T)`` weights of one map ``distance`` ``(B, T)`` under this config's shape (with ``lam``)."""
        if self.weighting == "rank":
            return rank_weights(distance, mask, lam, self.rank_power, self.w_max)
        if self.weight_mean == "batch":
            return batch_mean_weights(distance, mask, lam, self.w_max)
        return relevance_weights(distance, mask, lam, self.w_max)


@dataclass
class CreditBatch:
    """What a method may consume. Shapes: N completions, K rewards, T completion positions."""

    rewards: Tensor  # (N, K), NaN = not applicable; rows ordered group by group
    group_size: int
    mask: Tensor  # (N, T), 1 on completion tokens
    relevance: Tensor | None = None  # (N, K, T) per-reward relevance (method needs "per_reward")
    has_evidence: Tensor | Sequence[bool] | None = None  # (K,) or (N, K): which rewards have a replay
    joint_relevance: Tensor | None = None  # (N, T) all evidence at once (needs "joint")
    decoy_relevance: Tensor | None = None  # (N, K, T) each reward's map under another prompt's evidence ("contrastive")
    entropy: Tensor | None = None  # (N, T) the policy's own entropy (needs "entropy")
    known_positions: Tensor | None = None  # (N, K, T) 1 where the task knows reward k is decided (needs "oracle")
    # When set, ``rewards`` is the global batch (all processes) and every other tensor covers only
    # these rows of it; group and batch statistics stay global, so two processes match one.
    rows: slice | None = None

    def local_rewards(self) -> Tensor:
        return self.rewards if self.rows is None else self.rewards[self.rows]


@dataclass(frozen=True)
class CreditMethod:
    """A named advantage estimator: ``method(batch, config) -> (N, T)`` advantages.

    ``sequence``: ``"grpo"`` or ``"gdpo"``, the sequence advantage that each completion's token
    advantages average to (:meth:`sequence_advantages`).
    """

    name: str
    needs: str
    description: str
    fn: Callable[[CreditBatch, CreditConfig], Tensor]
    sequence: str = "gdpo"
    #: ``(weights (N, K, T), batch) -> weights``: what the method does to its ``needs``' weights (controls)
    transform: Callable[[Tensor, CreditBatch], Tensor] | None = None

    def __call__(self, batch: CreditBatch, config: CreditConfig | None = None) -> Tensor:
        return self.fn(batch, config or CreditConfig())

    def sequence_advantages(self, batch: CreditBatch, config: CreditConfig | None = None) -> Tensor:
        """``(N,)`` float32 sequence advantages of the batch's (local) rows: GRPO's or GDPO's, whose
        sign decides per sequence where one is needed (TRL's off-policy mask)."""
        config = config or CreditConfig()
        if self.sequence == "grpo":
            adv = grpo_advantages(batch.rewards, batch.group_size, config.reward_weights)
        else:
            adv = gdpo_advantages(batch.rewards, batch.group_size, config.reward_weights, config.batch_norm)
        return adv if batch.rows is None else adv[batch.rows]

    def weights(self, batch: CreditBatch, config: CreditConfig | None = None) -> Tensor:
        """The ``(N, K, T)`` token weights this method gives each reward (for reports and metrics)."""
        weights = credit_weights(batch, config or CreditConfig(), self.needs)
        return weights if self.transform is None else self.transform(weights, batch)


_METHODS: dict[str, CreditMethod] = {}


def register_method(
    name: str,
    needs: str,
    description: str,
    sequence: str = "gdpo",
    transform: Callable[[Tensor, CreditBatch], Tensor] | None = None,
):
    """Decorator: register ``fn(batch, config) -> (N, T)`` under ``name``; ``sequence`` names the
    sequence advantage its token advantages average to (``"grpo"`` or ``"gdpo"``); ``transform``
    what the method does to the weights of its ``needs`` (:meth:`CreditMethod.weights` applies it)."""
    if needs not in NEEDS:
        raise ValueError(f"needs must be one of {NEEDS}, got {needs!r}")
    if sequence not in SEQUENCE_ADVANTAGES:
        raise ValueError(f"sequence must be one of {SEQUENCE_ADVANTAGES}, got {sequence!r}")

    def wrap(fn: Callable[[CreditBatch, CreditConfig], Tensor]):
        if name in _METHODS:
            raise ValueError(f"credit method {name!r} is already registered")
        _METHODS[name] = CreditMethod(name, needs, description, fn, sequence, transform)
        return fn

    return wrap


def get_method(name: str) -> CreditMethod:
    """The method registered under ``name``; an unknown name lists the available ones."""
    try:
        return _METHODS[name]
    except KeyError:
        raise KeyError(f"unknown credit method {name!r}; available: {', '.join(available_methods())}") from None


def available_methods() -> list[str]:
    return list(_METHODS)


def compute_advantages(method: str, batch: CreditBatch, config: CreditConfig | None = None) -> Tensor:
    """Shortcut for ``get_method(method)(batch, config)``: ``(N, T)`` float32 advantages."""
    return get_method(method)(batch, config)


def _require(value: Tensor | None, what: str, needs: str) -> Tensor:
    if value is None:
        users = [m.name for m in _METHODS.values() if m.needs == needs]
        raise ValueError(f"credit method {'/'.join(map(repr, users))} needs {what}, which the batch does not carry")
    return value


def _broadcast_sequence(adv: Tensor, mask: Tensor) -> Tensor:
    return adv.unsqueeze(1) * mask.to(adv.dtype)


def _evidence_rows(batch: CreditBatch, n: int, k: int) -> Tensor:
    """``(N, K)`` bool: which (completion, reward) pairs have a replay. Accepts ``(K,)`` or ``(N, K)``."""
    if batch.has_evidence is None:
        return torch.ones(n, k, dtype=torch.bool)
    has = torch.as_tensor(batch.has_evidence, dtype=torch.bool)
    if has.dim() == 1:
        has = has.unsqueeze(0).expand(n, k)
    if has.shape != (n, k):
        raise ValueError(f"has_evidence must be (K={k},) or (N={n}, K={k}), got {tuple(has.shape)}")
    return has


def _per_reward_lam(config: CreditConfig, num_rewards: int) -> list[float]:
    """Each reward's ``lam``: ``config.reward_lam`` when set (one entry per reward), else ``config.lam``."""
    if config.reward_lam is None:
        return [config.lam] * num_rewards
    lams = [float(v) for v in config.reward_lam]
    if len(lams) != num_rewards:
        raise ValueError(f"reward_lam must have one entry per reward ({num_rewards}), got {len(lams)}: {lams}")
    if not all(0.0 <= v <= 1.0 for v in lams):
        raise ValueError(f"every reward_lam entry must be in [0, 1], got {lams}")
    return lams


def credit_weights(batch: CreditBatch, config: CreditConfig, needs: str) -> Tensor:
    """Token weights ``(N, K, T)`` a method with these ``needs`` gives each reward (1 = uniform).

    ``per_reward``: each reward's own relevance where it has evidence (with its own ``reward_lam``
    entry when set, so one reward may concentrate while another stays near uniform); ``contrastive``:
    the same on ``max(relevance − decoy_relevance, 0)``, what the response reacts to in this prompt's
    evidence beyond what it reacts to in any evidence of that reward; ``joint`` / ``entropy``:
    one shared map for every reward; ``oracle``: each reward's known positions as its map
    (:func:`mrtpo.credit.oracle.oracle_weights`, mixed with their shuffle by ``oracle_shuffle``);
    ``none``: uniform. Masked positions are 0. The map's shape is ``config.shape``
    (:mod:`mrtpo.credit.weights`); under ``weight_mean="batch"`` the batch is the rows whose map was
    computed (``has_evidence``; for one shared map, the rows where it is not all 0).
    """
    n, k = batch.local_rewards().shape
    t = batch.mask.shape[1]
    weights = batch.mask.to(torch.float32).unsqueeze(1).expand(n, k, t).clone()
    if needs in ("per_reward", "contrastive"):
        relevance = _require(batch.relevance, "per-reward relevance (N, K, T)", needs)
        if relevance.shape != (n, k, t):
            raise ValueError(f"relevance must be (N={n}, K={k}, T={t}), got {tuple(relevance.shape)}")
        if needs == "contrastive":
            decoy = _require(batch.decoy_relevance, "each reward's map under a decoy evidence (N, K, T)", needs)
            if decoy.shape != (n, k, t):
                raise ValueError(f"decoy_relevance must be (N={n}, K={k}, T={t}), got {tuple(decoy.shape)}")
            relevance = (relevance - decoy.to(relevance.dtype)).clamp_min(0.0)
        has = _evidence_rows(batch, n, k)
        lams = _per_reward_lam(config, k)
        for i in range(k):
            if has[:, i].any():
                w = config.shape(relevance[:, i], batch.mask * has[:, i].unsqueeze(1), lams[i])
                weights[has[:, i], i] = w[has[:, i]]
    elif needs == "oracle":
        known = _require(batch.known_positions, "the task's known relevant positions (N, K, T)", needs)
        if known.shape != (n, k, t):
            raise ValueError(f"known_positions must be (N={n}, K={k}, T={t}), got {tuple(known.shape)}")
        shuffled = shuffle_within_responses(known.float(), batch) if config.oracle_shuffle > 0 else None
        weights = oracle_weights(known, batch.mask, config.lam, config.w_max, shuffled, config.oracle_shuffle)
    elif needs in ("joint", "entropy"):
        what = "joint relevance (N, T)" if needs == "joint" else "the policy's per-token entropy (N, T)"
        token_map = _require(batch.joint_relevance if needs == "joint" else batch.entropy, what, needs)
        mapped = batch.mask * (token_map != 0).any(1, keepdim=True) if config.weight_mean == "batch" else batch.mask
        weights = torch.where(mapped.bool(), config.shape(token_map, mapped, config.lam), batch.mask.float())
        weights = weights.unsqueeze(1).expand(n, k, t).clone()
    return weights


def _weighted(batch: CreditBatch, config: CreditConfig, needs: str, weights: Tensor | None = None) -> Tensor:
    return token_advantages(
        batch.rewards,
        batch.group_size,
        credit_weights(batch, config, needs) if weights is None else weights,
        batch.mask,
        config.reward_weights,
        config.batch_norm,
        rows=batch.rows,
    )


def _batch_generator(batch: CreditBatch) -> torch.Generator:
    """A generator seeded by the batch itself (its rewards and lengths): a control's randomness is the
    same on a rerun and on every process, and leaves the global RNG (sampling) untouched."""
    rewards = torch.nan_to_num(batch.rewards.double(), nan=-7.0)
    key = float((rewards * torch.arange(1, rewards.numel() + 1, dtype=torch.float64).view_as(rewards)).sum())
    seed = int(abs(key) * 1000) ^ int(batch.mask.sum()) * 2654435761
    return torch.Generator().manual_seed(seed % (2**63))


def shuffle_within_responses(weights: Tensor, batch: CreditBatch) -> Tensor:
    """``weights`` ``(N, K, T)`` with each (completion, reward) row's values permuted at random among
    the completion's own tokens (mask ``(N, T)``): the same concentration, on arbitrary tokens."""
    n, k, t = weights.shape
    valid = batch.mask.bool().unsqueeze(1).expand(n, k, t)
    keys = torch.rand(n, k, t, generator=_batch_generator(batch)).masked_fill(~valid, 2.0)
    source = keys.argsort(dim=-1)  # the valid positions in random order, then the padding
    target = (~valid).to(torch.int8).argsort(dim=-1, stable=True)  # the valid positions in order, then the padding
    return torch.zeros_like(weights).scatter(-1, target, weights.gather(-1, source))


def swap_between_rewards(weights: Tensor, batch: CreditBatch) -> Tensor:
    """``weights`` ``(N, K, T)`` with reward ``k`` given reward ``k + 1``'s weights (cyclically): each
    reward's advantage on another reward's tokens."""
    return weights.roll(-1, dims=1)


@register_method("grpo", needs="none", description="sum rewards, group-normalise; uniform over tokens", sequence="grpo")
def _grpo(batch: CreditBatch, config: CreditConfig) -> Tensor:
    return _broadcast_sequence(get_method("grpo").sequence_advantages(batch, config), batch.mask)


@register_method("gdpo", needs="none", description="per-reward normalise, sum, batch-normalise; uniform")
def _gdpo(batch: CreditBatch, config: CreditConfig) -> Tensor:
    return _broadcast_sequence(get_method("gdpo").sequence_advantages(batch, config), batch.mask)


@register_method("mrtpo", needs="per_reward", description="GDPO, each reward's advantage on its own JS map")
def _mrtpo(batch: CreditBatch, config: CreditConfig) -> Tensor:
    return _weighted(batch, config, "per_reward")


@register_method("contrast", needs="joint", description="GDPO on one map from a replay with all evidence at once")
def _contrast(batch: CreditBatch, config: CreditConfig) -> Tensor:
    return _weighted(batch, config, "joint")


@register_method("entropy", needs="entropy", description="GDPO on one map from the policy's own entropy")
def _entropy(batch: CreditBatch, config: CreditConfig) -> Tensor:
    return _weighted(batch, config, "entropy")


@register_method(
    "mrtpo-contrastive",
    needs="contrastive",
    description="MRTPO on each reward's map less its map under another prompt's evidence",
)
def _mrtpo_contrastive(batch: CreditBatch, config: CreditConfig) -> Tensor:
    return _weighted(batch, config, "contrastive")


@register_method(
    "oracle",
    needs="oracle",
    description="upper bound: each reward's advantage on the positions the task knows it reads",
)
def _oracle(batch: CreditBatch, config: CreditConfig) -> Tensor:
    return _weighted(batch, config, "oracle")


@register_method(
    "mrtpo-shuffled",
    needs="per_reward",
    transform=shuffle_within_responses,
    description="control: MRTPO's weights permuted at random within each response",
)
def _mrtpo_shuffled(batch: CreditBatch, config: CreditConfig) -> Tensor:
    return _weighted(batch, config, "per_reward", get_method("mrtpo-shuffled").weights(batch, config))


@register_method(
    "mrtpo-swapped",
    needs="per_reward",
    transform=swap_between_rewards,
    description="control: each reward's advantage on the next reward's MRTPO map",
)
def _mrtpo_swapped(batch: CreditBatch, config: CreditConfig) -> Tensor:
    return _weighted(batch, config, "per_reward", get_method("mrtpo-swapped").weights(batch, config))


__all__ = [
    "DEFAULT_LAM",
    "DEFAULT_W_MAX",
    "NEEDS",
    "SEQUENCE_ADVANTAGES",
    "CreditBatch",
    "CreditConfig",
    "CreditMethod",
    "available_methods",
    "compute_advantages",
    "credit_weights",
    "get_method",
    "register_method",
    "shuffle_within_responses",
    "swap_between_rewards",
]
