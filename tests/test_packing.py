"""mrtpo.packing: completions packed behind their shared prefix give the values of the padded rows."""

from __future__ import annotations

import pytest
import torch

from mrtpo.model_calls import ForwardCounter
from mrtpo.packing import pack, packed_logps
from mrtpo.replay import ReplayGroup, batch_relevance
from mrtpo.replay_passes import replay_forward_calls
from mrtpo.testing import tiny_policy
from test_shared_prompt import (
    G,
    fused_policy,
    left_padded_batch,
    logps_and_grads,
    loss_and_grad,
    trl_logps,
    update_inputs,
)
from test_trainer import char_code, has_letter_e, make_trainer


def test_pack_lays_out_segments_positions_labels_and_the_block_mask_by_hand():
    batch = pack([[1, 2, 3]], [[[4, 5], [6]]], pad_id=0)
    # row: prefix less its last token, then [3, 4] predicting 4, 5 and [3] predicting 6
    assert batch.input_ids.tolist() == [[1, 2, 3, 4, 3]]
    assert batch.position_ids.tolist() == [[0, 1, 2, 3, 2]]
    assert batch.labels.tolist() == [[-100, -100, 4, 5, 6]]
    assert batch.index.tolist() == [[2, 3], [4, 0]] and batch.valid.tolist() == [[True, True], [True, False]]
    seen = batch.attention[0, 0].int().tolist()
    assert seen[3] == [1, 1, 1, 1, 0]  # the first segment's second token: prefix and its own segment
    assert seen[4] == [1, 1, 0, 0, 1]  # the second segment sees the prefix, not the first segment
    assert seen[0] == [1, 0, 0, 0, 0]  # the prefix is causal


def test_pack_pads_rows_and_numbers_completions_row_by_row():
    batch = pack([[7], [1, 2]], [[[5, 6, 8]], [[9], []]], pad_id=0, width=4)
    assert batch.input_ids.tolist() == [[7, 5, 6], [1, 2, 0]]
    assert batch.index.shape == (3, 4)
    assert batch.index[0, :3].tolist() == [0, 1, 2] and batch.index[1, 0].item() == 3 + 1
    assert batch.valid.sum(1).tolist() == [3, 1, 0]
    assert batch.attention[1, 0, 2].tolist() == [True, False, True]  # padding: the prefix and itself, no segment
    with pytest.raises(ValueError, match="at least one token"):
        pack([[]], [[[1]]])


@pytest.mark.parametrize("lora", [False, True])
def test_packed_logps_entropies_and_gradient_equal_trl_forward(lora):
    model = fused_policy(lora)
    batch = left_padded_batch()
    weights = torch.randn(batch[2].shape, generator=torch.Generator().manual_seed(5))

    def run(forward):
        return logps_and_grads(model, weights, forward)

    ref_logps, ref_entropy, ref_grads = run(lambda: trl_logps(model, *batch))
    calls = []
    model.register_forward_pre_hook(lambda *_: calls.append(1))
    logps, entropy, grads = run(lambda: packed_logps(model, *batch, compute_entropy=True))
    assert len(calls) == 1
    mask = batch[3].bool()
    assert torch.all(logps[~mask] == 0) and torch.all(entropy[~mask] == 0)
    torch.testing.assert_close(logps[mask], ref_logps[mask], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(entropy[mask], ref_entropy[mask], atol=1e-5, rtol=1e-5)
    # the reference also differentiates the masked positions' values; weight them out on both sides
    weights.mul_(batch[3])
    ref_logps, ref_entropy, ref_grads = run(lambda: trl_logps(model, *batch))
    _, _, grads = run(lambda: packed_logps(model, *batch, compute_entropy=True))
    assert grads.keys() == ref_grads.keys() and len(grads) > 0
    for name in ref_grads:
        # summed in another order
        torch.testing.assert_close(grads[name], ref_grads[name], atol=5e-5, rtol=2e-4, msg=name)


def _groups(seed=0):
    gen = torch.Generator().manual_seed(seed)
    groups = []
    for g in range(3):
        contexts = [[5, 6, 7, 8 + g, 9], [5, 6, 9], [5, 6, 7, 8 + g, 9, 11, 12], [5, 6, 7, 8 + g, 9]]
        lengths = torch.randint(1, 9, (4,), generator=gen)
        completions = torch.randint(3, 50, (4, 8), generator=gen) * (torch.arange(8) < lengths[:, None])
        groups.append(ReplayGroup(contexts, ["in_prompt", "privileged", "in_prompt"], completions, lengths))
    return groups


@pytest.mark.parametrize("kind", ["js", "kl"])
@pytest.mark.parametrize("groups_per_pass", [1, None])
def test_packed_replay_equals_the_padded_replay_in_one_call_per_pass(kind, groups_per_pass):
    model, _ = tiny_policy(seed=3, num_layers=2)
    groups = _groups()
    padded, packed = ForwardCounter(), ForwardCounter()
    ref = batch_relevance(model, groups, kind=kind, groups_per_pass=groups_per_pass, counter=padded, with_entropy=True)
    got = batch_relevance(
        model, groups, kind=kind, groups_per_pass=groups_per_pass, counter=packed, with_entropy=True, packed=True
    )
    for a, b in zip(ref, got):
        torch.testing.assert_close(b.maps, a.maps, atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(b.entropy, a.entropy, atol=1e-5, rtol=1e-4)
    assert torch.all(got[0].maps[2] == 0)  # the repeated original context: exactly no relevance
    contexts, sizes = [g.contexts for g in groups], [4] * 3
    assert packed.calls == replay_forward_calls(contexts, sizes, groups_per_pass=groups_per_pass, packed=True)
    assert packed.calls == (3 if groups_per_pass == 1 else 1) < padded.calls


def test_trainer_loss_and_gradient_equal_packed_and_padded(tmp_path):
    trainer = make_trainer(tmp_path, [has_letter_e, char_code], per_device_train_batch_size=9, num_generations=G)
    inputs = update_inputs(trainer)
    calls = []
    trainer.model.register_forward_pre_hook(lambda *_: calls.append(1))
    loss_padded, grad_padded = loss_and_grad(trainer, inputs)
    trainer.args.packed_sequences = True
    loss_packed, grad_packed = loss_and_grad(trainer, inputs)
    assert len(calls) == 2 + 1
    assert loss_padded != 0
    torch.testing.assert_close(loss_packed, loss_padded, atol=1e-6, rtol=1e-5)
    for name in grad_padded:
        torch.testing.assert_close(grad_packed[name], grad_padded[name], atol=1e-6, rtol=1e-4, msg=name)
