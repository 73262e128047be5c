"""An independent reference of the trainer's token advantages, written from docs/design.md#the-algorithm.

Used by the trainer-level setting tests (``test_trainer_settings.py``): every map comes from plain forward
passes of the model, one unpadded sequence ``context + completion`` per context (no KV cache, no
:mod:`mrtpo.replay`, no :mod:`mrtpo.credit` kernel), and the weights and advantages from the documented
formulas (steps 2 to 6), in float64. The contexts are built by hand from the chat messages (a span cut
from its message, privileged text appended to the last user turn under the header) and rendered with the
tokenizer's chat template, as TRL renders a prompt. Nothing here imports the code under test.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

#: docs/design.md#settings: the default header above appended privileged evidence.
DEFAULT_HEADER = "Reference information for checking the answer:"
STD_EPS, MIN_BATCH_STD, MIN_MEAN_RELEVANCE = 1e-4, 1e-3, 1e-6


@dataclass
class Settings:
    """The settings the reference computes under (the documented defaults of ``MRTPOConfig``)."""

    method: str = "mrtpo"
    relevance: str = "js"
    top_k: int | None = None
    temperature: float = 1.0
    lam: float = 0.2
    reward_lam: list[float] | None = None
    w_max: float | None = 1.2
    reward_weights: list[float] | None = None
    batch_norm: bool = True
    header: str = DEFAULT_HEADER
    # per reward: "in_prompt", "privileged" or None (no evidence); the evidence text comes from ``evidence_of``
    placements: list[str | None] = field(default_factory=list)


# --- contexts ----------------------------------------------------------------------------------
def render_ids(tok, messages: list[dict]) -> list[int]:
    """Token ids of ``messages`` rendered as TRL renders a chat prompt for generation."""
    text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return list(tok(text, add_special_tokens=False)["input_ids"])


def without_span(messages: list[dict], span: str) -> list[dict]:
    """The messages with ``span`` (at the end of one message, after a space) cut out."""
    holders = [m for m in messages if span in m["content"]]
    assert len(holders) == 1 and holders[0]["content"].endswith(" " + span), "reference handles a trailing span"
    return [{**m, "content": m["content"][: -len(span) - 1]} if m is holders[0] else dict(m) for m in messages]


def with_appended(messages: list[dict], text: str, header: str) -> list[dict]:
    """The messages with ``text`` appended to the last user turn under ``header``."""
    last = max(i for i, m in enumerate(messages) if m["role"] == "user")
    return [
        {**m, "content": f"{m['content']}\n\n{header}\n{text}"} if i == last else dict(m)
        for i, m in enumerate(messages)
    ]


def with_replaced(messages: list[dict], span: str, other: str) -> list[dict]:
    return [{**m, "content": m["content"].replace(span, other)} for m in messages]


# --- plain forwards and per-position relevance --------------------------------------------------
@torch.no_grad()
def plain_logits(model, context: list[int], completion: list[int]) -> torch.Tensor:
    """``(T, V)`` float64 logits predicting each completion token after ``context``: one plain forward."""
    ids = torch.tensor([context + completion])
    logits = model(input_ids=ids).logits[0].double()
    return logits[len(context) - 1 : len(context) - 1 + len(completion)]


def _log_softmax(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    return torch.log_softmax(logits / temperature, dim=-1)


def _jsd(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """JSD (natural log) of each row of two probability tables."""
    m = 0.5 * (p + q)

    def kl(a, b):
        return torch.where(a > 0, a * (a.clamp_min(1e-300).log() - b.clamp_min(1e-300).log()), 0.0).sum(-1)

    return (0.5 * kl(p, m) + 0.5 * kl(q, m)).clamp_min(0.0)


def relevance(
    kind: str,
    with_logits: torch.Tensor,
    without_logits: torch.Tensor,
    tokens: list[int],
    temperature: float,
    top_k: int | None = None,
) -> torch.Tensor:
    """``(T,)`` relevance per position of p = with, q = without (step 4's table)."""
    logp, logq = _log_softmax(with_logits, temperature), _log_softmax(without_logits, temperature)
    p, q = logp.exp(), logq.exp()
    if kind == "js" and top_k is None:
        return _jsd(p, q).sqrt()
    if kind == "js":  # the mixture's top-k tokens plus one tail bucket per distribution
        index = (p + q).topk(top_k, dim=-1).indices
        hp, hq = p.gather(-1, index), q.gather(-1, index)
        p2 = torch.cat([hp, (1 - hp.sum(-1, keepdim=True)).clamp_min(0)], -1)
        q2 = torch.cat([hq, (1 - hq.sum(-1, keepdim=True)).clamp_min(0)], -1)
        return _jsd(p2, q2).sqrt()
    if kind == "kl":
        return (p * (logp - logq)).sum(-1).clamp_min(0.0)
    if kind == "logratio":
        y = torch.tensor(tokens).unsqueeze(1)
        return (logp.gather(-1, y) - logq.gather(-1, y)).abs().squeeze(1)
    raise ValueError(kind)


def entropy(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    logp = _log_softmax(logits, temperature)
    return -(logp.exp() * logp).sum(-1)


# --- weights and advantages (steps 2, 3, 5, 6) -----------------------------------------------------
def token_weights(d: torch.Tensor, valid: torch.Tensor, lam: float, w_max: float | None) -> torch.Tensor:
    """Step 5 for one row: ``d`` ``(T,)`` relevance, ``valid`` ``(T,)`` bool -> weights averaging 1 over valid."""
    out = torch.zeros_like(d)
    n = int(valid.sum())
    if n == 0:
        return out
    x = d[valid].clamp_min(0.0)
    m = float(x.mean())
    w = torch.ones(n, dtype=torch.float64) if m < MIN_MEAN_RELEVANCE else (1 - lam) + lam * x / m
    if w_max is not None:
        capped = torch.zeros(n, dtype=torch.bool)
        while True:  # water-filling: cap, give the rest of the budget to the free entries, repeat
            capped |= w >= w_max
            w[capped] = w_max
            free = ~capped
            budget = n - w_max * int(capped.sum())
            if float(w[free].sum()) > 0:
                w[free] = w[free] * budget / float(w[free].sum())
            else:
                w[free] = budget / max(1, int(free.sum()))
            if not bool((w[free] > w_max + 1e-12).any()):
                break
    out[valid] = w
    return out


def group_normalized(values: torch.Tensor, group: int) -> torch.Tensor:
    """Step 2 on a ``(N,)`` column: ``(x − mean) / (std + 1e-4)`` per group, 0 for a group without spread."""
    out = torch.zeros_like(values)
    for start in range(0, len(values), group):
        x = values[start : start + group]
        std = float(x.std(unbiased=True)) if len(x) > 1 else 0.0
        if std > 0:
            out[start : start + group] = (x - x.mean()) / (std + STD_EPS)
    return out


def batch_scaled(scores: torch.Tensor, mean: float, std: float, batch_norm: bool) -> torch.Tensor:
    """Step 3/6's final scaling: ``(S − μ) / (σ + 1e-4)``, ``S − μ`` below ``MIN_BATCH_STD``, ``S`` without."""
    if not batch_norm:
        return scores
    return (scores - mean) / (std + STD_EPS) if std >= MIN_BATCH_STD else scores - mean


@dataclass
class Batch:
    """One generation step as the trainer held it: prompt rows' messages and evidence, token ids, masks."""

    messages: list[list[dict]]  # (N,) each row's chat prompt
    evidence: list[list[str | None]]  # (N, K) each reward's evidence text (None: none for that row)
    prompt_ids: list[list[int]]  # (N,) unpadded
    completions: list[list[int]]  # (N,) unpadded (completion_mask)
    mask: torch.Tensor  # (N, T) the credit mask: completion_mask × tool_mask
    rewards: torch.Tensor  # (N, K), finite
    group: int


def _maps(model, tok, batch: Batch, s: Settings) -> dict[str, torch.Tensor]:
    """Every map the methods read, ``(N, K, T)`` / ``(N, T)``, from plain forwards at ``s.temperature``."""
    n, k, t = len(batch.completions), batch.rewards.shape[1], batch.mask.shape[1]
    own, decoy = torch.zeros(n, k, t, dtype=torch.float64), torch.zeros(n, k, t, dtype=torch.float64)
    joint, ent = torch.zeros(n, t, dtype=torch.float64), torch.zeros(n, t, dtype=torch.float64)
    group_firsts = list(range(0, n, batch.group))
    for j in range(n):
        messages, tokens = batch.messages[j], batch.completions[j]
        length = len(tokens)
        original = render_ids(tok, messages)
        assert original == batch.prompt_ids[j], "the reference renders the prompt TRL generated from"

        def logits(msgs):
            return plain_logits(model, render_ids(tok, msgs), tokens)

        def rel(with_msgs, without_msgs):
            return relevance(s.relevance, logits(with_msgs), logits(without_msgs), tokens, s.temperature, s.top_k)

        base = plain_logits(model, original, tokens)
        ent[j, :length] = entropy(base, s.temperature)
        joint_msgs = messages
        g = group_firsts.index(j - j % batch.group)
        for i, placement in enumerate(s.placements):
            text = batch.evidence[j][i]
            if placement is None or text is None:
                continue
            # the decoy: this reward's evidence in the next group (cyclically) whose text differs
            others = [
                batch.evidence[group_firsts[(g + step) % len(group_firsts)]][i] for step in range(1, len(group_firsts))
            ]
            other = next((o for o in others if o is not None and o != text), None)
            if placement == "in_prompt":  # with = the original, without = the span removed
                removed = without_span(messages, text)
                own[j, i, :length] = rel(messages, removed)
                joint_msgs = without_span(joint_msgs, text)
                if other is not None:  # decoy in place of the span, against the span removed
                    decoy[j, i, :length] = rel(with_replaced(messages, text, other), removed)
            else:  # with = the evidence appended, without = the original
                own[j, i, :length] = rel(with_appended(messages, text, s.header), messages)
                joint_msgs = with_appended(joint_msgs, text, s.header)
                if other is not None:
                    decoy[j, i, :length] = rel(with_appended(messages, other, s.header), messages)
        if joint_msgs is not messages:  # the original carries the evidence (the in_prompt convention)
            joint[j, :length] = relevance(s.relevance, base, logits(joint_msgs), tokens, s.temperature, s.top_k)
    return {"own": own, "decoy": decoy, "joint": joint, "entropy": ent}


def reference_advantages(model, tok, batch: Batch, s: Settings) -> torch.Tensor:
    """``(N, T)`` token advantages of ``s.method`` on ``batch`` (docs/design.md#the-algorithm)."""
    rewards, mask = batch.rewards.double(), batch.mask.double()
    assert torch.isfinite(rewards).all(), "the reference handles finite rewards only"
    n, k = rewards.shape
    omega = torch.tensor(s.reward_weights or [1.0] * k, dtype=torch.float64)
    if s.method == "grpo":
        a = group_normalized((rewards * omega).sum(1), batch.group)
        return a.unsqueeze(1) * mask
    coefficients = torch.stack([group_normalized(rewards[:, i], batch.group) for i in range(k)], 1) * omega
    scores = coefficients.sum(1)
    mean, std = float(scores.mean()), float(scores.std(unbiased=True)) if n > 1 else 0.0
    weights = mask.unsqueeze(1).repeat(1, k, 1)
    if s.method != "gdpo":
        maps = _maps(model, tok, batch, s)
        lams = s.reward_lam or [s.lam] * k
        for j in range(n):
            valid = mask[j] > 0
            members = slice(j - j % batch.group, j - j % batch.group + batch.group)
            for i in range(k):
                # a reward without evidence, or whose coefficient is 0 for the whole group, keeps w = mask
                active = bool((coefficients[members, i] != 0).any())
                if s.method in ("contrast", "entropy"):
                    shared = maps["joint" if s.method == "contrast" else "entropy"][j]
                    if bool((coefficients[members] != 0).any()):
                        weights[j, i] = token_weights(shared, valid, s.lam, s.w_max)
                elif s.placements[i] is not None and batch.evidence[j][i] is not None and active:
                    d = maps["own"][j, i]
                    if s.method == "mrtpo-contrastive":
                        d = (d - maps["decoy"][j, i]).clamp_min(0.0)
                    weights[j, i] = token_weights(d, valid, lams[i], s.w_max)
        if s.method == "mrtpo-swapped":
            weights = weights.roll(-1, dims=1)
    per_token = (coefficients.unsqueeze(2) * weights).sum(1)
    return batch_scaled(per_token, mean, std, s.batch_norm) * mask
