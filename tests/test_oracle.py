"""The ``oracle`` credit method: a mean-1 mask on the positions the task knows each reward reads, its
shuffled dose-response, where the known positions come from, and training with it on the gym."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from mrtpo.credit import CreditBatch, CreditConfig, get_method
from mrtpo.credit.oracle import oracle_weights
from mrtpo.known_positions import known_position_mask
from mrtpo.replay_plan import context_rule
from mrtpo.tasks import get_task


def test_oracle_weights_by_hand():
    known = torch.tensor([[[0.0, 1.0, 0.0, 0.0]]])  # one response of 4 tokens, the reward read at token 1
    mask = torch.ones(1, 4)
    assert oracle_weights(known, mask, lam=1.0)[0, 0].tolist() == pytest.approx([0, 4, 0, 0])
    # lam 0.5: 0.5 + 0.5 * d / mean(d) with mean(d) = 1/4
    assert oracle_weights(known, mask, lam=0.5)[0, 0].tolist() == pytest.approx([0.5, 2.5, 0.5, 0.5])
    # capped at 2: the other three share the remaining 4 - 2 = 2 in their ratio (equal): 2/3 each
    assert oracle_weights(known, mask, lam=0.5, w_max=2.0)[0, 0].tolist() == pytest.approx([2 / 3, 2, 2 / 3, 2 / 3])
    # padding gets 0; two known tokens of 3 share the mass; a reward with no known token is uniform
    known = torch.tensor([[[1.0, 0.0, 1.0, 0.0, 1.0], [0.0, 0.0, 0.0, 0.0, 0.0]]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0, 0.0]])
    w = oracle_weights(known, mask, lam=1.0)
    assert w[0, 0].tolist() == pytest.approx([1.5, 0, 1.5, 0, 0]) and w[0, 1].tolist() == pytest.approx([1, 1, 1, 0, 0])


def _batch(n=64, k=3, t=12, seed=0):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(3, t + 1, (n,), generator=g)
    mask = (torch.arange(t) < lengths.unsqueeze(1)).float()
    known = torch.zeros(n, k, t)
    for j in range(n):
        for i in range(k):
            for p in torch.randperm(int(lengths[j]), generator=g)[: int(torch.randint(0, 3, (1,), generator=g))]:
                known[j, i, p] = 1.0
    rewards = torch.randint(0, 2, (n, k), generator=g).float()
    return CreditBatch(rewards, 4, mask, known_positions=known)


@pytest.mark.parametrize("lam,w_max,q", [(1.0, None, 0.0), (0.2, 1.2, 0.0), (1.0, None, 0.5), (0.5, 3.0, 0.75)])
def test_oracle_weights_average_one_on_every_response(lam, w_max, q):
    batch = _batch()
    w = get_method("oracle").weights(batch, CreditConfig(lam=lam, w_max=w_max, oracle_shuffle=q))
    valid = batch.mask.bool().unsqueeze(1).expand_as(w)
    assert (w[~valid] == 0).all()
    means = (w * batch.mask.unsqueeze(1)).sum(-1) / batch.mask.sum(-1, keepdim=True)
    assert torch.allclose(means, torch.ones_like(means), atol=1e-5)
    if w_max is not None:
        assert w.max() <= w_max + 1e-5


def test_q0_is_the_oracle_and_q_moves_that_share_of_the_mask():
    batch = _batch(n=400, k=1, t=10, seed=1)
    lengths = batch.mask.sum(-1)
    oracle = get_method("oracle").weights(batch, CreditConfig(lam=1.0, w_max=None))
    known = batch.known_positions[:, 0]
    has = known.sum(-1) > 0
    # q = 0: the mask itself, normalised (T / |S| on the known tokens, 0 elsewhere); no known token: uniform
    expected = torch.where(has.unsqueeze(1), known * (lengths / known.sum(-1).clamp_min(1)).unsqueeze(1), batch.mask)
    assert torch.allclose(oracle[:, 0], expected)
    q = 0.5
    mixed = get_method("oracle").weights(batch, CreditConfig(lam=1.0, w_max=None, oracle_shuffle=q))[:, 0]
    # the share of each response's weight left on its known tokens is (1 - q) plus what the shuffle puts back
    share = (mixed * known).sum(-1) / lengths
    assert (share[has] >= 1 - q - 1e-5).all()
    # in expectation the shuffle puts back |S| / T of its share: mean share = (1 - q) + q * E[|S| / T]
    back = float((known.sum(-1) / lengths)[has].mean())
    assert float(share[has].mean()) == pytest.approx((1 - q) + q * back, abs=0.03)
    assert share[has].mean() < 0.8  # far from the oracle's 1: the shuffle did move mass
    # lam 1, no cap: exactly (1 - q) * oracle + q * (the oracle of the permuted mask)
    shuffled_part = (mixed - (1 - q) * oracle[:, 0]) / q
    assert torch.allclose((shuffled_part * batch.mask).sum(-1), lengths, atol=1e-4)
    assert (shuffled_part > -1e-5).all()


def test_oracle_advantages_average_to_gdpo_and_need_known_positions():
    batch = _batch()
    adv = get_method("oracle")(batch, CreditConfig(lam=1.0, w_max=None))
    gdpo = get_method("gdpo")(batch, CreditConfig())
    lengths = batch.mask.sum(-1)
    assert torch.allclose(adv.sum(-1) / lengths, gdpo.sum(-1) / lengths, atol=1e-4)  # credit is moved, not made
    assert not torch.allclose(adv, gdpo)
    assert context_rule("oracle").known and not context_rule("oracle").replays
    with pytest.raises(ValueError, match="known relevant positions"):
        get_method("oracle")(CreditBatch(batch.rewards, 4, batch.mask), CreditConfig())


def test_known_positions_from_gym_ground_truth_and_from_checked_spans():
    from mrtpo.gym.vocab import gym_tokenizer

    task = get_task("gym-constraints")
    ex = task.load("train", 1)[0]
    verifiers = task.verifiers()
    tok = gym_tokenizer()
    words = ex.gold["topic"] * 3
    text = " ".join(words)
    ids = tok(text, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    mask = known_position_mask(verifiers, [ex], [text], [ids], width=12, tokenizer=tok)
    for k, v in enumerate(verifiers):  # the verifier's own positions, the end-of-turn token included
        assert mask[0, k].nonzero().flatten().tolist() == [p for p in v.positions(words, ex) if p < 12]
    # a special token the policy emitted mid-response is not a word: later words sit one token further
    start = tok.convert_tokens_to_ids("<|im_start|>")
    shifted = known_position_mask(verifiers, [ex], [text], [ids[:2] + [start] + ids[2:]], width=12, tokenizer=tok)
    for k, v in enumerate(verifiers):
        assert shifted[0, k].nonzero().flatten().tolist() == [
            p + (p >= 2) for p in v.positions(words, ex) if p + (p >= 2) < 12
        ]

    class Plain:  # a reward known only through its task's checked spans
        name = "c1"

    def spans_of(example, text):  # the second word's characters and the last character of the third
        second = text.index(words[1])
        third = text.index(words[2], second + len(words[1]))
        return [("c1", "kind", [(second, second + len(words[1])), (third + len(words[2]) - 1, third + len(words[2]))])]

    mask = known_position_mask([Plain()], [ex], [text], [ids], width=len(ids), tokenizer=tok, spans_of=spans_of)
    assert mask[0, 0].nonzero().flatten().tolist() == [1, 2]


def test_train_with_the_oracle_on_the_gym(tmp_path):
    env = {**os.environ, "MRTPO_CACHE": str(tmp_path / "cache"), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    out = tmp_path / "run"
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "mrtpo.cli",
            "train",
            "--task",
            "gym-constraints",
            "--model",
            "gym",
            "--method",
            "oracle",
            "--output-dir",
            str(out),
            "task_args={policy: {steps: 3, batch_size: 8}}",
            "lam=1.0",
            "w_max=null",
            "max_steps=2",
            "num_generations=4",
            "per_device_train_batch_size=8",
            "max_completion_length=24",
            "credit_samples=8",
            "report=false",
            "save_strategy=no",
        ],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    task = get_task("gym-constraints")
    examples = {e.id: e for e in task.load("train")}
    samples = [json.loads(line) for line in (out / "credit_samples.jsonl").read_text().splitlines()]
    assert samples and all(s["method"] == "oracle" for s in samples)
    checked = 0
    specials = ("<|im_end|>", "<|endoftext|>", "<|im_start|>", "[UNK]")
    for s in samples:  # the trained weights are the mask of the task's ground truth, normalised
        n = len(s["tokens"])
        at = [t for t, token in enumerate(s["tokens"]) if token not in specials]  # the words' token indices
        words = [s["tokens"][t] for t in at]
        at.append(at[-1] + 1 if at else 0)  # the end of turn: the token after the last word
        truth = task.relevant_positions(examples[s["example_id"]], words)
        for name, weights in s["weights"].items():
            positions = [at[p] for p in truth[name] if at[p] < n]
            expected = [n / len(positions) if t in positions else 0.0 for t in range(n)] if positions else [1.0] * n
            assert weights == pytest.approx(expected, abs=1e-4), (name, s["tokens"])
            checked += bool(positions)
    assert checked > 0
