"""Skipping what cannot move the policy: replays of rewards with a zero coefficient, whole groups,
and zero-advantage completions in the update. Each skip must leave the advantages and the gradient
as they were."""

import json
import math

import pytest
import torch

from mrtpo.credit import CreditBatch, CreditConfig, get_method, group_normalize, reward_coefficients
from mrtpo.rewards import completion_text, evidence
from mrtpo.testing import tiny_policy
from mrtpo.trainer import SEQUENCE_ADVANTAGES_KEY, ZERO_ADVANTAGE_KEY, MRTPOTrainer
from test_trainer import char_code, config, dataset, has_letter_e, make_trainer, plain_length, record_batches

NAN = math.nan
G = 3
#: 4 groups of 3, rewards (has_letter_e: in-prompt evidence, char_code: privileged, plain_length: none).
#: group 0: the two rewards with evidence spread, plain_length constant;
#: group 1: only char_code spreads (has_letter_e has one valid value: zero spread);
#: group 2: every reward constant (nothing to replay, under every method);
#: group 3: only plain_length (no evidence) spreads: mrtpo replays nothing, contrast / entropy need their map.
REWARDS = torch.tensor(
    [
        [1.0, 2.0, 0.5],
        [0.0, 5.0, 0.5],
        [1.0, 1.0, 0.5],
        [1.0, 3.0, 0.2],
        [NAN, 0.0, 0.2],
        [NAN, 6.0, 0.2],
        [0.0, 4.0, 0.7],
        [0.0, 4.0, 0.7],
        [0.0, 4.0, 0.7],
        [1.0, 2.0, 0.1],
        [1.0, 2.0, 0.9],
        [1.0, 2.0, 0.4],
    ]
)
LENGTHS = [5, 7, 3, 6, 6, 2, 4, 7, 5, 7, 1, 6]


