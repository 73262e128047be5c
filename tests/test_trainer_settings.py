"""Every setting the trainer hands to the replay or the credit method reaches the math (issue 42).

Each case trains one step of the tiny random model with one setting at a non-default value and compares
the trainer's ``(B, T)`` advantages with :mod:`credit_reference`: plain forward passes of the same
weights under each context, built by hand from the messages, and the weights and advantages of
docs/design.md#the-algorithm. The reference computed with the setting *dropped* (at its default) must
differ from it by far more than the tolerance, so a setting lost anywhere on its way (config → trainer →
replay / credit config) fails the case. Two rewards carry evidence, one in the prompt and one privileged,
so both sides of every replay are exercised.
"""

import pytest
import torch
from datasets import Dataset

from credit_reference import Batch, Settings, reference_advantages
from mrtpo.rewards import completion_text, evidence
from mrtpo.testing import tiny_policy
from mrtpo.trainer import MRTPOConfig, MRTPOTrainer

ATOL = 2e-4
#: The reference with the setting dropped must differ from the trainer by more than this.
MARGIN = 50 * ATOL
CONSTRAINTS = ["Use the letter e.", "Avoid commas.", "Write in lower case.", "End with a dot."]


@evidence("constraint", placement="in_prompt")
def rule_code(completions, **kwargs):
    """Varies between almost any two random completions; its evidence is the prompt's constraint."""
    return [float(sum(map(ord, completion_text(c))) % 5) for c in completions]


@evidence(lambda row: row["gold"], placement="privileged")
def char_code(completions, **kwargs):
    return [float(sum(map(ord, completion_text(c))) % 7) for c in completions]


def plain_length(completions, **kwargs):
    return [len(completion_text(c)) / 10 for c in completions]


REWARDS = [rule_code, char_code, plain_length]
PLACEMENTS = ["in_prompt", "privileged", None]


def dataset():
    return Dataset.from_list(
        [
            {
                "prompt": [
                    {"role": "system", "content": f"Answer briefly. {constraint}"},
                    {"role": "user", "content": f"Tell me about {topic}."},
                ],
                "constraint": constraint,
                "gold": f"about {topic}",
                "example_id": f"ex{i}",
            }
            for i, (topic, constraint) in enumerate(zip(["cats", "rain", "tea", "maps"], CONSTRAINTS))
        ]
    )


def one_step(tmp_path, rollout_func=None, **settings):
    """One training step (2 prompts × 4 completions); returns the trainer's batch and the rows it came from."""
    model, tok = tiny_policy(seed=0)
    args = MRTPOConfig(
        output_dir=str(tmp_path),
        use_cpu=True,
        bf16=False,
        activation_checkpointing=False,
        report_to=[],
        per_device_train_batch_size=8,
        num_generations=4,
        max_completion_length=8,
        max_steps=1,
        logging_steps=1,
        save_strategy="no",
        learning_rate=1e-3,
        seed=0,
        credit_samples=0,
        **settings,
    )
    trainer = MRTPOTrainer(
        model=model,
        processing_class=tok,
        reward_funcs=REWARDS,
        args=args,
        train_dataset=dataset(),
        rollout_func=rollout_func,
    )
    seen = []
    original = trainer._generate_and_score_completions

    def recorded(inputs):
        out = original(inputs)
        seen.append(
            (
                list(inputs),
                {k: v.clone() if torch.is_tensor(v) else v for k, v in out.items()},
                trainer._last_rewards.clone(),
            )
        )
        return out

    trainer._generate_and_score_completions = recorded
    trainer.train()
    return seen[0]


def reference_batch(inputs, out, rewards, credit_mask=None) -> Batch:
    completion_mask = out["completion_mask"].bool()
    return Batch(
        messages=[row["prompt"] for row in inputs],
        evidence=[[row["constraint"], row["gold"], None] for row in inputs],
        prompt_ids=[ids[keep].tolist() for ids, keep in zip(out["prompt_ids"], out["prompt_mask"].bool())],
        completions=[ids[keep].tolist() for ids, keep in zip(out["completion_ids"], completion_mask)],
        mask=completion_mask.double() if credit_mask is None else credit_mask.double(),
        rewards=rewards,
        group=4,
    )


