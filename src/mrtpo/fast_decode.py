"""Sampling and greedy decoding without ``transformers.generate``'s per-token overhead, for Qwen2- and
Llama-shaped models.

On a small policy ``generate`` spends most of each token outside arithmetic: attention masks rebuilt
every step, a cache grown by concatenation, logits processors, a slow ``multinomial``. :func:`sample`
keeps the same model and the same distribution, and pays that once per call instead of once per token:

1. each distinct prompt row is prefilled once through the model's own layers and head (a group of
   ``G`` samples pays its prompt once), and its KV cache is copied into preallocated buffers;
2. every new token runs one decode step written here from the model's own modules and weights: its
   embedding, norms' weights, linear layers and rotary frequencies, the frozen base weights folded
   once per model and kept while they do not change; a LoRA adapter's factors are read every call and
   applied as a low-rank product beside the folded weight, accumulated into its output (folding a
   small update into bfloat16 weights would round most of it away); attention reads the buffers up
   to the current column with one additive mask fixed for the whole call;
3. the next token is drawn by inverse CDF from ``softmax(logits / temperature)`` with one uniform
   per row: the distribution ``generate`` samples from, from another random stream (so the tokens
   under a fixed seed differ from ``generate``'s; the distribution is the same); greedy takes the
   argmax, as ``generate`` does.

Only what ``generate`` would do for the settings it accepts (:func:`fast_sampling_supported`): plain
temperature sampling or greedy, no top-k / top-p / min-p / repetition penalty / stop strings, default
or Llama-3 rotary embeddings, no sliding window. Anything else goes to ``generate``. In float32 the
logits equal the model's own forward to float tolerance; in bfloat16 to bfloat16 rounding (the
products run in another order and layout), so a greedy near-tie can go the other way.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from mrtpo.model_calls import returned_cache, underlying_model
from mrtpo.shared_prompt import distinct_rows, generate_with_shared_prefill, patched_generate

#: Model families whose decoder layer this module's decode step reproduces.
SUPPORTED_MODEL_TYPES = ("qwen2", "llama")
#: Largest model decoded here: the frozen base weights are folded once and kept beside the model (a
#: second copy of them), measured up to the 0.5 B preset (docs/results/2026-12-07-generation-speed.md).
MAX_PARAMETERS = 1_000_000_000
_ROPE_TYPES = ("default", "llama3", "linear")


def _neutral(value: Any, neutral: Any) -> bool:
    return value is None or value == neutral


def fast_sampling_supported(model: Any, generation_config: Any) -> bool:
    """Whether :func:`sample` reproduces ``model.generate(generation_config=...)``: its distribution
    (plain temperature sampling) or its greedy choice."""
    inner = underlying_model(model)
    config = getattr(inner, "config", None)
    if config is None or getattr(config, "model_type", None) not in SUPPORTED_MODEL_TYPES:
        return False
    if sum(p.numel() for p in inner.parameters()) > MAX_PARAMETERS:
        return False
    rope = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    body = getattr(inner, "model", None)
    if (
        rope.get("rope_type", "default") not in _ROPE_TYPES
        or getattr(config, "use_sliding_window", False)
        or getattr(config, "hidden_act", None) != "silu"
        or body is None
        or not hasattr(body, "layers")
        or (inner.training and getattr(config, "attention_dropout", 0.0))
    ):
        return False
    g = generation_config
    warpers = (
        not getattr(g, "do_sample", False)  # greedy: generate applies no warper
        or (
            _neutral(getattr(g, "top_k", None), 0)
            and _neutral(getattr(g, "top_p", None), 1.0)
            and getattr(g, "min_p", None) is None
            and (getattr(g, "temperature", None) or 1.0) > 0
        )
    )
    return (
        warpers
        and _neutral(getattr(g, "no_repeat_ngram_size", None), 0)
        and _neutral(getattr(g, "repetition_penalty", None), 1.0)
        and not getattr(g, "suppress_tokens", None)
        and not getattr(g, "bad_words_ids", None)
        and _neutral(getattr(g, "num_beams", None), 1)
        and _neutral(getattr(g, "num_return_sequences", None), 1)
        and not getattr(g, "min_new_tokens", None)
        and not getattr(g, "stop_strings", None)
        and getattr(g, "max_new_tokens", None) is not None
    )


class Unsupported(Exception):
    """The model holds a layer the decode step cannot reproduce exactly."""


def linear_parts(module: torch.nn.Module) -> tuple[Tensor, Tensor | None, list[tuple[Tensor, Tensor]]]:
    """``(weight (out, in), bias (out,) or None, [(A (r, in), B (out, r)), ...])`` with
    ``module(x) = x Wᵀ + b + Σ (x Aᵀ) Bᵀ``: a plain ``nn.Linear`` (no low-rank terms) or a PEFT LoRA
    layer over one, one term per active adapter, its scaling folded into ``B`` (exact when its
    dropout is off). Raises :class:`Unsupported` for anything else."""
    if type(module) is torch.nn.Linear:
        return module.weight, module.bias, []
    base = getattr(module, "base_layer", None)
    if type(base) is not torch.nn.Linear or not hasattr(module, "lora_A"):
        raise Unsupported(f"{type(module).__name__} is neither nn.Linear nor a LoRA layer over one")
    terms = []
    if not getattr(module, "merged", False) and not getattr(module, "disable_adapters", False):
        for name in module.active_adapters:
            if name not in module.lora_A:
                continue
            dropout = module.lora_dropout[name]
            if module.training and isinstance(dropout, torch.nn.Dropout) and dropout.p > 0:
                raise Unsupported("LoRA dropout is active (training mode)")
            if name in getattr(module, "lora_variant", {}) or getattr(module, "use_dora", {}).get(name, False):
                raise Unsupported("LoRA variants (DoRA, ...)")
            a, b = module.lora_A[name], module.lora_B[name]
            if getattr(module, "fan_in_fan_out", False) or type(a) is not torch.nn.Linear or b.bias is not None:
                raise Unsupported("LoRA factors that are not two bias-free linear layers")
            terms.append((a.weight, b.weight * module.scaling[name]))
    return base.weight, base.bias, terms


def _norm_weight(norm: torch.nn.Module) -> tuple[Tensor, float]:
    return norm.weight, float(getattr(norm, "variance_epsilon", None) or getattr(norm, "eps", 1e-6))


def _rms_scaled(x: Tensor, eps: float) -> Tensor:
    """``x / sqrt(mean(x²) + eps)`` over the last dimension (an RMSNorm without its weight, which
    :class:`_DecodeStep` folds into the next projection)."""
    return x * torch.rsqrt(x.square().mean(-1, keepdim=True) + eps)


def rotate_half_permutation(head_dim: int, heads: int) -> tuple[Tensor, Tensor]:
    """``(index, sign)``, both ``(heads·D,)``, with ``x[..., index] * sign`` = rotary's ``rotate_half``
    on each head of ``x`` ``(…, heads·D)``: ``[x1, x2] -> [−x2, x1]``."""
    half = head_dim // 2
    within = torch.cat([torch.arange(half) + half, torch.arange(half)])
    index = (torch.arange(heads)[:, None] * head_dim + within).reshape(-1)
    sign = torch.cat([-torch.ones(half), torch.ones(half)]).repeat(heads)
    return index, sign


class _Product:
    """``x ↦ x Wᵀ (+ bias) + (x Aᵀ) Bᵀ`` for a folded frozen weight ``W`` ``(out, in)`` and optional
    low-rank factors (the LoRA adapters, re-read every call: they train). ``W`` is kept ``(out, in)``
    with a transposed view for bfloat16 and half precision (oneDNN's fast layout there) and
    transposed contiguous for float32. The factors are cast to ``W``'s dtype once per call and the
    low-rank term is accumulated into the product's output by ``addmm`` (float32 accumulation, one
    rounding of the sum): its error is relative to the adapter's own small term, not to ``W``, so a
    small update is kept (adding it into a bfloat16 ``W`` would round most of it away)."""

    def __init__(self, weight: Tensor, bias: Tensor | None = None):
        self.weight_t = weight.t() if weight.dtype in (torch.bfloat16, torch.float16) else weight.t().contiguous()
        self.bias = bias
        self.a_t: Tensor | None = None
        self.b_t: Tensor | None = None

    def with_low_rank(self, a: Tensor | None, b: Tensor | None) -> _Product:
        """A copy sharing ``W`` with factors ``a`` ``(R, in)`` and ``b`` ``(out, R)`` (or none)."""
        out = _Product.__new__(_Product)
        out.weight_t, out.bias = self.weight_t, self.bias
        dtype = self.weight_t.dtype
        out.a_t, out.b_t = (None, None) if a is None else (a.t().to(dtype).contiguous(), b.t().to(dtype).contiguous())
        return out

    def __call__(self, x: Tensor, add_to: Tensor | None = None) -> Tensor:
        if add_to is not None:
            y = torch.addmm(add_to, x, self.weight_t)
        elif self.bias is not None:
            y = torch.addmm(self.bias, x, self.weight_t)
        else:
            y = x @ self.weight_t
        if self.a_t is not None:
            y = torch.addmm(y, x @ self.a_t, self.b_t)
        return y


def _fold_in(q: Tensor, k: Tensor, v: Tensor, scale: float) -> Tensor:
    """Rows of the fused input projection ``[s·q; k; v]`` from the query, key and value rows (weights
    ``(out, in)`` or LoRA ``B`` factors ``(out, r)``)."""
    return torch.cat([q * scale, k, v])


def _low_rank(modules: list[torch.nn.Module], norm: Tensor | None, fuse: Any = None):
    """The LoRA terms of projections that read the same input, stacked into one ``(A (R, in),
    B (rows, R))`` with ``x Aᵀ Bᵀ`` = their low-rank outputs in the fused rows: the norm weight
    before them folded into ``A``; ``B`` placed in the projections' stacked output rows, then through
    ``fuse`` (the same row map as the base weights'; none: the stacked rows). ``(None, None)`` if
    no projection has an adapter."""
    parts = [linear_parts(m)[2] for m in modules]
    sizes = [linear_parts(m)[0].shape[0] for m in modules]
    a_parts, b_parts = [], []
    for j, terms in enumerate(parts):
        for a, b in terms:
            a_parts.append(a if norm is None else a * norm.to(a.dtype))
            placed = b.new_zeros(sum(sizes), b.shape[1])
            placed[sum(sizes[:j]) : sum(sizes[: j + 1])] = b
            b_parts.append(placed)
    if not a_parts:
        return None, None
    stacked = torch.cat(b_parts, dim=1)
    return torch.cat(a_parts), (stacked if fuse is None else fuse(stacked))


_FROZEN_CACHE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _frozen_key(inner: Any, dtype: torch.dtype) -> tuple | None:
    """What the folded base weights depend on (each parameter's storage and version), or ``None``
    when some base weight trains (full fine-tuning: folding is redone every call, nothing kept)."""
    key = [dtype]
    for name, p in inner.named_parameters():
        if "lora_" in name:
            continue
        if p.requires_grad:
            return None
        key.append((name, p.data_ptr(), p._version))
    return tuple(key)


class _DecodeStep:
    """One token through a Qwen2 / Llama model for ``B`` rows, reading and writing preallocated KV
    buffers. Built once per :func:`sample` call; the frozen base weights are folded once per model
    and kept (while no base weight changes), so a layer is 4 matrix products and a few element-wise
    ops, plus a low-rank product per projection group for LoRA adapters:

    - each RMSNorm's weight is folded into the projection after it (``W · diag(w)``, also into ``A``);
    - the query, key and value projections are one matrix, the attention scale ``1/√D`` folded into
      the query rows; rotary's ``rotate_half`` is a fixed permutation of the query and key columns,
      its signs folded into the sine table;
    - attention is two batched products over the buffers up to the current column, the query heads
      grouped by the key/value head they read, the keys kept transposed ``(B, KVH, D, columns)``; the
      scores and their softmax in float32 (masked by a float32 bias), the products in the weights'
      dtype, as the model's eager attention does. On a CPU without AMX ``scaled_dot_product_attention``
      on one bfloat16 query is 4–9× slower, and float32 buffers double the bytes read
      (docs/results/2026-12-07-generation-speed-epyc.md);
    - the output and down projections add into the residual stream (``addmm``).
    """

    def __init__(self, inner: Any, rows: int, columns: int, dtype: torch.dtype, device: torch.device):
        body, config = inner.model, inner.config
        self.embed = body.embed_tokens.weight
        first = body.layers[0].self_attn
        d = first.head_dim
        self.head_dim, self.kv_heads = d, config.num_key_value_heads
        self.heads = config.num_attention_heads
        self.groups = self.heads // self.kv_heads
        self.q_width, self.k_width = config.num_attention_heads * d, self.kv_heads * d
        self.layers = []
        with torch.no_grad():
            base = self._folded_base(inner, float(first.scaling), dtype, device)
            q_rows, qk_rows = self.q_width, self.q_width + self.k_width

            def fuse_in(m: Tensor) -> Tensor:  # stacked [q; k; v] rows -> the fused input projection's rows
                return _fold_in(m[:q_rows], m[q_rows:qk_rows], m[qk_rows:], float(first.scaling))

            for layer, (eps_in, w_in, wo, eps_post, w_gate_up, wd) in zip(body.layers, base[0]):
                attn, mlp = layer.self_attn, layer.mlp
                self.layers.append(
                    (
                        eps_in,
                        w_in.with_low_rank(
                            *_low_rank([attn.q_proj, attn.k_proj, attn.v_proj], layer.input_layernorm.weight, fuse_in)
                        ),
                        wo.with_low_rank(*_low_rank([attn.o_proj], None)),
                        eps_post,
                        w_gate_up.with_low_rank(
                            *_low_rank([mlp.gate_proj, mlp.up_proj], layer.post_attention_layernorm.weight)
                        ),
                        wd.with_low_rank(*_low_rank([mlp.down_proj], None)),
                    )
                )
            head, self.eps_final = base[1], base[2]
            self.head = head.with_low_rank(*_low_rank([inner.lm_head], body.norm.weight))
        self.keys = [torch.zeros(rows, self.kv_heads, d, columns, dtype=dtype, device=device) for _ in body.layers]
        self.values = [torch.zeros(rows, self.kv_heads, columns, d, dtype=dtype, device=device) for _ in body.layers]
        rotary = body.rotary_emb
        positions = torch.arange(columns, device=device, dtype=torch.float32)
        freqs = positions[:, None] * rotary.inv_freq.to(device=device, dtype=torch.float32)[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        heads = config.num_attention_heads + self.kv_heads  # one (cos, sin) row covers queries and keys
        index, sign = rotate_half_permutation(d, heads)
        self.rotate_index = index.to(device)
        self.cos = (emb.cos() * rotary.attention_scaling).repeat(1, heads).to(dtype)  # (columns, (H + KVH)·D)
        self.sin = (emb.sin() * rotary.attention_scaling).repeat(1, heads).mul(sign.to(device)).to(dtype)

    @staticmethod
    def _folded_base(inner: Any, scale: float, dtype: torch.dtype, device: torch.device):
        """Per layer ``(eps_in, fused input projection, output projection, eps_post, fused gate/up,
        down)`` as :class:`_Product` over the base weights (no adapters), the head and the final
        norm's eps; folded in float32, then cast once to ``dtype``. Kept per model while the base
        weights are frozen and unchanged."""
        key = _frozen_key(inner, dtype)
        cached = _FROZEN_CACHE.get(inner)
        if key is not None and cached is not None and cached[0] == key:
            return cached[1]
        body = inner.model
        layers = []
        for layer in body.layers:
            attn, mlp = layer.self_attn, layer.mlp
            (wq, bq, _), (wk, bk, _), (wv, bv, _) = (linear_parts(m) for m in (attn.q_proj, attn.k_proj, attn.v_proj))
            norm_in, eps_in = _norm_weight(layer.input_layernorm)
            norm_in = norm_in.float()

            def bias_of(b, w):
                return b.float() if b is not None else torch.zeros(w.shape[0], device=device)

            w_in = _fold_in(wq.float(), wk.float(), wv.float(), scale) * norm_in
            b_in = _fold_in(bias_of(bq, wq), bias_of(bk, wk), bias_of(bv, wv), scale)
            wo, bo, _ = linear_parts(attn.o_proj)
            norm_post, eps_post = _norm_weight(layer.post_attention_layernorm)
            (wg, bg, _), (wu, bu, _), (wd, bd, _) = (
                linear_parts(m) for m in (mlp.gate_proj, mlp.up_proj, mlp.down_proj)
            )
            if any(b is not None for b in (bo, bg, bu, bd)):
                raise Unsupported("biases on the output or MLP projections")
            w_gate_up = torch.cat([wg.float(), wu.float()]) * norm_post.float()
            layers.append(
                (
                    eps_in,
                    _Product(w_in.to(dtype), b_in.to(dtype)),
                    _Product(wo.to(dtype)),
                    eps_post,
                    _Product(w_gate_up.to(dtype)),
                    _Product(wd.to(dtype)),
                )
            )
        head_weight, head_bias, _ = linear_parts(inner.lm_head)
        norm_final, eps_final = _norm_weight(body.norm)
        head = _Product((head_weight.float() * norm_final.float()).to(dtype), head_bias)
        folded = (layers, head, eps_final)
        if key is not None:
            _FROZEN_CACHE[inner] = (key, folded)
        return folded

    def load_prompt_cache(self, cache: Any, inverse: Tensor, width: int) -> None:
        """Copy a prefill's per-layer keys/values ``(U, KVH, width, D)`` into the buffers' first
        ``width`` columns, row ``b`` from distinct row ``inverse[b]``."""
        for i, layer in enumerate(cache.layers):
            self.keys[i][..., :width] = layer.keys.index_select(0, inverse).transpose(-1, -2)
            self.values[i][:, :, :width] = layer.values.index_select(0, inverse)

    def keep_rows(self, keep: Tensor) -> None:
        """Keep only the rows ``keep`` ``(B,)`` bool of the key/value buffers (rows that have ended)."""
        self.keys = [k[keep] for k in self.keys]
        self.values = [v[keep] for v in self.values]

    def __call__(self, tokens: Tensor, positions: Tensor, column: int, bias: Tensor) -> Tensor:
        """Float32 logits ``(B, V)`` of the next token after ``tokens`` ``(B,)`` at ``positions``
        ``(B,)``, written to buffer column ``column``; ``bias`` ``(B, 1, 1, columns)`` float32 is 0 where a
        key is attended and −inf at padding."""
        b, qk, d = tokens.shape[0], self.q_width + self.k_width, self.head_dim
        h = self.embed[tokens]  # (B, H)
        cos, sin = self.cos[positions], self.sin[positions]  # (B, (H + KVH)·D)
        span = column + 1
        mask = bias[..., :span]
        for i, (eps_in, w_in, wo, eps_post, w_gate_up, wd) in enumerate(self.layers):
            projected = w_in(_rms_scaled(h, eps_in))  # (B, QK + V)
            unrotated = projected[:, :qk]
            rotated = torch.addcmul(unrotated * cos, unrotated.index_select(1, self.rotate_index), sin)
            q = rotated[:, : self.q_width].view(b, self.kv_heads, self.groups, d)  # heads by their KV head
            self.keys[i][..., column] = rotated[:, self.q_width :].view(b, self.kv_heads, d)
            self.values[i][:, :, column] = projected[:, qk : qk + self.k_width].view(b, self.kv_heads, d)
            scores = torch.matmul(q, self.keys[i][..., :span]) + mask  # (B, KVH, G, span), float32
            weights = torch.softmax(scores, dim=-1).to(h.dtype)
            attended = torch.matmul(weights, self.values[i][:, :, :span])  # (B, KVH, G, D)
            h = wo(attended.reshape(b, -1), add_to=h)
            gate, up = w_gate_up(_rms_scaled(h, eps_post)).chunk(2, dim=-1)
            h = wd(F.silu(gate) * up, add_to=h)
        return self.head(_rms_scaled(h, self.eps_final)).float()


def draw(probs: Tensor, uniform: Tensor) -> Tensor:
    """Inverse-CDF draw: for each row of ``probs`` ``(B, V)`` the first index whose cumulative
    probability exceeds ``uniform`` ``(B,)`` in [0, 1) times the row's total. ``(B,)`` long."""
    cdf = probs.cumsum(-1)
    picked = torch.searchsorted(cdf, (uniform * cdf[:, -1]).unsqueeze(1), right=True).squeeze(1)
    return picked.clamp_max(probs.shape[1] - 1)


@torch.no_grad()
def sample(
    model: Any, input_ids: Tensor, attention_mask: Tensor, generation_config: Any, return_logits: bool = False
) -> Tensor | tuple[Tensor, Tensor]:
    """What ``model.generate(input_ids, attention_mask, generation_config=...)`` returns under
    sampling or greedy decoding (``do_sample`` false: each row's argmax): ``(B, P + T)`` ids, the
    prompt then up to ``max_new_tokens`` new tokens, rows that
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
    greedy = not g.do_sample
    rows, width = input_ids.shape
    steps = int(g.max_new_tokens)
    mask = attention_mask.bool()

    step = _DecodeStep(inner, rows, width + steps, next(inner.parameters()).dtype, input_ids.device)
    ids, distinct_mask, inverse = distinct_rows(input_ids, attention_mask)
    positions = (distinct_mask.long().cumsum(-1) - 1).clamp_min(0)
    # the body, then the head on 2-D hidden states: what the model's own forward computes, without the
    # batched product its head runs on a sliced 3-D input (a copy of the head's weight per prompt)
    out = inner.model(input_ids=ids, attention_mask=distinct_mask, position_ids=positions, use_cache=True)
    logits = inner.lm_head(out.last_hidden_state[:, -1]).float().index_select(0, inverse)  # (B, V)
    step.load_prompt_cache(returned_cache(out), inverse, width)
    del out
    bias = torch.zeros(rows, 1, 1, width + steps, device=input_ids.device)
    bias[:, 0, 0, :width] = torch.where(mask, 0.0, float("-inf"))
    position = mask.long().sum(-1)  # the first new token's position: the prompt's real length
    unfinished = torch.ones(rows, dtype=torch.bool, device=input_ids.device)
    active = torch.arange(rows, device=input_ids.device)  # the rows the decode step still runs
    new_tokens, seen = [], []
    for t in range(steps):
        token = torch.full((rows,), pad, dtype=torch.long, device=input_ids.device)
        if greedy:
            token[active] = logits.argmax(-1)
        else:
            uniform = torch.rand(rows, device=input_ids.device)  # every row's draw: the stream ignores compaction
            probs = torch.softmax(logits / temperature if temperature != 1.0 else logits, dim=-1)
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
            if (
                not kwargs
                and attention_mask is not None
                and generation_config is not None
                and fast_sampling_supported(model, generation_config)
            ):
                try:
                    return sample(model, input_ids, attention_mask, generation_config)
                except Unsupported:
                    pass
            return generate_with_shared_prefill(
                model,
                generate,
                input_ids=input_ids,
                attention_mask=attention_mask,
                generation_config=generation_config,
                **kwargs,
            )

        return sampled

    return patched_generate(model, replacement)


__all__ = [
    "MAX_PARAMETERS",
    "SUPPORTED_MODEL_TYPES",
    "Unsupported",
    "draw",
    "fast_sampling",
    "fast_sampling_supported",
    "linear_parts",
    "rotate_half_permutation",
    "sample",
]
