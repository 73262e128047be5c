"""mrtpo.fast_decode: the decode loop reproduces the model's own forward, token by token, and draws
from the distribution ``generate`` samples from."""

from __future__ import annotations

import pytest
import torch
from transformers import GenerationConfig

from mrtpo.fast_decode import draw, fast_sampling_supported, rotate_half_permutation, sample
from mrtpo.model_calls import underlying_model
from mrtpo.testing import tiny_policy


def _config(**kw):
    base = dict(
        do_sample=True, max_new_tokens=12, temperature=1.0, top_k=0, top_p=1.0, eos_token_id=[2], pad_token_id=0
    )
    return GenerationConfig(**{**base, **kw})


def _left_padded_prompts(tok, texts, repeats):
    enc = tok(
        [t for t in texts for _ in range(repeats)],
        return_tensors="pt",
        padding=True,
        padding_side="left",
        add_special_tokens=False,
    )
    return enc["input_ids"], enc["attention_mask"]


def _reference_logits(model, ids, prompt_mask, new):
    """Logits ``(B, T, V)`` of the model's own full forward over ``[prompt, new tokens]``, at the
    positions that predicted each new token (positions counted from the first real prompt token)."""
    width = prompt_mask.shape[1]
    mask = torch.cat([prompt_mask, torch.ones_like(new)], dim=1)
    positions = (mask.cumsum(-1) - 1).clamp_min(0)
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask, position_ids=positions).logits.float()
    return logits[:, width - 1 : width - 1 + new.shape[1]]


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_each_step_logits_equal_the_models_full_forward(temperature):
    model, tok = tiny_policy(seed=3, num_layers=2)
    ids, mask = _left_padded_prompts(tok, ["hello there", "a much longer prompt than the first"], repeats=3)
    torch.manual_seed(0)
    out, seen = sample(model, ids, mask, _config(temperature=temperature, eos_token_id=[]), return_logits=True)
    new = out[:, ids.shape[1] :]
    assert new.shape == (6, 12)  # no EOS: every step runs
    reference = _reference_logits(model, out, mask, new)
    torch.testing.assert_close(seen, reference, atol=2e-5, rtol=1e-4)


def test_lora_adapter_applies_in_the_decode_step():
    from peft import LoraConfig, get_peft_model

    model, tok = tiny_policy(seed=4)
    peft_model = get_peft_model(
        model, LoraConfig(r=4, target_modules=["q_proj", "v_proj", "down_proj"], init_lora_weights=False)
    )
    peft_model.eval()
    ids, mask = _left_padded_prompts(tok, ["adapter test"], repeats=2)
    torch.manual_seed(1)
    out, seen = sample(peft_model, ids, mask, _config(max_new_tokens=6, eos_token_id=[]), return_logits=True)
    reference = _reference_logits(peft_model, out, mask, out[:, ids.shape[1] :])
    torch.testing.assert_close(seen, reference, atol=2e-5, rtol=1e-4)
    with peft_model.disable_adapter():
        base_logits = _reference_logits(peft_model, out, mask, out[:, ids.shape[1] :])
    assert (seen - base_logits).abs().max() > 1e-3  # the adapter changed the logits the tokens came from


def test_rows_end_at_eos_and_are_padded_like_generate():
    model, tok = tiny_policy(seed=5)
    ids, mask = _left_padded_prompts(tok, ["stop early", "and another prompt"], repeats=4)
    torch.manual_seed(2)
    free = sample(model, ids, mask, _config(max_new_tokens=20, eos_token_id=[]))[:, ids.shape[1] :]
    eos = int(free[0, 3])  # a token row 0 drew at step 3: with it as EOS, row 0 ends there
    torch.manual_seed(2)  # same random stream: every row draws the same tokens until it ends
    new = sample(model, ids, mask, _config(max_new_tokens=20, eos_token_id=[eos], pad_token_id=0))[:, ids.shape[1] :]
    ends = []
    for row, reference in zip(new.tolist(), free.tolist()):
        end = reference.index(eos) if eos in reference else len(reference)
        ends.append(end)
        assert row[: end + 1] == reference[: end + 1][: len(row)]
        assert all(t == 0 for t in row[end + 1 :])  # padded after its EOS
    assert ends[0] <= 3
    assert new.shape[1] == min(20, max(ends) + 1)  # stops at the step the last row ended