#: case -> (MRTPOConfig settings, the reference's settings, the reference's settings with it dropped).
#: Most cases use the paper's weight shape (lam 1, no cap), under which a changed map changes every weight.
PAPER = {"lam": 1.0, "w_max": None}
CASES = {
    "temperature": ({"temperature": 0.5, **PAPER}, {"temperature": 0.5, **PAPER}, [{**PAPER}]),
    "relevance_kl": ({"relevance": "kl", **PAPER}, {"relevance": "kl", **PAPER}, [{**PAPER}]),
    "relevance_logratio": ({"relevance": "logratio", **PAPER}, {"relevance": "logratio", **PAPER}, [{**PAPER}]),
    "relevance_top_k": ({"relevance_top_k": 2, **PAPER}, {"top_k": 2, **PAPER}, [{**PAPER}]),
    "lam": ({"lam": 0.6, "w_max": None}, {"lam": 0.6, "w_max": None}, [PAPER, {"w_max": None}]),
    "reward_lam": (
        {"reward_lam": [0.9, 0.1, 0.5], "w_max": None},
        {"reward_lam": [0.9, 0.1, 0.5], "w_max": None},
        [{"w_max": None}, PAPER],
    ),
    "w_max": ({"lam": 1.0, "w_max": 1.3}, {"lam": 1.0, "w_max": 1.3}, [PAPER]),
    "shipped_defaults": ({}, {}, [PAPER, {"w_max": None}]),
    "reward_weights": (
        {"reward_weights": [0.5, 2.0, 1.5], **PAPER},
        {"reward_weights": [0.5, 2.0, 1.5], **PAPER},
        [PAPER],
    ),
    "privileged_header": (
        {"privileged_header": "Hidden answer:", **PAPER},
        {"header": "Hidden answer:", **PAPER},
        [PAPER],
    ),
    "credit_batch_norm": ({"credit_batch_norm": False, **PAPER}, {"batch_norm": False, **PAPER}, [PAPER]),
    **{
        f"method_{m}": ({"method": m, **PAPER}, {"method": m, **PAPER}, [PAPER])
        for m in ("grpo", "gdpo", "contrast", "mrtpo-contrastive", "mrtpo-swapped")
    },
    # the entropy map is the policy's own at the sampling temperature
    "method_entropy": (
        {"method": "entropy", "temperature": 0.5, **PAPER},
        {"method": "entropy", "temperature": 0.5, **PAPER},
        [{"temperature": 0.5, **PAPER}, {"method": "entropy", **PAPER}],
    ),
}


def check_against_reference(inputs, out, rewards, ours: dict, dropped: list[dict], credit_mask=None):
    model, tok = tiny_policy(seed=0)  # the weights the step's batch was generated and replayed with
    batch = reference_batch(inputs, out, rewards, credit_mask)
    expected = reference_advantages(model, tok, batch, Settings(placements=PLACEMENTS, **ours))
    actual = out["advantages"].double()
    assert actual.shape == expected.shape
    torch.testing.assert_close(actual, expected, atol=ATOL, rtol=0)
    for other in dropped:  # the setting matters on this batch: dropping it would fail the comparison above
        without = reference_advantages(model, tok, batch, Settings(placements=PLACEMENTS, **other))
        assert (actual - without).abs().max() > MARGIN, f"this batch cannot tell {ours} from {other}"


@pytest.mark.parametrize("case", list(CASES))
def test_setting_reaches_the_advantages(tmp_path, case):
    config, ours, dropped = CASES[case]
    inputs, out, rewards = one_step(tmp_path, **config)
    assert (rewards[:, :2].view(2, 4, 2).std(1) > 0).all(), "both evidence rewards have spread in both groups"
    check_against_reference(inputs, out, rewards, ours, dropped)


def test_tool_mask_is_the_credit_mask(tmp_path, monkeypatch):
    """TRL's ``tool_mask`` (here an ``env_mask`` from a rollout function: tool-result tokens are 0) is part
    of the credit mask: those tokens get advantage 0, and the weights average 1 over the model's own tokens."""
    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
    env_mask = [[1, 1, 0, 0, 1, 1, 1, 1], [1, 0, 0, 1, 1, 1, 1, 1]] * 4
    lengths = [8, 7, 6, 8, 8, 5, 8, 7]

    def rollout(prompts, trainer):
        tok = trainer.processing_class
        generator = torch.Generator().manual_seed(1)
        completions = [torch.randint(32, 127, (n,), generator=generator).tolist() for n in lengths]
        prompt_ids = [
            tok(tok.apply_chat_template(p, add_generation_prompt=True, tokenize=False), add_special_tokens=False)[
                "input_ids"
            ]
            for p in prompts
        ]
        return {
            "prompt_ids": prompt_ids,
            "completion_ids": completions,
            "logprobs": None,
            "env_mask": [m[:n] for m, n in zip(env_mask, lengths)],
        }

    inputs, out, rewards = one_step(tmp_path, rollout_func=rollout, **PAPER)
    completion_mask = out["completion_mask"].double()
    credit_mask = torch.tensor(env_mask, dtype=torch.float64) * completion_mask
    assert torch.equal(out["tool_mask"].double() * completion_mask, credit_mask)  # TRL carried it as tool_mask
    assert (out["advantages"][credit_mask == 0] == 0).all()
    check_against_reference(inputs, out, rewards, {**PAPER}, [], credit_mask)
    # without the tool mask the tool-result tokens would carry credit
    model, tok = tiny_policy(seed=0)
    unmasked = reference_advantages(
        model, tok, reference_batch(inputs, out, rewards), Settings(placements=PLACEMENTS, **PAPER)
    )
    assert unmasked[(credit_mask == 0) & (completion_mask > 0)].abs().min() > MARGIN
