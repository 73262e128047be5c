"""The update's forward with each distinct prompt run once equals TRL's forward of every row whole:
log-probabilities, entropies, the loss of every token-level loss type and its gradient, with full
fine-tuning and with LoRA."""

import pytest
import torch
from trl.trainer.utils import add_fused_lm_head

from mrtpo.model_calls import underlying_model
from mrtpo.shared_prompt import can_share_prompts, distinct_rows, shared_prompt_logps
from mrtpo.testing import tiny_policy
from mrtpo.trainer import SEQUENCE_ADVANTAGES_KEY
from test_trainer import char_code, has_letter_e, make_trainer

G = 3


def left_padded_batch(
    seed=0, prompt_lengths=(9, 5, 12), completion_lengths=(4, 7, 1, 6, 6, 2, 3, 7, 5), pad=0, vocab=200
):
    """``(prompt_ids, prompt_mask, completion_ids, completion_mask)`` for groups of ``G`` rows sharing a
    random prompt of each length (left-padded to the longest), with right-padded random completions."""
    gen = torch.Generator().manual_seed(seed)
    width, t = max(prompt_lengths), max(completion_lengths)
    prompt_ids, prompt_mask = [], []
    for length in prompt_lengths:
        ids = torch.randint(1, vocab, (length,), generator=gen).tolist()
        prompt_ids += [[pad] * (width - length) + ids] * G
        prompt_mask += [[0] * (width - length) + [1] * length] * G
    completion_mask = (torch.arange(t) < torch.tensor(completion_lengths).unsqueeze(1)).long()
    completion_ids = torch.randint(1, vocab, (len(completion_lengths), t), generator=gen) * completion_mask
    return torch.tensor(prompt_ids), torch.tensor(prompt_mask), completion_ids, completion_mask


def trl_logps(model, prompt_ids, prompt_mask, completion_ids, completion_mask):
    """TRL 1.16's update forward (``_get_per_token_logps_and_entropies``), reproduced for one chunk."""
    input_ids = torch.cat([prompt_ids, completion_ids], 1)
    attention = torch.cat([prompt_mask, completion_mask], 1)
    labels = input_ids.masked_fill(attention == 0, -100)
    t = completion_ids.size(1)
    labels[:, :-t] = -100
    out = model(input_ids=input_ids, attention_mask=attention, labels=labels, fused_lm_head=True)
    return out.log_probs[:, -t:], out.entropy[:, -t:]


def fused_policy(lora=False, lora_seed=0):
    model, _ = tiny_policy(seed=1, vocab_size=300)
    add_fused_lm_head(model, temperature=0.7, outputs=("log_probs", "entropy"))
    if lora:
        from peft import LoraConfig, get_peft_model

        with torch.random.fork_rng(devices=[]):  # the adapters' random init: the same whatever ran before
            torch.manual_seed(lora_seed)
            model = get_peft_model(
                model,
                LoraConfig(
                    r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0, init_lora_weights=False
                ),
            )
    model.train()
    return model


def test_distinct_rows_maps_every_row_to_its_prompt():
    prompt_ids, prompt_mask, *_ = left_padded_batch()
    ids, mask, inverse = distinct_rows(prompt_ids, prompt_mask)
    assert ids.shape == (3, 12) and inverse.shape == (9,)
    assert torch.equal(ids[inverse], prompt_ids) and torch.equal(mask[inverse], prompt_mask)
    # same ids under a different padding mask are different prompts
    _, _, inverse2 = distinct_rows(torch.zeros(2, 4, dtype=torch.long), torch.tensor([[0, 1, 1, 1], [1, 1, 1, 1]]))
    assert inverse2[0] != inverse2[1]


def logps_and_grads(model, weights, forward):
    """``forward()``'s ``(log-probs, entropies)`` ``(B, T)`` and every parameter's gradient of
    ``Σ weights · (log-probs + 0.1 · entropies)``."""
    model.zero_grad()
    logps, entropy = forward()
    ((logps * weights).sum() + 0.1 * (entropy * weights).sum()).backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return logps.detach(), entropy.detach(), grads


@pytest.mark.parametrize("lora", [False, True])
def test_logps_entropies_and_gradient_equal_trl_forward(lora):
    model = fused_policy(lora)
    batch = left_padded_batch()
    weights = torch.randn(batch[2].shape, generator=torch.Generator().manual_seed(5))
    ref_logps, ref_entropy, ref_grads = logps_and_grads(model, weights, lambda: trl_logps(model, *batch))
    calls = []
    model.register_forward_pre_hook(lambda *_: calls.append(1))
    logps, entropy, grads = logps_and_grads(
        model, weights, lambda: shared_prompt_logps(model, *batch, compute_entropy=True)
    )
    assert len(calls) == 2
    mask = batch[3].bool()
    assert torch.all(logps[~mask] == 0) and torch.all(logps[mask] < 0)
    torch.testing.assert_close(logps, ref_logps, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(entropy, ref_entropy, atol=1e-5, rtol=1e-5)
    assert grads.keys() == ref_grads.keys() and len(grads) > 0
    if lora:
        assert all("lora_" in name for name in grads)
    for name in ref_grads:
        torch.testing.assert_close(grads[name], ref_grads[name], atol=1e-5, rtol=1e-4, msg=name)


def test_not_under_activation_checkpointing_while_training():
    model = fused_policy()
    model.activation_checkpointing_enable()
    assert not can_share_prompts(model, prompt_length=10)
    with torch.no_grad():  # no backward to replay: the cache is kept
        assert can_share_prompts(model, prompt_length=10)
    model.eval()
    assert can_share_prompts(model, prompt_length=10)
    assert not can_share_prompts(fused_policy(), prompt_length=1)


def loss_and_grad(trainer, inputs):
    trainer.model.zero_grad()
    loss = trainer._compute_loss(trainer.model, inputs)
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in trainer.model.named_parameters() if p.grad is not None}