def test_rotate_half_permutation_is_rotary_rotate_half_per_head():
    from transformers.models.llama.modeling_llama import rotate_half

    x = torch.randn(5, 3 * 8)
    index, sign = rotate_half_permutation(head_dim=8, heads=3)
    expected = rotate_half(x.view(5, 3, 8)).reshape(5, 24)  # [x1, x2] -> [-x2, x1] within each head
    assert torch.equal(x[:, index] * sign, expected)


def _tiny_llama(seed: int):
    """A random Llama causal LM (smollm2-135m's family: no projection biases, 3 query heads per
    key/value head, tied embeddings) over the byte-level tokenizer."""
    from transformers import LlamaConfig, LlamaForCausalLM

    _, tok = tiny_policy()
    config = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=48,
        intermediate_size=96,
        num_hidden_layers=3,
        num_attention_heads=6,
        num_key_value_heads=2,
        head_dim=8,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        initializer_range=0.2,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    return model.eval(), tok


def test_llama_logits_and_greedy_tokens_equal_the_models():
    """A Llama model (no biases, grouped heads of 3): every step's logits equal its own forward's and
    greedy picks ``generate``'s tokens (float32)."""
    model, tok = _tiny_llama(seed=11)
    assert fast_sampling_supported(model, _config())
    ids, mask = _left_padded_prompts(tok, ["llama", "a longer llama prompt"], repeats=3)
    torch.manual_seed(0)
    out, seen = sample(model, ids, mask, _config(eos_token_id=[]), return_logits=True)
    reference = _reference_logits(model, out, mask, out[:, ids.shape[1] :])
    torch.testing.assert_close(seen, reference, atol=2e-5, rtol=1e-4)
    config = _config(do_sample=False, max_new_tokens=14, eos_token_id=[])
    with torch.no_grad():
        theirs = model.generate(input_ids=ids, attention_mask=mask, generation_config=config)
    assert sample(model, ids, mask, config).tolist() == theirs.tolist()


def test_draw_is_the_inverse_cdf():
    probs = torch.tensor([[0.1, 0.2, 0.3, 0.4], [0.0, 0.5, 0.0, 0.5]])
    # cumulative: [0.1, 0.3, 0.6, 1.0] and [0, 0.5, 0.5, 1.0]
    assert draw(probs, torch.tensor([0.05, 0.0])).tolist() == [0, 1]
    assert draw(probs, torch.tensor([0.35, 0.49])).tolist() == [2, 1]
    assert draw(probs, torch.tensor([0.99, 0.5])).tolist() == [3, 3]
    unnormalised = probs * 3  # the row total scales the uniform
    assert draw(unnormalised, torch.tensor([0.35, 0.49])).tolist() == [2, 1]


def test_draw_frequencies_match_the_probabilities():
    probs = torch.tensor([0.05, 0.15, 0.5, 0.3]).expand(200_000, 4)
    gen = torch.Generator().manual_seed(0)
    counts = torch.bincount(draw(probs, torch.rand(200_000, generator=gen)), minlength=4).double() / 200_000
    torch.testing.assert_close(counts, probs[0].double(), atol=4e-3, rtol=0)


def test_supported_only_for_plain_temperature_sampling():
    model, _ = tiny_policy()
    assert fast_sampling_supported(model, _config())
    assert fast_sampling_supported(model, _config(temperature=0.5))
    assert not fast_sampling_supported(model, _config(top_k=50))
    assert not fast_sampling_supported(model, _config(top_p=0.9))
    assert not fast_sampling_supported(model, _config(repetition_penalty=1.1))
    assert fast_sampling_supported(model, _config(do_sample=False))  # greedy: generate's argmax
    assert fast_sampling_supported(model, _config(do_sample=False, top_k=50))  # no warper under greedy
    assert not fast_sampling_supported(model, _config(do_sample=False, num_beams=2))
    assert not fast_sampling_supported(model, _config(do_sample=False, no_repeat_ngram_size=3))
    model.train()
    assert fast_sampling_supported(model, _config())  # no dropout in this model: train mode changes nothing
    model.config.attention_dropout = 0.1
    assert not fast_sampling_supported(model, _config())  # the decode step has no attention dropout


def test_larger_models_keep_generate(monkeypatch):
    import mrtpo.fast_decode as fast_decode

    model, _ = tiny_policy()
    size = sum(p.numel() for p in model.parameters())
    monkeypatch.setattr(fast_decode, "MAX_PARAMETERS", size)
    assert fast_sampling_supported(model, _config())
    monkeypatch.setattr(fast_decode, "MAX_PARAMETERS", size - 1)
    assert not fast_sampling_supported(model, _config())