def synthetic_batch(trainer):
    """``(inputs, out)`` as TRL hands them to the replay: 4 prompts x 3 completions of random bytes."""
    rows = list(dataset())
    inputs = [rows[j // G] for j in range(len(LENGTHS))]
    prompts = [trainer._tokenize(r["prompt"], trainer._render(r["prompt"])) for r in inputs]
    width, pad = max(map(len, prompts)), trainer.processing_class.pad_token_id
    prompt_ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
    prompt_mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    gen = torch.Generator().manual_seed(3)
    t = max(LENGTHS)
    completion_mask = (torch.arange(t).unsqueeze(0) < torch.tensor(LENGTHS).unsqueeze(1)).long()
    completion_ids = torch.where(completion_mask.bool(), torch.randint(97, 123, (len(LENGTHS), t), generator=gen), pad)
    return inputs, {
        "prompt_ids": prompt_ids,
        "prompt_mask": prompt_mask,
        "completion_ids": completion_ids,
        "completion_mask": completion_mask,
    }


def count_forwards(model):
    calls = []
    model.register_forward_pre_hook(lambda *_: calls.append(1))
    return calls


@pytest.mark.parametrize(
    "method, calls_all, calls_skipped, counts",
    [
        # a replayed group: the original prompt, the counterfactuals' tokens after their departure from
        # it, its completions (3 calls, any C; 2 with the original alone)
        # mrtpo: group 0 replays base + 2 counterfactuals, group 1 base + char_code's; groups 2, 3 nothing
        ("mrtpo", 4 * 3, 2 * 3, (6, 6, 3, 5)),
        ("contrast", 4 * 3, 3 * 3, (9, 3, 3, 1)),  # the joint map: every group but 2
        ("entropy", 4 * 2, 3 * 2, (9, 3, 0, 0)),  # the base context's entropy: all but group 2
    ],
)
def test_skipping_zero_coefficient_replays_keeps_the_advantages(tmp_path, method, calls_all, calls_skipped, counts):
    trainer = make_trainer(
        tmp_path,
        [has_letter_e, char_code, plain_length],
        method=method,
        per_device_train_batch_size=12,
        num_generations=G,
    )
    inputs, out = synthetic_batch(trainer)
    coefficients = reward_coefficients(REWARDS, G)
    calls = count_forwards(trainer.model)
    everything = trainer._replay(inputs, out, None)
    assert len(calls) == calls_all
    calls.clear()
    skipped = trainer._replay(inputs, out, coefficients)
    assert len(calls) == calls_skipped == trainer.replay_forward_calls
    keys = ("completions_replayed", "completions_skipped", "contexts_replayed", "contexts_skipped")
    assert trainer._replay_counts == dict(zip(keys, counts))
    mask = out["completion_mask"].float()
    config_ = CreditConfig()
    advantages = []
    for maps in (everything, skipped):
        batch = CreditBatch(
            rewards=REWARDS,
            group_size=G,
            mask=mask,
            relevance=maps["relevance"],
            joint_relevance=maps["joint_relevance"],
            entropy=maps["entropy"],
            has_evidence=maps["has_evidence"],
        )
        advantages.append(get_method(method)(batch, config_))
    torch.testing.assert_close(advantages[1], advantages[0], atol=1e-6, rtol=0)
    # Not vacuous: replayed groups have token-varying advantages, the skipped ones were replayed before.
    valid = mask.bool()
    assert any(advantages[0][j][valid[j]].std() > 1e-3 for j in range(G) if LENGTHS[j] > 1)
    if method == "mrtpo":
        assert everything["has_evidence"][6:, :2].all() and not skipped["has_evidence"][6:].any()
        assert skipped["has_evidence"][3:6].tolist() == [[False, True, False]] * 3
        assert skipped["skipped"][:, :2].tolist() == [[False, False]] * 3 + [[True, False]] * 3 + [[True, True]] * 6
    else:
        assert skipped["skipped"].tolist() == [[False] * 3] * 6 + [[True] * 3] * 3 + [[False] * 3] * 3


def test_zero_spread_is_decided_per_reward_not_on_the_sum(tmp_path):
    """Two rewards that differ but sum to the same total in every completion: the summed reward has no
    spread, yet each reward's advantage moves tokens, so both counterfactuals are replayed."""
    rewards = torch.tensor([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [1.0, 0.0, 0.0]] * 4)
    trainer = make_trainer(
        tmp_path, [has_letter_e, char_code, plain_length], per_device_train_batch_size=12, num_generations=G
    )
    inputs, out = synthetic_batch(trainer)
    maps = trainer._replay(inputs, out, reward_coefficients(rewards, G))
    assert maps["has_evidence"][:, :2].all() and trainer._replay_counts["contexts_skipped"] == 0


def loss_inputs(trainer, advantages):
    """One micro-batch for TRL's loss: the synthetic batch with these ``(B, T)`` advantages."""
    _, out = synthetic_batch(trainer)
    mask = out["completion_mask"]
    return {
        **out,
        "advantages": advantages * mask,
        "num_items_in_batch": mask.sum(),
        SEQUENCE_ADVANTAGES_KEY: (advantages * mask).sum(1) / mask.sum(1),
    }


def loss_and_grad(trainer, inputs):
    trainer.model.zero_grad()
    loss = trainer._compute_loss(trainer.model, inputs)
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in trainer.model.named_parameters() if p.grad is not None}


def test_update_without_zero_advantage_rows_has_the_same_loss_and_gradient(tmp_path):
    """DAPO divides by the generation batch's token count (``num_items_in_batch``), so leaving out rows
    whose advantage is 0 at every token changes neither the loss nor its gradient."""
    trainer = make_trainer(tmp_path, [has_letter_e, char_code], per_device_train_batch_size=12, num_generations=G)
    assert trainer._update_skips_zero_rows and trainer.loss_type == "dapo"
    trainer.current_gradient_accumulation_steps = 1
    trainer.model.train()
    advantages = torch.randn(12, max(LENGTHS), generator=torch.Generator().manual_seed(0))
    zero = torch.tensor([False, True, False, False, True, True, True, False, False, True, False, True])
    advantages[zero] = 0.0
    full = loss_inputs(trainer, advantages)
    calls = count_forwards(trainer.model)
    loss_all, grad_all = loss_and_grad(trainer, full)
    loss_kept, grad_kept = loss_and_grad(trainer, {**full, ZERO_ADVANTAGE_KEY: zero})
    assert len(calls) == 4  # two losses, each its distinct prompts' forward and the completions'
    torch.testing.assert_close(loss_kept, loss_all, atol=1e-7, rtol=1e-5)
    assert grad_all.keys() == grad_kept.keys() and len(grad_all) > 0
    for name in grad_all:
        torch.testing.assert_close(grad_kept[name], grad_all[name], atol=1e-7, rtol=1e-4, msg=name)
    # A micro-batch of zero rows only still runs one row (every process makes its forward/backward).
    all_zero = {**loss_inputs(trainer, advantages * 0), ZERO_ADVANTAGE_KEY: torch.ones_like(zero)}
    loss_none, grad_none = loss_and_grad(trainer, all_zero)
    assert loss_none == 0 and all(torch.all(g == 0) for g in grad_none.values())


@pytest.mark.parametrize(
    "setting, skips",
    [
        ({}, True),
        ({"loss_type": "cispo"}, True),
        ({"loss_type": "grpo"}, False),
        ({"loss_type": "bnpo"}, False),
        ({"loss_type": "dr_grpo"}, False),
        ({"entropy_coef": 0.01}, False),
        ({"top_entropy_quantile": 0.5}, False),
        ({"skip_zero_advantage": False}, False),
    ],
)
def test_update_skips_only_where_it_is_exact(tmp_path, setting, skips):
    model, tok = tiny_policy(seed=0)
    trainer = MRTPOTrainer(
        model=model,
        processing_class=tok,
        reward_funcs=[has_letter_e, char_code],
        args=config(tmp_path, **setting),
        train_dataset=dataset(),
    )
    assert trainer._update_skips_zero_rows is skips
    trainer.beta = 0.04  # a KL term (beta > 0 would load a reference model by name)
    assert not trainer._skips_zero_rows()


@evidence(lambda row: row["gold"], placement="privileged")
def code_on_even_examples(completions, example_id, **kwargs):
    """``char_code`` on ex0 and ex2 (a spread in their groups), constant on ex1 and ex3."""
    return [
        float(sum(map(ord, completion_text(c))) % 7) if int(i[-1]) % 2 == 0 else 1.0
        for c, i in zip(completions, example_id)
    ]


@pytest.mark.parametrize("method", ["mrtpo", "grpo"])
def test_skip_metrics_and_zero_rows_through_the_trainer(tmp_path, method):
    """The logged zero-spread shares and skip counts against the batch's own rewards: the groups of
    ex1 and ex3 have no spread in either reward, so they are neither replayed nor in the update."""
    trainer = make_trainer(
        tmp_path,
        [has_letter_e, code_on_even_examples],
        method=method,
        max_steps=2,
        per_device_train_batch_size=8,
        num_generations=4,
    )
    seen = record_batches(trainer)
    trainer.train()
    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    logged = [x for x in lines if "skip/zero_spread/has_letter_e" in x]  # one generation per logged step
    assert len(logged) == len(seen) == 2
    zero_rows = []
    for batch, metrics in zip(seen, logged):
        rewards = batch["rewards"]
        spread = group_normalize(rewards, 4).view(2, 4, 2).ne(0).any(1)  # (groups, K)
        for k, name in enumerate(["has_letter_e", "code_on_even_examples"]):
            assert metrics[f"skip/zero_spread/{name}"] == 1.0 - spread[:, k].double().mean().item()
        if method == "grpo":
            zero = batch["out"]["mrtpo_sequence_advantages"] == 0
            assert "skip/contexts_replayed" not in metrics
        else:
            zero = (reward_coefficients(rewards, 4) == 0).all(1)
            assert metrics["skip/completions_replayed"] == 4 * spread.any(1).sum().item()
            assert metrics["skip/completions_skipped"] == 8 - metrics["skip/completions_replayed"]
            assert metrics["skip/contexts_replayed"] == spread.sum().item()
            assert metrics["skip/contexts_skipped"] == (~spread).sum().item()
        assert torch.equal(batch["out"][ZERO_ADVANTAGE_KEY].cpu(), zero.cpu())
        assert metrics["skip/update_completions_skipped"] == zero.sum().item()
        torch.testing.assert_close(batch["out"]["advantages"][zero], torch.zeros(int(zero.sum()), 8), atol=1e-6, rtol=0)
        zero_rows += zero.tolist()
    assert 0 < sum(zero_rows) < len(zero_rows)  # both kinds of completion occurred


def test_skip_zero_advantage_false_replays_and_updates_every_completion(tmp_path):
    """``skip_zero_advantage=False`` (the GPU check: random weights score 0 everywhere) does the whole
    step's work: every group's every counterfactual is replayed, and no update row is left out, although
    the groups of ex1 and ex3 have no spread."""
    trainer = make_trainer(
        tmp_path,
        [has_letter_e, code_on_even_examples],
        max_steps=2,
        per_device_train_batch_size=8,
        num_generations=4,
        skip_zero_advantage=False,
    )
    seen = record_batches(trainer)
    trainer.train()
    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    logged = [x for x in lines if "skip/zero_spread/has_letter_e" in x]
    assert len(logged) == len(seen) == 2
    assert any(x["skip/zero_spread/code_on_even_examples"] > 0 for x in logged)  # there was something to skip
    for batch, metrics in zip(seen, logged):
        assert metrics["skip/completions_replayed"] == 8 and metrics["skip/completions_skipped"] == 0
        assert metrics["skip/contexts_replayed"] == 2 * 2 and metrics["skip/contexts_skipped"] == 0
        assert "skip/update_completions_skipped" not in metrics and ZERO_ADVANTAGE_KEY not in batch["out"]
