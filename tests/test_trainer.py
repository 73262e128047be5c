"""MRTPOTrainer on a tiny random model: real TRL generation, scoring, replays and updates."""

import json

import pytest
import torch
from datasets import Dataset

from mrtpo.counterfactual import EvidenceNotFoundError
from mrtpo.credit import gdpo_advantages
from mrtpo.rewards import completion_text, evidence
from mrtpo.testing import tiny_policy
from mrtpo.trainer import MRTPOConfig, MRTPOTrainer

CONSTRAINT = "Use the letter e."


@evidence("constraint", placement="in_prompt")
def has_letter_e(completions, **kwargs):
    return [float("e" in completion_text(c)) for c in completions]


@evidence(lambda row: row["gold"], placement="privileged")
def char_code(completions, **kwargs):
    """Varies between almost any two random completions, so every group has a spread."""
    return [float(sum(map(ord, completion_text(c))) % 7) for c in completions]


def plain_length(completions, **kwargs):
    return [len(completion_text(c)) / 10 for c in completions]


def dataset(constraint=CONSTRAINT):
    rows = []
    for i, topic in enumerate(["cats", "rain", "tea", "maps"]):
        rows.append(
            {
                "prompt": [
                    {"role": "system", "content": f"Answer briefly. {CONSTRAINT}"},
                    {"role": "user", "content": f"Tell me about {topic}."},
                ],
                "constraint": constraint,
                "gold": f"about {topic}",
                "example_id": f"ex{i}",
            }
        )
    return Dataset.from_list(rows)


def config(tmp_path, **kw):
    base = dict(
        output_dir=str(tmp_path),
        use_cpu=True,
        bf16=False,
        activation_checkpointing=False,
        report_to=[],
        per_device_train_batch_size=4,
        num_generations=2,
        max_completion_length=8,
        max_steps=2,
        logging_steps=1,
        save_strategy="no",
        learning_rate=1e-3,
        seed=0,
        temperature=1.0,
        credit_samples=2,
    )
    base.update(kw)
    return MRTPOConfig(**base)


def make_trainer(tmp_path, reward_funcs, **kw):
    model, tok = tiny_policy(seed=0)
    return MRTPOTrainer(
        model=model,
        processing_class=tok,
        reward_funcs=reward_funcs,
        args=config(tmp_path, **kw),
        train_dataset=dataset(),
    )


def record_batches(trainer):
    seen = []
    original = trainer._generate_and_score_completions

    def wrapped(inputs):
        out = original(inputs)
        seen.append(
            {
                "out": {k: v.clone() if torch.is_tensor(v) else v for k, v in out.items()},
                "rewards": trainer._last_rewards.clone(),
                "trl": trainer._trl_advantages.clone(),
            }
        )
        return out

    trainer._generate_and_score_completions = wrapped
    return seen


def test_mrtpo_training_step_end_to_end(tmp_path):
    trainer = make_trainer(tmp_path, [has_letter_e, char_code, plain_length])
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
    for key in (
        "loss",
        "time/generation",
        "time/scoring",
        "time/replay",
        "time/update",
        "credit/char_code/top10_share",
        "credit/char_code/weight_entropy",
        "credit/char_code/relevance_mean",
        "credit/top10_overlap/char_code~plain_length",
        "rewards/has_letter_e/mean",
        "skip/zero_spread/has_letter_e",
        "skip/contexts_skipped",
    ):
        assert key in keys, key
    # The random policy never writes an "e": that reward has no spread, its replays are skipped and it
    # gives no credit to describe.
    assert all(x["skip/zero_spread/has_letter_e"] == 1.0 for x in lines if "skip/zero_spread/has_letter_e" in x)
    assert "credit/has_letter_e/top10_share" not in keys
    # the process's peak resident memory (this test process holds at least the ~100 MB of torch)
    import resource

    peaks = [x["memory/peak_gib"] for x in lines if "memory/peak_gib" in x]
    assert peaks and 0.1 < peaks[-1] <= resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    samples = [json.loads(x) for x in (tmp_path / "credit_samples.jsonl").read_text().splitlines()]
    assert samples and set(samples[0]["weights"]) == {"has_letter_e", "char_code", "plain_length"}
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

        expected = grpo_advantages(seen[0]["rewards"], 2)
    else:
        expected = gdpo_advantages(seen[0]["rewards"], 2)
    torch.testing.assert_close(mean, expected[rows], atol=1e-4, rtol=1e-4)
    # TRL's own advantages aggregate the rewards as the method does (multi_objective_aggregation)
    torch.testing.assert_close(seen[0]["trl"], expected, atol=1e-4, rtol=1e-4)
    if method in ("grpo", "gdpo"):  # uniform: every valid token carries the sequence's advantage
        torch.testing.assert_close(adv[rows], mean.unsqueeze(1) * mask[rows])
    else:  # a token map moves credit between tokens
        assert not torch.allclose(adv[rows], mean.unsqueeze(1) * mask[rows])