def test_trainer_samples_through_the_decode_loop(tmp_path):
    """A trainer step with ``fast_generation`` (the default) makes one model forward for sampling,
    the prefill of the 2 distinct prompts of its 6-row batch, and no per-token forward; with it off,
    ``generate`` runs one forward per new token."""
    from test_trainer import char_code, has_letter_e, make_trainer

    def sampling_forwards(**settings):
        trainer = make_trainer(
            tmp_path,
            [has_letter_e, char_code],
            max_steps=1,
            num_generations=3,
            per_device_train_batch_size=6,
            method="gdpo",
            shared_prompt_update=False,
            **settings,
        )
        shapes, generating = [], []
        inner = trainer._generate_single_turn

        def recording(*args, **kwargs):
            generating.append(True)
            try:
                return inner(*args, **kwargs)
            finally:
                generating.clear()

        trainer._generate_single_turn = recording

        def record(module, args, kwargs):
            if generating:
                shapes.append(tuple(kwargs["input_ids"].shape))

        body = underlying_model(trainer.model).model  # the layers under the head: every forward runs them
        body.register_forward_pre_hook(record, with_kwargs=True)
        trainer.train()
        assert "generate" not in vars(trainer.model)  # the instance is left as it was
        return shapes

    fast = sampling_forwards()
    assert len(fast) == 1 and fast[0][0] == 2
    slow = sampling_forwards(fast_generation=False)
    assert slow[0][0] == 2 and len(slow) > 2 and all(shape == (6, 1) for shape in slow[1:])


def test_trainer_tokenizes_each_distinct_prompt_once_with_trls_ids(tmp_path):
    """A generation batch of 2 prompts x 3 rows: TRL's chat template renders 2 conversations, and the
    rows get exactly the ids TRL's own call over all 6 rows gives."""
    from trl import GRPOTrainer

    from test_trainer import char_code, has_letter_e, make_trainer

    trainer = make_trainer(
        tmp_path,
        [has_letter_e, char_code],
        max_steps=1,
        num_generations=3,
        per_device_train_batch_size=6,
        method="gdpo",
    )
    prompts = [row["prompt"] for row in trainer.train_dataset.select(range(2)) for _ in range(3)]
    rendered = []
    template = trainer.processing_class.apply_chat_template

    def counting(conversation, **kw):
        rendered.append(len(conversation))
        return template(conversation=conversation, **kw)

    trainer.processing_class.apply_chat_template = counting
    ids, images, fields = trainer._tokenize_prompts(prompts)
    trainer.processing_class.apply_chat_template = template
    reference, *_ = GRPOTrainer._tokenize_prompts(trainer, prompts)
    assert rendered == [2] and ids == reference and images is None and fields == {}
    assert ids[0] == ids[2] and ids[3] == ids[5] and ids[0] != ids[3]


def test_rows_that_end_leave_the_batch_and_the_rest_decode_as_before():
    """With an EOS that ends most rows early, the decode step drops them (half the batch ended) and
    the rows still running draw from the model's own logits, step for step."""
    model, tok = tiny_policy(seed=6)
    ids, mask = _left_padded_prompts(tok, ["one prompt", "another prompt here", "x"], repeats=4)
    torch.manual_seed(3)
    free = sample(model, ids, mask, _config(max_new_tokens=16, eos_token_id=[]))[:, ids.shape[1] :]
    counts = torch.bincount(free[:, :6].reshape(-1))
    eos = int(counts.argmax())  # the token most rows draw early
    torch.manual_seed(3)
    out, seen = sample(model, ids, mask, _config(max_new_tokens=16, eos_token_id=[eos]), return_logits=True)
    new = out[:, ids.shape[1] :]
    ended = [(row.index(eos) if eos in row else None) for row in new.tolist()]
    assert sum(e is not None and e < new.shape[1] - 2 for e in ended) >= 6  # half the rows end early
    assert torch.isnan(seen).any()  # some rows left the batch before the loop ended
    reference = _reference_logits(model, out, mask, new)
    for j, end in enumerate(ended):
        last = new.shape[1] if end is None else end + 1
        torch.testing.assert_close(seen[j, :last], reference[j, :last], atol=2e-5, rtol=1e-4)
        assert new[j, :last].tolist() == free[j, :last].tolist()


