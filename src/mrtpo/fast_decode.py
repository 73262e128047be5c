"""Sampling without ``transformers.generate``'s per-token overhead, for Qwen2- and Llama-shaped models.

On a small policy ``generate`` spends most of each token outside arithmetic: attention masks rebuilt
every step, a cache grown by concatenation, logits processors, a slow ``multinomial``. :func:`sample`
keeps the same model and the same distribution, and pays that once per call instead of once per token:

1. each distinct prompt row is prefilled once through the model's own forward (a group of ``G``
   samples pays its prompt once), and its KV cache is copied into preallocated buffers;
2. every new token runs one decode step written here from the model's own modules and weights: its
   embedding, norms' weights, linear layers (a LoRA adapter on a projection applies, since the wrapped
   module is called) and rotary frequencies; attention reads the buffer up to the current column
   with one additive mask fixed for the whole call;
3. the next token is drawn by inverse CDF from ``softmax(logits / temperature)`` with one uniform
   per row: the distribution ``generate`` samples from, from another random stream.

Only what ``generate`` would do for the settings it accepts (:func:`fast_sampling_supported`): plain
temperature sampling, no top-k / top-p / min-p / repetition penalty, default or Llama-3 rotary
embeddings, no sliding window. Anything else goes to ``generate``.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from mrtpo.model_calls import returned_cache, underlying_model
from mrtpo.shared_prompt import distinct_rows, generate_with_shared_prefill, patched_generate

#: Model families whose decoder layer this module's decode step reproduces.
SUPPORTED_MODEL_TYPES = ("qwen2", "llama")
#: Largest model sampled here. The decode step copies the weights (folded) once per call, and above a
#: few tens of millions of parameters decoding is bound by the matrix products, where ``generate``'s
#: per-token overhead is a small share: measured only on the gym's 0.33 M-parameter policy.
MAX_PARAMETERS = 50_000_000
_ROPE_TYPES = ("default", "llama3", "linear")


def _neutral(value: Any, neutral: Any) -> bool:
    return value is None or value == neutral


def fast_sampling_supported(model: Any, generation_config: Any) -> bool:
    """Whether :func:`sample` reproduces ``model.generate(generation_config=...)``'s distribution."""
    inner = underlying_model(model)
    config = getattr(inner, "config", None)
    if config is None or getattr(config, "model_type", None) not in SUPPORTED_MODEL_TYPES:
        return False
    if sum(p.numel() for p in inner.parameters()) > MAX_PARAMETERS:
        return False
    rope = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    body = getattr(inner, "model", None)
    if (rope.get("rope_type", "default") not in _ROPE_TYPES or getattr(config, "use_sliding_window", False)
            or getattr(config, "hidden_act", None) != "silu" or body is None or not hasattr(body, "layers")
            or (inner.training and getattr(config, "attention_dropout", 0.0))):
        return False
    g = generation_config
    return (bool(getattr(g, "do_sample", False)) and _neutral(getattr(g, "top_k", None), 0)
            and _neutral(getattr(g, "top_p", None), 1.0) and getattr(g, "min_p", None) is None
            and _neutral(getattr(g, "repetition_penalty", None), 1.0) and not getattr(g, "suppress_tokens", None)
            and not getattr(g, "bad_words_ids", None) and _neutral(getattr(g, "num_beams", None), 1)
            and _neutral(getattr(g, "num_return_sequences", None), 1) and not getattr(g, "min_new_tokens", None)
            and getattr(g, "max_new_tokens", None) is not None and (getattr(g, "temperature", None) or 1.0) > 0)


class Unsupported(Exception):
    """The model holds a layer the decode step cannot reproduce exactly."""


def effective_linear(module: torch.nn.Module) -> tuple[Tensor, Tensor | None]:
    """``(weight (out, in), bias (out,) or None)`` that ``module`` applies: a plain ``nn.Linear``'s
    own, or a PEFT LoRA layer's base weight plus its active adapters' deltas (exact when its dropout
    is off). Raises :class:`Unsupported` for anything else."""
    if type(module) is torch.nn.Linear:
        return module.weight, module.bias
    base = getattr(module, "base_layer", None)
    if type(base) is not torch.nn.Linear or not hasattr(module, "get_delta_weight"):
        raise Unsupported(f"{type(module).__name__} is neither nn.Linear nor a LoRA layer over one")
    weight = base.weight
    if not getattr(module, "merged", False) and not getattr(module, "disable_adapters", False):
        for name in module.active_adapters:
            if name not in module.lora_A:
                continue
            dropout = module.lora_dropout[name]
            if module.training and isinstance(dropout, torch.nn.Dropout) and dropout.p > 0:
                raise Unsupported("LoRA dropout is active (training mode)")
            if getattr(module, "use_dora", {}).get(name, False):
                raise Unsupported("DoRA adapters")
            weight = weight + module.get_delta_weight(name).to(weight.dtype)
    return weight, base.bias