def test_missing_evidence_span_is_an_error_naming_reward_and_example(tmp_path):
    model, tok = tiny_policy(seed=0)
    with pytest.raises(EvidenceNotFoundError, match="'has_letter_e' for example 'ex0'"):  # at start-up
        MRTPOTrainer(
            model=model,
            processing_class=tok,
            reward_funcs=[has_letter_e],
            args=config(tmp_path, max_steps=1),
            train_dataset=dataset(constraint="Not in the prompt."),
        )


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
    with pytest.raises(
        ValueError, match=r"reward_lam has 1 entries for 2 reward functions \(has_letter_e, char_code\)"
    ):
        make_trainer(tmp_path, [has_letter_e, char_code], reward_lam=[0.5])
    with pytest.raises(ValueError, match="multi_objective_aggregation='sum_then_normalize' contradicts method='mrtpo'"):
        config(tmp_path, multi_objective_aggregation="sum_then_normalize")
    with pytest.raises(ValueError, match="multi_objective_aggregation='normalize_then_sum' contradicts method='grpo'"):
        config(tmp_path, method="grpo", multi_objective_aggregation="normalize_then_sum")
    assert config(tmp_path, method="gdpo", multi_objective_aggregation="normalize_then_sum").method == "gdpo"
    for scale in ("batch", "none", False):
        with pytest.raises(ValueError, match="scale_rewards=.* is not supported"):
            config(tmp_path, scale_rewards=scale)


@pytest.mark.parametrize("micro_batch,groups_per_pass", [(None, 1), (1, 1), (None, None)])
def test_trainer_relevance_matches_a_standalone_replay(tmp_path, micro_batch, groups_per_pass):
    """The trainer's grouped, KV-shared replay gives the relevance of replaying the pair alone,
    whether a group's completions replay together or one at a time (``replay_micro_batch``), and
    whether each group has its own pass or all groups share one (``replay_groups_per_pass``)."""
    from mrtpo.replay import replay_completion
    from mrtpo.verifiers import Example

    trainer = make_trainer(
        tmp_path,
        [has_letter_e, char_code, plain_length],
        max_steps=1,
        per_device_train_batch_size=8,
        replay_micro_batch=micro_batch,
        replay_groups_per_pass=groups_per_pass,
        credit_samples=4,
    )
    seen = record_batches(trainer)
    trainer.train()
    # 4 groups of 2 completions; has_letter_e has no spread (never replayed), char_code has in most groups:
    # the base and char_code's contexts: prefix, contexts' own tokens, completions = 3 calls a pass;
    # a pass per group (two with micro-batches of 1), or one pass for all groups.
    spread = (seen[0]["rewards"][:, 1].view(-1, 2).std(1) > 0).repeat_interleave(2)  # (B,) per completion
    passes = 1 if groups_per_pass is None else spread.sum().item() // 2 * (1 if micro_batch is None else 2)
    assert spread.sum() >= 4 and trainer.replay_forward_calls == 3 * passes
    samples = [json.loads(x) for x in (tmp_path / "credit_samples.jsonl").read_text().splitlines()]
    assert len(samples) == 4 and not any(any(s["relevance"]["has_letter_e"]) for s in samples)
    model, tok = tiny_policy(seed=0)  # the weights the first batch was replayed with
    for j, sample in enumerate(samples):
        if not spread[j]:  # a group without spread in char_code: not replayed
            assert not any(sample["relevance"]["char_code"])
            continue
        row = next(r for r in dataset() if r["example_id"] == sample["example_id"])
        ids = sample["token_ids"]
        assert len(ids) == len(sample["tokens"]) > 0
        example = Example(id=row["example_id"], split="train", messages=row["prompt"])
        result = replay_completion(
            model, tok, example, torch.tensor(ids), [None, char_code.mrtpo_evidence.resolve(row), None]
        )
        assert result.relevance[1].max() > 0
        torch.testing.assert_close(
            result.relevance[1], torch.tensor(sample["relevance"]["char_code"]), atol=1e-4, rtol=1e-3
        )