def update_inputs(trainer) -> dict:
    """An update micro-batch as TRL hands it to ``_compute_loss`` (left-padded prompts, right-padded
    completions, ``(B, T)`` advantages, off-policy old log-probabilities so clipping is active); puts
    ``trainer`` in train mode for one accumulation step."""
    trainer.current_gradient_accumulation_steps = 1
    trainer.model.train()
    prompt_ids, prompt_mask, completion_ids, completion_mask = left_padded_batch(vocab=len(trainer.processing_class))
    gen = torch.Generator().manual_seed(2)
    advantages = torch.randn(completion_ids.shape, generator=gen) * completion_mask
    old = -torch.rand(completion_ids.shape, generator=gen) * 6 * completion_mask
    return {
        "prompt_ids": prompt_ids,
        "prompt_mask": prompt_mask,
        "completion_ids": completion_ids,
        "completion_mask": completion_mask,
        "advantages": advantages,
        "old_per_token_logps": old,
        "num_items_in_batch": completion_mask.sum(),
        SEQUENCE_ADVANTAGES_KEY: advantages.sum(1) / completion_mask.sum(1),
    }


@pytest.mark.parametrize("loss_type", ["dapo", "grpo", "bnpo", "dr_grpo", "cispo", "sapo"])
def test_trainer_loss_and_gradient_equal_with_and_without_shared_prompts(tmp_path, loss_type):
    """Through TRL's ``_compute_loss``: ``(B, T)`` advantages, an off-policy ratio (old log-probs
    that differ from the current ones) so clipping is active, and each loss type's normaliser."""
    trainer = make_trainer(
        tmp_path, [has_letter_e, char_code], loss_type=loss_type, per_device_train_batch_size=9, num_generations=G
    )
    assert trainer.args.shared_prompt_update
    inputs = update_inputs(trainer)
    calls = []
    trainer.model.register_forward_pre_hook(lambda *_: calls.append(1))
    loss_shared, grad_shared = loss_and_grad(trainer, inputs)
    assert len(calls) == 2
    trainer.args.shared_prompt_update = False
    loss_whole, grad_whole = loss_and_grad(trainer, inputs)
    assert len(calls) == 3
    assert loss_whole != 0
    torch.testing.assert_close(loss_shared, loss_whole, atol=1e-6, rtol=1e-5)
    assert grad_shared.keys() == grad_whole.keys() and len(grad_whole) > 0
    for name in grad_whole:
        torch.testing.assert_close(grad_shared[name], grad_whole[name], atol=1e-6, rtol=1e-4, msg=name)


def test_generation_with_shared_prefill_equals_plain_generate():
    """Greedy decoding of left-padded prompts, each repeated G times: the same tokens whether every
    row prefills itself or each distinct prompt is prefilled once (with ``generate``'s positions)."""
    from mrtpo.shared_prompt import shared_prefill

    model, tok = tiny_policy(seed=3, vocab_size=300)
    prompt_ids, prompt_mask, *_ = left_padded_batch(seed=4, vocab=len(tok))
    settings = dict(do_sample=False, max_new_tokens=12, pad_token_id=tok.pad_token_id, eos_token_id=None)
    plain = model.generate(input_ids=prompt_ids, attention_mask=prompt_mask, **settings)
    prefilled = []
    model.register_forward_pre_hook(
        lambda module, args, kwargs: prefilled.append(kwargs["input_ids"].shape), with_kwargs=True
    )
    with shared_prefill(model):
        shared = model.generate(input_ids=prompt_ids, attention_mask=prompt_mask, **settings)
    assert "generate" not in vars(model)  # the instance is left as it was
    assert torch.equal(shared, plain) and shared.shape == (9, 12 + 12)
    # one prefill of the 3 distinct prompts less their last token, then one token per row at a time
    assert prefilled[0] == (3, 11) and prefilled[1] == (9, 1) and len(prefilled) == 1 + 12


def test_trainer_generates_with_shared_prefill(tmp_path):
    """A trainer step samples through the shared prefill: one forward of the 2 distinct prompts of
    its 6-row batch; with ``shared_prompt_generation=False`` every row prefills itself."""

    def forward_shapes(**settings):
        # gdpo: no replay, whose batched contexts (2 here) would also make 2-row forwards
        trainer = make_trainer(
            tmp_path,
            [has_letter_e, char_code],
            max_steps=1,
            num_generations=G,
            per_device_train_batch_size=6,
            method="gdpo",
            **settings,
        )
        shapes = []
        body = underlying_model(trainer.model).model  # the layers under the head: every forward runs them
        body.register_forward_pre_hook(
            lambda module, args, kwargs: shapes.append(tuple(kwargs["input_ids"].shape)), with_kwargs=True
        )
        trainer.train()
        assert "generate" not in vars(trainer.model)
        return shapes

    assert any(rows == 2 and length > 1 for rows, length in forward_shapes(shared_prompt_update=False))
    assert not any(rows == 2 for rows, _ in forward_shapes(shared_prompt_generation=False, shared_prompt_update=False))