@pytest.mark.parametrize("peft", [False, True])
def test_greedy_gives_generates_tokens(peft):
    """Greedy (``do_sample`` false) through the decode step: the very tokens ``generate`` picks, rows
    ending at their EOS and padded as ``generate`` pads them (float32)."""
    model, tok = tiny_policy(seed=7, num_layers=2)
    if peft:
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(
            model,
            LoraConfig(
                r=4,
                target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
                init_lora_weights=False,
            ),
        )
        model.eval()
    ids, mask = _left_padded_prompts(tok, ["greedy one", "a second and longer greedy prompt", "z"], repeats=2)
    free = sample(model, ids, mask, _config(do_sample=False, max_new_tokens=14, eos_token_id=[]))
    eos = int(free[0, ids.shape[1] + 4])  # row 0's fifth token as EOS: row 0 (at least) ends early
    for config in (
        _config(do_sample=False, max_new_tokens=14, eos_token_id=[]),
        _config(do_sample=False, max_new_tokens=14, eos_token_id=[eos], pad_token_id=0),
    ):
        ours = sample(model, ids, mask, config)
        with torch.no_grad():
            theirs = model.generate(input_ids=ids, attention_mask=mask, generation_config=config)
        assert ours.tolist() == theirs.tolist()


def test_bfloat16_follows_the_models_forward_with_a_small_adapter():
    """In bfloat16 (float32 LoRA factors, as PEFT keeps them) the decode step's logits equal the model's
    own forward to bfloat16 rounding (about one unit in the last place of a logit of size 1-2), and
    move with the adapter as the forward's do: the distribution is the same, bit-equality is not."""
    from peft import LoraConfig, get_peft_model

    model, tok = tiny_policy(seed=4, dtype=torch.bfloat16)
    peft_model = get_peft_model(
        model,
        LoraConfig(
            r=4,
            target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
            init_lora_weights=False,
        ),
    )
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:
                p.mul_(0.1)  # an adapter that moves the logits by ~0.2
    peft_model.eval()
    ids, mask = _left_padded_prompts(tok, ["adapter test", "another longer prompt here"], repeats=2)
    torch.manual_seed(0)
    out, seen = sample(peft_model, ids, mask, _config(max_new_tokens=10, eos_token_id=[]), return_logits=True)
    new = out[:, ids.shape[1] :]
    reference = _reference_logits(peft_model, out, mask, new)
    with peft_model.disable_adapter():
        base = _reference_logits(peft_model, out, mask, new)
    effect = (reference - base).abs().mean()
    assert effect > 0.1  # the adapter moves the logits well beyond bfloat16 rounding
    assert (seen - reference).abs().mean() < min(0.02, 0.15 * effect)
    moved = torch.corrcoef(torch.stack([(seen - base).flatten(), (reference - base).flatten()]))[0, 1]
    assert moved > 0.98
    probs, ref_probs = torch.softmax(seen, -1), torch.softmax(reference, -1)
    assert (probs - ref_probs).abs().sum(-1).max() < 0.05  # total variation per step, bf16 rounding only


def test_folded_weights_are_kept_and_refolded_when_a_base_weight_changes():
    """The folded base weights are computed once per model and reused while the weights are
    unchanged; an in-place change of a base weight (its version moves) refolds them."""
    import mrtpo.fast_decode as fast_decode

    model, tok = tiny_policy(seed=8)
    for p in model.parameters():
        p.requires_grad_(False)  # frozen base, as under LoRA
    ids, mask = _left_padded_prompts(tok, ["kept"], repeats=2)
    torch.manual_seed(0)
    first = sample(model, ids, mask, _config(do_sample=False, eos_token_id=[]))
    kept = fast_decode._FROZEN_CACHE[model][1]
    sample(model, ids, mask, _config(do_sample=False, eos_token_id=[]))
    assert fast_decode._FROZEN_CACHE[model][1] is kept
    with torch.no_grad():
        model.model.layers[0].mlp.down_proj.weight.mul_(-3.0)
    changed, seen = sample(model, ids, mask, _config(do_sample=False, eos_token_id=[]), return_logits=True)
    assert fast_decode._FROZEN_CACHE[model][1] is not kept
    reference = _reference_logits(model, changed, mask, changed[:, ids.shape[1] :])
    torch.testing.assert_close(seen, reference, atol=2e-5, rtol=1e-4)
    assert changed.tolist() != first.tolist()