@pytest.mark.parametrize("groups_per_pass", [None, 1])
def test_replay_host_syncs_do_not_grow_with_the_groups(tmp_path, groups_per_pass):
    """Counted on the CPU as an upper bound of what would sync on a GPU (mrtpo.bench.traffic): the
    trainer's replay makes a fixed number of host syncs per step plus one per pass (the kernel's
    valid positions), whether it replays 2 or 4 groups, and all groups share one pass's 3 calls."""
    from mrtpo.bench.traffic import HostTraffic

    counts = {}
    for batch in (4, 8):
        trainer = make_trainer(
            tmp_path / str(batch),
            [has_letter_e, char_code, plain_length],
            max_steps=1,
            per_device_train_batch_size=batch,
            replay_groups_per_pass=groups_per_pass,
        )
        original, seen = trainer._replay, []

        def counted(*args, _original=original, _seen=seen, _trainer=trainer, **kwargs):
            with HostTraffic(_trainer.model) as traffic:
                result = _original(*args, **kwargs)
            _seen.append(
                (traffic.syncs, _trainer.replay_forward_calls, _trainer._replay_counts["completions_replayed"])
            )
            return result

        trainer._replay = counted
        trainer.train()
        counts[batch] = seen[0]
    (syncs_2, calls_2, rows_2), (syncs_4, calls_4, rows_4) = counts[4], counts[8]
    assert rows_4 > rows_2 > 0  # more groups replayed in the larger batch
    passes_2, passes_4 = (1, 1) if groups_per_pass is None else (rows_2 // 2, rows_4 // 2)
    assert (calls_2, calls_4) == (3 * passes_2, 3 * passes_4)
    assert syncs_4 - passes_4 == syncs_2 - passes_2 <= 10


def unscorable(example_id, text):
    """ex0: every completion unscorable; ex1: those of even length."""
    return example_id == "ex0" or (example_id == "ex1" and len(text) % 2 == 0)


@evidence("constraint", placement="in_prompt")
def letter_e_or_none(completions, example_id, **kwargs):
    return [
        None if unscorable(i, completion_text(c)) else float("e" in completion_text(c))
        for c, i in zip(completions, example_id)
    ]


@evidence(lambda row: row["gold"], placement="privileged")
def char_code_or_none(completions, example_id, **kwargs):
    return [
        None if unscorable(i, completion_text(c)) or i == "ex2" else float(sum(map(ord, completion_text(c))) % 7)
        for c, i in zip(completions, example_id)
    ]


def test_none_rewards_match_trl(tmp_path):
    """Unscorable completions (every reward None) are out of the statistics and get 0, as in TRL."""
    trainer = make_trainer(
        tmp_path, [letter_e_or_none, char_code_or_none], per_device_train_batch_size=8, num_generations=4
    )
    seen = record_batches(trainer)
    trainer.train()
    mixed_group = False
    for batch in seen:
        rewards, adv, mask = batch["rewards"], batch["out"]["advantages"], batch["out"]["completion_mask"].float()
        none_rows = torch.isnan(rewards).all(1)
        mixed_group |= bool((none_rows.view(-1, 4).any(1) & ~none_rows.view(-1, 4).all(1)).any())
        gdpo = gdpo_advantages(rewards, 4)
        torch.testing.assert_close(batch["trl"], gdpo, atol=1e-4, rtol=1e-4)  # TRL's normalize_then_sum
        assert torch.equal(adv[none_rows], torch.zeros(int(none_rows.sum()), adv.shape[1]))
        rows = mask.sum(1) > 0
        mean = (adv * mask).sum(1)[rows] / mask.sum(1)[rows]
        torch.testing.assert_close(mean, gdpo[rows], atol=1e-4, rtol=1e-4)
    assert mixed_group and any(torch.isnan(b["rewards"]).all(1).view(-1, 4).all(1).any() for b in seen)


def test_trained_advantages_replace_trl_in_the_completions_log(tmp_path):
    # Without batch normalisation the trained advantages differ from TRL's own (normalize_then_sum).
    trainer = make_trainer(tmp_path, [has_letter_e, char_code], max_steps=1, credit_batch_norm=False)
    seen = record_batches(trainer)
    trainer.train()
    adv, mask = seen[-1]["out"]["advantages"], seen[-1]["out"]["completion_mask"].float()
    expected = (adv * mask).sum(1) / mask.sum(1).clamp_min(1)
    assert not torch.allclose(expected, seen[-1]["trl"], atol=1e-3)
    torch.testing.assert_close(torch.tensor(list(trainer._logs["advantages"])), expected)


def record_loss_inputs(trainer, events):
    """Appends ("gen", batch) for every generation and ("loss", inputs) for every loss call."""
    generate, compute = trainer._generate_and_score_completions, trainer._compute_loss

    def gen(inputs):
        out = generate(inputs)
        events.append(("gen", {k: v.clone() if torch.is_tensor(v) else v for k, v in out.items()}))
        return out

    def loss(model, inputs):
        events.append(("loss", {k: v.detach().clone() if torch.is_tensor(v) else v for k, v in inputs.items()}))
        return compute(model, inputs)

    trainer._generate_and_score_completions, trainer._compute_loss = gen, loss


def row_key(batch, j):
    prompt = batch["prompt_ids"][j][batch["prompt_mask"][j].bool()]
    completion = batch["completion_ids"][j][batch["completion_mask"][j].bool()]
    return tuple(prompt.tolist()), tuple(completion.tolist())


def test_buffered_batches_keep_each_rows_advantages(tmp_path):
    """steps_per_generation = num_iterations = gradient_accumulation_steps = 2: TRL shuffles, splits
    and reuses a generation batch; every row the loss sees carries its own completion's advantages."""
    from mrtpo.trainer import SEQUENCE_ADVANTAGES_KEY

    trainer = make_trainer(
        tmp_path,
        [has_letter_e, char_code],
        per_device_train_batch_size=2,
        steps_per_generation=2,
        num_iterations=2,
        gradient_accumulation_steps=2,
        max_steps=4,
    )
    events = []
    record_loss_inputs(trainer, events)
    trainer.train()
    assert [kind for kind, _ in events] == ["gen"] + ["loss"] * 4 + ["gen"] + ["loss"] * 4
    for start in (0, 5):
        gen = events[start][1]
        rows = {row_key(gen, j): j for j in range(len(gen["completion_ids"]))}
        assert len(rows) == 4  # every row identifiable by its tokens
        used = []
        for _, batch in events[start + 1 : start + 5]:
            assert batch["advantages"].shape == batch["completion_ids"].shape
            for i in range(len(batch["completion_ids"])):
                j = rows[row_key(batch, i)]
                used.append(j)
                assert torch.equal(batch["advantages"][i], gen["advantages"][j])
                assert torch.equal(batch[SEQUENCE_ADVANTAGES_KEY][i], gen[SEQUENCE_ADVANTAGES_KEY][j])
        assert sorted(used) == [0, 0, 1, 1, 2, 2, 3, 3]  # each row twice (num_iterations), none lost
        assert gen["advantages"].abs().sum() > 0


@evidence("constraint", placement="in_prompt")
def vowel_count(completions, **kwargs):
    """Another reward that varies within a group, so two rewards can pull a completion both ways."""
    return [float(sum(ch in "aeiou" for ch in completion_text(c).lower()) % 4) for c in completions]


def test_off_policy_mask_keeps_or_drops_whole_sequences(tmp_path):
    """TRL's mask tests ``advantage >= 0``; with (B, T) advantages that would drop single tokens.
    The trainer decides it per sequence, by the sign of the sequence's GDPO advantage."""
    # the paper's weight shape (λ 1, no cap), under which tokens of both signs in one sequence are common
    trainer = make_trainer(
        tmp_path,
        [vowel_count, char_code],
        off_policy_mask_threshold=-1.0,
        max_steps=2,
        per_device_train_batch_size=8,
        num_generations=4,
        lam=1.0,
        w_max=None,
    )
    events, masks = [], []
    record_loss_inputs(trainer, events)
    original = trainer.get_off_policy_mask

    def recorded(**kwargs):
        mask = original(**kwargs)
        masks.append((kwargs["advantages"].detach().clone(), kwargs["mask"].detach().clone(), mask))
        return mask

    trainer.get_off_policy_mask = recorded
    trainer.train()
    losses = [batch for kind, batch in events if kind == "loss"]
    assert len(masks) == len(losses) == 2
    mixed = 0
    for batch, (token_adv, valid, mask) in zip(losses, masks):
        sequence = batch["mrtpo_sequence_advantages"]
        assert mask.shape == (len(sequence), 1)
        # KL = 0 here (one iteration), so with threshold −1 only the sign of the sequence advantage decides
        assert torch.equal(mask.squeeze(1), (sequence >= 0).to(mask.dtype))
        rows = valid.sum(1) > 0
        mean = (token_adv * valid).sum(1)[rows] / valid.sum(1)[rows]
        torch.testing.assert_close(mean, sequence[rows], atol=1e-4, rtol=1e-4)
        signs = (token_adv >= 0) & valid.bool()
        mixed += int(((signs.sum(1) > 0) & (signs.sum(1) < valid.sum(1))).sum())
    assert mixed > 0  # some sequence had tokens of both signs: a token-level mask would have split it
