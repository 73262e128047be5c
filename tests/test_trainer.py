"""MRTPOTrainer on a tiny random model: real TRL generation, scoring, replays and updates."""

import json

import pytest
import torch
from datasets import Dataset

from mrtpo.credit import gdpo_advantages
from mrtpo.replay import EvidenceNotFoundError
from mrtpo.rewards import completion_text, evidence
from mrtpo.testing import tiny_policy
from mrtpo.trainer import MRTPOConfig, MRTPOTrainer

CONSTRAINT = "Use the letter e."


@evidence("constraint", placement="in_prompt")
def has_letter_e(completions, **kwargs):
    return [float("e" in completion_text(c)) for c in completions]


@evidence(lambda row: row["gold"], placement="privileged")
def long_enough(completions, **kwargs):
    return [float(len(completion_text(c)) >= 6) for c in completions]


@evidence(lambda row: row["gold"], placement="privileged")
def char_code(completions, **kwargs):
    """Varies between almost any two random completions, so every group has a spread."""
    return [float(sum(map(ord, completion_text(c))) % 7) for c in completions]


def plain_length(completions, **kwargs):
    return [len(completion_text(c)) / 10 for c in completions]


def dataset(constraint=CONSTRAINT):
    rows = []
    for i, topic in enumerate(["cats", "rain", "tea", "maps"]):
        rows.append({
            "prompt": [{"role": "system", "content": f"Answer briefly. {CONSTRAINT}"},
                       {"role": "user", "content": f"Tell me about {topic}."}],
            "constraint": constraint, "gold": f"about {topic}", "example_id": f"ex{i}",
        })
    return Dataset.from_list(rows)


def config(tmp_path, **kw):
    base = dict(
        output_dir=str(tmp_path), use_cpu=True, bf16=False, gradient_checkpointing=False, report_to=[],
        per_device_train_batch_size=4, num_generations=2, max_completion_length=8, max_steps=2,
        logging_steps=1, save_strategy="no", learning_rate=1e-3, seed=0, temperature=1.0,
        multi_objective_aggregation="normalize_then_sum", credit_samples=2,
    )
    base.update(kw)
    return MRTPOConfig(**base)


def make_trainer(tmp_path, reward_funcs, **kw):
    model, tok = tiny_policy(seed=0)
    return MRTPOTrainer(model=model, processing_class=tok, reward_funcs=reward_funcs,
                        args=config(tmp_path, **kw), train_dataset=dataset())


def record_batches(trainer):
    seen = []
    original = trainer._generate_and_score_completions

    def wrapped(inputs):
        out = original(inputs)
        seen.append({"out": {k: v.clone() if torch.is_tensor(v) else v for k, v in out.items()},
                     "rewards": trainer._last_rewards.clone(), "trl": trainer._trl_advantages.clone()})
        return out

    trainer._generate_and_score_completions = wrapped
    return seen