def _norm_weight(norm: torch.nn.Module) -> tuple[Tensor, float]:
    return norm.weight, float(getattr(norm, "variance_epsilon", None) or getattr(norm, "eps", 1e-6))


def _rms_scaled(x: Tensor, eps: float) -> Tensor:
    """``x / sqrt(mean(x²) + eps)`` over the last dimension (an RMSNorm without its weight, which
    :class:`_DecodeStep` folds into the next projection)."""
    return x * torch.rsqrt(x.square().mean(-1, keepdim=True) + eps)


def rotate_half_matrix(head_dim: int, heads: int, dtype: torch.dtype, device: torch.device) -> Tensor:
    """``(heads·D, heads·D)`` matrix ``R`` with ``x @ R.T`` = rotary's ``rotate_half`` on each head of
    ``x`` ``(…, heads·D)``: ``[x1, x2] -> [−x2, x1]``."""
    half = head_dim // 2
    block = torch.zeros(head_dim, head_dim, dtype=dtype, device=device)
    block[torch.arange(half), torch.arange(half) + half] = -1.0
    block[torch.arange(half) + half, torch.arange(half)] = 1.0
    return torch.block_diag(*[block] * heads)


class _DecodeStep:
    """One token through a Qwen2 / Llama model for ``B`` rows, reading and writing preallocated KV
    buffers. Built once per :func:`sample` call from the model's current weights, folded so a layer
    is 6 matrix products and a few element-wise ops:

    - each RMSNorm's weight is folded into the projection after it (``W · diag(w)``);
    - the query, key and value projections and their rotated copies (``R W``, so rotary's
      ``rotate_half`` is part of the product) are one matrix; the attention scale ``1/√D`` is folded
      into the query rows;
    - keys are stored transposed ``(B, KVH, D, columns)`` so the score product reads them in place;
    - the output and down projections add into the residual stream (``addmm``).
    """

    def __init__(self, inner: Any, rows: int, columns: int, dtype: torch.dtype, device: torch.device):
        body, config = inner.model, inner.config
        self.embed = body.embed_tokens.weight
        first = body.layers[0].self_attn
        d = first.head_dim
        self.head_dim, self.kv_heads = d, config.num_key_value_heads
        self.groups = config.num_attention_heads // self.kv_heads
        self.q_width, self.k_width = config.num_attention_heads * d, self.kv_heads * d
        rotate = rotate_half_matrix(d, config.num_attention_heads + self.kv_heads, dtype, device)
        self.layers = []
        with torch.no_grad():
            for layer in body.layers:
                attn, mlp = layer.self_attn, layer.mlp
                (wq, bq), (wk, bk), (wv, bv) = (effective_linear(m) for m in (attn.q_proj, attn.k_proj, attn.v_proj))
                norm_in, eps_in = _norm_weight(layer.input_layernorm)
                scale = torch.tensor(first.scaling, dtype=dtype, device=device)
                wqk = torch.cat([wq * scale, wk]) * norm_in
                bqk = torch.cat([bq * scale if bq is not None else torch.zeros(wq.shape[0], dtype=dtype, device=device),
                                 bk if bk is not None else torch.zeros(wk.shape[0], dtype=dtype, device=device)])
                bv = bv if bv is not None else torch.zeros(wv.shape[0], dtype=dtype, device=device)
                w_in = torch.cat([wqk, wv * norm_in, rotate @ wqk]).t().contiguous()
                b_in = torch.cat([bqk, bv, rotate @ bqk])
                (wo, bo) = effective_linear(attn.o_proj)
                norm_post, eps_post = _norm_weight(layer.post_attention_layernorm)
                (wg, bg), (wu, bu), (wd, bd) = (effective_linear(m)
                                                for m in (mlp.gate_proj, mlp.up_proj, mlp.down_proj))
                if any(b is not None for b in (bo, bg, bu, bd)):
                    raise Unsupported("biases on the output or MLP projections")
                w_gate_up = (torch.cat([wg, wu]) * norm_post).t().contiguous()
                self.layers.append((eps_in, w_in, b_in, wo.t(), eps_post, w_gate_up, wd.t()))
            head_weight, head_bias = effective_linear(inner.lm_head)
            norm_final, self.eps_final = _norm_weight(body.norm)
            self.head = ((head_weight * norm_final).t().contiguous(), head_bias)
        shape = (rows, self.kv_heads, columns, d)
        self.keys_t = [torch.zeros(rows, self.kv_heads, d, columns, dtype=dtype, device=device) for _ in body.layers]
        self.values = [torch.zeros(shape, dtype=dtype, device=device) for _ in body.layers]
        rotary = body.rotary_emb
        positions = torch.arange(columns, device=device, dtype=torch.float32)
        freqs = positions[:, None] * rotary.inv_freq.to(device=device, dtype=torch.float32)[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        heads = config.num_attention_heads + self.kv_heads  # one (cos, sin) row covers queries and keys
        self.cos = (emb.cos() * rotary.attention_scaling).to(dtype).repeat(1, heads)  # (columns, (H + KVH)·D)
        self.sin = (emb.sin() * rotary.attention_scaling).to(dtype).repeat(1, heads)

    def load_prompt_cache(self, cache: Any, inverse: Tensor, width: int) -> None:
        """Copy a prefill's per-layer keys/values ``(U, KVH, width, D)`` into the buffers' first
        ``width`` columns, row ``b`` from distinct row ``inverse[b]``."""
        for i, layer in enumerate(cache.layers):
            self.keys_t[i][..., :width] = layer.keys.index_select(0, inverse).transpose(-1, -2)
            self.values[i][:, :, :width] = layer.values.index_select(0, inverse)

    def keep_rows(self, keep: Tensor) -> None:
        """Keep only the rows ``keep`` ``(B,)`` bool of the key/value buffers (rows that have ended)."""
        self.keys_t = [k[keep] for k in self.keys_t]
        self.values = [v[keep] for v in self.values]

    def __call__(self, tokens: Tensor, positions: Tensor, column: int, bias: Tensor) -> Tensor:
        """Float32 logits ``(B, V)`` of the next token after ``tokens`` ``(B,)`` at ``positions``
        ``(B,)``, written to buffer column ``column``; ``bias`` ``(B, 1, 1, columns)`` is 0 where a
        key is attended and −inf at padding."""
        b, qk, d = tokens.shape[0], self.q_width + self.k_width, self.head_dim
        h = self.embed[tokens]  # (B, H)
        cos, sin = self.cos[positions], self.sin[positions]  # (B, (H + KVH)·D)
        span = column + 1
        mask = bias[..., :span]
        for i, (eps_in, w_in, b_in, wo_t, eps_post, w_gate_up, wd_t) in enumerate(self.layers):
            projected = torch.addmm(b_in, _rms_scaled(h, eps_in), w_in)  # (B, QK + V + QK)
            rotated = torch.addcmul(projected[:, :qk] * cos, projected[:, qk + self.k_width:], sin)
            q = rotated[:, :self.q_width].view(b, self.kv_heads, self.groups, d)
            self.keys_t[i][..., column] = rotated[:, self.q_width:].view(b, self.kv_heads, d)
            self.values[i][:, :, column] = projected[:, qk:qk + self.k_width].view(b, self.kv_heads, d)
            scores = torch.matmul(q, self.keys_t[i][..., :span])  # (B, KVH, G, L), already scaled
            weights = torch.softmax(scores.float() + mask, dim=-1).to(q.dtype)
            attended = torch.matmul(weights, self.values[i][:, :, :span])  # (B, KVH, G, D)
            h = torch.addmm(h, attended.reshape(b, -1), wo_t)
            gate, up = (_rms_scaled(h, eps_post) @ w_gate_up).chunk(2, dim=-1)
            h = torch.addmm(h, F.silu(gate) * up, wd_t)
        weight, head_bias = self.head
        logits = _rms_scaled(h, self.eps_final) @ weight
        return (logits if head_bias is None else logits + head_bias).float()


def draw(probs: Tensor, uniform: Tensor) -> Tensor:
    """Inverse-CDF draw: for each row of ``probs`` ``(B, V)`` the first index whose cumulative
    probability exceeds ``uniform`` ``(B,)`` in [0, 1) times the row's total. ``(B,)`` long."""
    cdf = probs.cumsum(-1)
    picked = torch.searchsorted(cdf, (uniform * cdf[:, -1]).unsqueeze(1), right=True).squeeze(1)
    return picked.clamp_max(probs.shape[1] - 1)


@torch.no_grad()
def sample(model: Any, input_ids: Tensor, attention_mask: Tensor, generation_config: Any,
           return_logits: bool = False) -> Tensor | tuple[Tensor, Tensor]:
    """What ``model.generate(input_ids, attention_mask, generation_config=...)`` returns under
    sampling: ``(B, P + T)`` ids, the prompt then up to ``max_new_tokens`` new tokens, rows that
    ended (an EOS) padded with ``pad_token_id``, stopping when every row has ended.

    ``input_ids`` / ``attention_mask`` ``(B, P)`` left-padded. Once half the rows still decoding have
    ended, the ended ones leave the batch (every row still draws its uniform, so the tokens do not
    depend on when that happens). ``return_logits`` also returns the float32 logits ``(B, T, V)`` each
    new token was drawn from, NaN for rows that had left (for tests). Call only where
    :func:`fast_sampling_supported` is true; raises :class:`Unsupported` before any forward when a
    projection is neither a linear layer nor a LoRA layer over one.
    """
    inner = underlying_model(model)
    g = generation_config
    eos = g.eos_token_id if isinstance(g.eos_token_id, (list, tuple)) else [g.eos_token_id]
    eos = torch.tensor([e for e in eos if e is not None], device=input_ids.device, dtype=torch.long)
    pad = g.pad_token_id if g.pad_token_id is not None else (int(eos[0]) if len(eos) else 0)
    temperature = float(g.temperature or 1.0)
    rows, width = input_ids.shape
    steps = int(g.max_new_tokens)
    mask = attention_mask.bool()

    step = _DecodeStep(inner, rows, width + steps, next(inner.parameters()).dtype, input_ids.device)
    ids, distinct_mask, inverse = distinct_rows(input_ids, attention_mask)
    positions = (distinct_mask.long().cumsum(-1) - 1).clamp_min(0)
    out = model(input_ids=ids, attention_mask=distinct_mask, position_ids=positions, use_cache=True, logits_to_keep=1)
    logits = out.logits[:, -1].float().index_select(0, inverse)  # (B, V)
    step.load_prompt_cache(returned_cache(out), inverse, width)
    del out
    bias = torch.zeros(rows, 1, 1, width + steps, device=input_ids.device)
    bias[:, 0, 0, :width] = torch.where(mask, 0.0, float("-inf"))
    position = mask.long().sum(-1)  # the first new token's position: the prompt's real length
    unfinished = torch.ones(rows, dtype=torch.bool, device=input_ids.device)
    active = torch.arange(rows, device=input_ids.device)  # the rows the decode step still runs
    new_tokens, seen = [], []
    for t in range(steps):
        uniform = torch.rand(rows, device=input_ids.device)  # every row's draw: the stream ignores compaction
        probs = torch.softmax(logits / temperature if temperature != 1.0 else logits, dim=-1)
        token = torch.full((rows,), pad, dtype=torch.long, device=input_ids.device)
        token[active] = draw(probs, uniform[active])
        token = torch.where(unfinished, token, pad)
        new_tokens.append(token)
        if return_logits:
            full = torch.full((rows, logits.shape[-1]), float("nan"), device=logits.device)
            seen.append(full.index_copy(0, active, logits))
        unfinished = unfinished & ~torch.isin(token, eos)
        left = int(unfinished.sum())
        if t == steps - 1 or left == 0:
            break
        if 2 * left <= len(active):  # half the rows have ended: drop them from the batch
            keep = unfinished[active]
            active = active[keep]
            step.keep_rows(keep)
            bias = bias[keep]
        logits = step(token[active], position[active] + t, width + t, bias)
    result = torch.cat([input_ids, torch.stack(new_tokens, dim=1)], dim=1)
    return (result, torch.stack(seen, dim=1)) if return_logits else result


def fast_sampling(model: Any):
    """Within the block, ``model.generate(input_ids, attention_mask, generation_config=...)`` runs
    :func:`sample` where :func:`fast_sampling_supported`, and otherwise ``generate`` with each
    distinct prompt prefilled once (:func:`mrtpo.shared_prompt.generate_with_shared_prefill`)."""

    def replacement(generate):
        def sampled(input_ids=None, attention_mask=None, generation_config=None, **kwargs):
            if (not kwargs and attention_mask is not None and generation_config is not None
                    and fast_sampling_supported(model, generation_config)):
                try:
                    return sample(model, input_ids, attention_mask, generation_config)
                except Unsupported:
                    pass
            return generate_with_shared_prefill(model, generate, input_ids=input_ids, attention_mask=attention_mask,
                                                generation_config=generation_config, **kwargs)
        return sampled

    return patched_generate(model, replacement)


__all__ = ["MAX_PARAMETERS", "SUPPORTED_MODEL_TYPES", "Unsupported", "draw", "effective_linear", "fast_sampling",
           "fast_sampling_supported", "rotate_half_matrix", "sample"]
