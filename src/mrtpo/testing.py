"""Test helpers: a tiny, randomly initialised causal LM with a real local tokenizer.

``tiny_policy()`` builds, in well under a second and without any download, a Qwen2-architecture
model (2 layers, hidden 32 by default) and a byte-level tokenizer (every UTF-8 string encodes
and decodes losslessly) with ChatML special tokens and a chat template for system / user /
assistant messages (and optional ``tools=``). Tests of the replay, trainer and tasks run the
whole pipeline on it. Same seed, same weights.
"""

from __future__ import annotations

import torch

__all__ = ["CHAT_TEMPLATE", "SPECIAL_TOKENS", "tiny_policy", "tiny_tokenizer"]

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

# ChatML, like Qwen's: "<|im_start|>{role}\n{content}<|im_end|>\n"; tools (if given) go into a
# system block as one JSON object per line, the way Qwen's template lists them.
CHAT_TEMPLATE = (
    "{%- if tools %}"
    "{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0]['role'] == 'system' %}{{- messages[0]['content'] + '\\n\\n' }}{%- endif %}"
    "{{- '# Tools\\n<tools>' }}"
    "{%- for tool in tools %}{{- '\\n' + (tool | tojson) }}{%- endfor %}"
    "{{- '\\n</tools><|im_end|>\\n' }}"
    "{%- elif messages[0]['role'] == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if not (loop.first and message['role'] == 'system') %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def _byte_symbols() -> list[str]:
    """The printable stand-in of each byte value 0..255 used by byte-level BPE (GPT-2 scheme).

    Printable Latin-1 bytes stand for themselves; the others map to chr(256 + k) in byte order.
    """
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    extra = iter(range(256, 512))
    return [chr(b) if b in keep else chr(next(extra)) for b in range(256)]


def tiny_tokenizer(vocab_size: int | None = None):
    """Byte-level tokenizer: ids 0..255 are the bytes, then the ChatML specials, then fillers.

    ``vocab_size`` (default: exactly the bytes + specials) pads the vocabulary with
    ``<|extra_i|>`` special tokens so every id the model can emit decodes.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    symbols = _byte_symbols()
    if set(symbols) != set(pre_tokenizers.ByteLevel.alphabet()):  # pragma: no cover
        raise RuntimeError("byte-level alphabet of this tokenizers version is not the GPT-2 one")
    vocab = {sym: b for b, sym in enumerate(symbols)}  # token id == byte value
    specials = list(SPECIAL_TOKENS)
    base = len(vocab) + len(specials)
    if vocab_size is not None:
        if vocab_size < base:
            raise ValueError(f"vocab_size must be >= {base} (256 bytes + {len(specials)} specials)")
        specials += [f"<|extra_{i}|>" for i in range(vocab_size - base)]
    for tok in specials:
        vocab[tok] = len(vocab)

    core = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    core.decoder = decoders.ByteLevel()
    core.add_special_tokens(specials)

    tok = PreTrainedTokenizerFast(
        tokenizer_object=core,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        bos_token=None,
        unk_token=None,
        additional_special_tokens=["<|im_start|>"],
    )
    tok.chat_template = CHAT_TEMPLATE
    return tok


def tiny_policy(
    seed: int = 0,
    vocab_size: int | None = None,
    hidden_size: int = 32,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    intermediate_size: int = 64,
    max_position_embeddings: int = 2048,
    dtype: torch.dtype = torch.float32,
):
    """Return ``(model, tokenizer)``: a random Qwen2 causal LM over the byte-level tokenizer.

    Deterministic in ``seed`` (the global torch RNG is left untouched). Model vocabulary size
    equals ``len(tokenizer)``. Returned in eval mode, like ``mrtpo.models.load_policy``.
    """
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    tok = tiny_tokenizer(vocab_size)
    config = Qwen2Config(
        vocab_size=len(tok),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        initializer_range=0.2,  # larger than usual so random logits are not nearly uniform
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config)
    model.to(dtype)
    model.generation_config = GenerationConfig(eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    model.eval()
    return model, tok