def test_mrtpo_training_step_end_to_end(tmp_path):
    trainer = make_trainer(tmp_path, [has_letter_e, long_enough, plain_length])
    seen = record_batches(trainer)
    trainer.train()
    assert len(seen) == 2
    for batch in seen:
        adv, mask = batch["out"]["advantages"], batch["out"]["completion_mask"].float()
        assert adv.shape == mask.shape and torch.isfinite(adv).all()
        assert torch.equal(adv[mask == 0], torch.zeros(int((mask == 0).sum())))
        # Invariant through the trainer: mean over tokens = GDPO = TRL's own normalize_then_sum.
        rows = mask.sum(1) > 0
        mean = (adv * mask).sum(1)[rows] / mask.sum(1)[rows]
        torch.testing.assert_close(mean, gdpo_advantages(batch["rewards"], 2)[rows], atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(gdpo_advantages(batch["rewards"], 2), batch["trl"], atol=1e-4, rtol=1e-4)
    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    keys = set().union(*lines)
    for key in ("loss", "time/generation", "time/scoring", "time/replay", "time/update",
                "credit/has_letter_e/top10_share", "credit/long_enough/weight_entropy",
                "credit/has_letter_e/relevance_mean", "credit/top10_overlap/has_letter_e~long_enough",
                "rewards/has_letter_e/mean"):
        assert key in keys, key
    samples = [json.loads(x) for x in (tmp_path / "credit_samples.jsonl").read_text().splitlines()]
    assert samples and set(samples[0]["weights"]) == {"has_letter_e", "long_enough", "plain_length"}
    first = samples[0]
    assert len(first["tokens"]) == len(first["advantage"]) == len(first["weights"]["plain_length"])
    assert all(w == 1.0 for w in first["weights"]["plain_length"])  # no evidence: uniform


@pytest.mark.parametrize("method", ["grpo", "gdpo", "contrast", "entropy"])
def test_baseline_methods_run(tmp_path, method):
    trainer = make_trainer(tmp_path, [has_letter_e, char_code], method=method, max_steps=1)
    seen = record_batches(trainer)
    trainer.train()
    adv, mask = seen[0]["out"]["advantages"], seen[0]["out"]["completion_mask"].float()
    rows = mask.sum(1) > 0
    mean = (adv * mask).sum(1)[rows] / mask.sum(1)[rows]
    assert mean.abs().max() > 0.1  # the batch carries a learning signal
    if method == "grpo":
        from mrtpo.credit import grpo_advantages

        torch.testing.assert_close(mean, grpo_advantages(seen[0]["rewards"], 2)[rows], atol=1e-5, rtol=1e-5)
    else:
        torch.testing.assert_close(mean, gdpo_advantages(seen[0]["rewards"], 2)[rows], atol=1e-4, rtol=1e-4)
    if method in ("grpo", "gdpo"):  # uniform: every valid token carries the sequence's advantage
        torch.testing.assert_close(adv[rows], mean.unsqueeze(1) * mask[rows])
    else:  # a token map moves credit between tokens
        assert not torch.allclose(adv[rows], mean.unsqueeze(1) * mask[rows])


def test_missing_evidence_span_is_an_error_naming_reward_and_example(tmp_path):
    model, tok = tiny_policy(seed=0)
    with pytest.raises(EvidenceNotFoundError, match="'has_letter_e' for example 'ex0'"):  # at start-up
        MRTPOTrainer(model=model, processing_class=tok, reward_funcs=[has_letter_e],
                     args=config(tmp_path, max_steps=1), train_dataset=dataset(constraint="Not in the prompt."))


def test_config_validation_messages(tmp_path):
    with pytest.raises(ValueError, match="unknown method 'gspo'"):
        config(tmp_path, method="gspo")
    with pytest.raises(ValueError, match="one advantage per sequence"):
        config(tmp_path, loss_type="vespo")
    with pytest.raises(ValueError, match="importance_sampling_level"):
        config(tmp_path, importance_sampling_level="sequence")
    with pytest.raises(ValueError, match="relevance_top_k approximates"):
        config(tmp_path, relevance="kl", relevance_top_k=8)
    with pytest.raises(ValueError, match="lam"):
        config(tmp_path, lam=2.0)
    with pytest.raises(ValueError, match="needs rewards with evidence"):
        make_trainer(tmp_path, [plain_length])


@pytest.mark.parametrize("micro_batch", [None, 1])
def test_trainer_relevance_matches_a_standalone_replay(tmp_path, micro_batch):
    """The trainer's grouped, KV-shared replay gives the relevance of replaying the pair alone,
    whether a group's completions replay together or one at a time (``replay_micro_batch``)."""
    from mrtpo.replay import replay_completion
    from mrtpo.verifiers import Example

    trainer = make_trainer(tmp_path, [has_letter_e, long_enough, plain_length], max_steps=1,
                           replay_micro_batch=micro_batch)
    trainer.train()
    # 2 groups of 2 completions, 3 contexts: prefix + 2 per context = 7 calls a pass
    assert trainer.replay_forward_calls == 2 * 7 * (1 if micro_batch is None else 2)
    sample = json.loads((tmp_path / "credit_samples.jsonl").read_text().splitlines()[0])
    row = next(r for r in dataset() if r["example_id"] == sample["example_id"])
    model, tok = tiny_policy(seed=0)  # the weights the first batch was replayed with
    ids = sample["token_ids"]
    assert len(ids) == len(sample["tokens"]) > 0
    example = Example(id=row["example_id"], split="train", messages=row["prompt"])
    result = replay_completion(model, tok, example, torch.tensor(ids),
                               [has_letter_e.mrtpo_evidence.resolve(row), long_enough.mrtpo_evidence.resolve(row), None])
    for k, name in enumerate(["has_letter_e", "long_enough"]):
        torch.testing.assert_close(result.relevance[k], torch.tensor(sample["relevance"][name]), atol=1e-4, rtol=1e-3)
