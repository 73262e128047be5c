"""Contrastive relevance (``mrtpo-contrastive``): each reward's map less its map under a decoy, another
prompt's evidence for that reward. The decoy contexts by hand, the decoy choice, the plan's bases,
the replay of a map against a base other than the original, the weights by hand, and a gym run."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from mrtpo.counterfactual import EvidenceNotFoundError, counterfactual_text, decoy_text
from mrtpo.credit import CreditBatch, CreditConfig, compute_advantages, get_method, js_distance
from mrtpo.model_calls import completion_logits
from mrtpo.replay import ReplayGroup, batch_relevance
from mrtpo.replay_plan import DECOY, EACH, choose_decoys, plan_group, plan_replays
from mrtpo.testing import tiny_policy
from mrtpo.verifiers import Evidence

BRIEF = Evidence("Be brief.", "in_prompt")
LONG = Evidence("Write at length.", "in_prompt")
GOLD = Evidence("42", "privileged")
OTHER_GOLD = Evidence("7", "privileged")
FORMAT = Evidence("Answer in JSON.", "in_prompt")  # the same in every prompt: no decoy exists
HEADER = "Reference:"


def render(messages):
    return "\n".join(f"{m['role']}: {m['content']}" for m in messages) + "\nassistant:"


MESSAGES = [{"role": "system", "content": "You help."}, {"role": "user", "content": "Describe rain. Be brief."}]


def test_decoy_text_by_hand():
    # in_prompt: the own span replaced inside its message, the rest of the prompt untouched
    assert (
        decoy_text(MESSAGES, BRIEF, LONG, render, HEADER)
        == "system: You help.\nuser: Describe rain. Write at length.\nassistant:"
    )
    assert decoy_text("Describe rain. Be brief.", BRIEF, LONG, render) == "Describe rain. Write at length."
    # privileged: the decoy appended where the own evidence would be
    assert (
        decoy_text(MESSAGES, GOLD, OTHER_GOLD, render, HEADER)
        == "system: You help.\nuser: Describe rain. Be brief.\n\nReference:\n7\nassistant:"
    )
    assert decoy_text(MESSAGES, GOLD, OTHER_GOLD, render, HEADER) == counterfactual_text(
        MESSAGES, [OTHER_GOLD], render, HEADER
    )
    with pytest.raises(EvidenceNotFoundError, match="'length'.*does not occur"):
        decoy_text(MESSAGES, LONG, BRIEF, render, verifier="length")


def test_choose_decoys_takes_the_next_prompt_with_a_different_evidence():
    evidences = [
        [BRIEF, FORMAT, GOLD],
        [BRIEF, FORMAT, None],  # same clause as prompt 0: not a decoy for it
        [LONG, FORMAT, OTHER_GOLD],
        [Evidence("Write at length.", "privileged"), FORMAT, GOLD],  # other placement: never a decoy
    ]
    assert choose_decoys(evidences) == [
        [LONG, None, OTHER_GOLD],  # prompt 1 has the same clause, prompt 2 the first different one
        [LONG, None, None],  # no evidence of its own: no decoy
        [BRIEF, None, GOLD],  # cyclic: prompt 3's clause has the wrong placement, prompt 0 is next
        [None, None, OTHER_GOLD],
    ]
    assert choose_decoys([[BRIEF, GOLD]]) == [[None, None]]  # one prompt: nothing to contrast with


def test_the_plan_puts_each_decoy_after_the_own_counterfactuals_with_its_base():
    group = plan_group([0, 1], [BRIEF, None, GOLD], [True, True, True], "contrastive", 3, [LONG, None, OTHER_GOLD])
    assert [(cf.rule, cf.rewards, cf.placement, cf.base) for cf in group.counterfactuals] == [
        (EACH, (0,), "in_prompt", 0),
        (EACH, (2,), "privileged", 0),
        (DECOY, (0,), "privileged", 1),  # the substituted prompt against context 1 (the clause removed)
        (DECOY, (2,), "privileged", 0),  # the decoy appended against the original (no reference)
    ]
    assert group.bases == [0, 0, 1, 0] and group.counterfactuals[2].decoy == LONG
    # an inactive reward skips its own context and its decoy; per_reward alongside adds no second own context
    both = plan_group(
        [0, 1], [BRIEF, None, GOLD], [False, True, True], ("per_reward", "contrastive"), 3, [LONG, None, OTHER_GOLD]
    )
    assert [(cf.rule, cf.rewards) for cf in both.counterfactuals] == [(EACH, (2,)), (DECOY, (2,))]
    assert both.contexts_skipped == 2 and both.skipped == [0]
    # per_reward alone never replays a decoy
    assert all(
        cf.rule == EACH
        for cf in plan_group(
            [0], [BRIEF, None, GOLD], [True] * 3, "per_reward", 3, [LONG, None, OTHER_GOLD]
        ).counterfactuals
    )


def test_scatter_fills_the_decoy_maps_and_counts_their_contexts():
    plan = plan_replays([[0, 1], [2]], [[BRIEF, GOLD], [LONG, OTHER_GOLD]], [2, 3, 1], "contrastive")
    assert plan.counts()["contexts_replayed"] == 8  # 2 groups x (2 own + 2 decoys)

    class Result:
        def __init__(self, maps):
            self.maps, self.entropy = maps, None

    results = [
        Result(torch.arange(4 * 2 * 3, dtype=torch.float32).view(4, 2, 3)),
        Result(torch.arange(4 * 1 * 1, dtype=torch.float32).view(4, 1, 1) + 100),
    ]
    maps = plan.scatter(results, 3)
    assert maps["relevance"].shape == maps["decoy_relevance"].shape == (3, 2, 3)
    torch.testing.assert_close(maps["decoy_relevance"][0:2, 0], results[0].maps[2])  # reward 0's decoy
    torch.testing.assert_close(maps["decoy_relevance"][0:2, 1], results[0].maps[3])
    assert maps["decoy_relevance"][2].tolist() == [[102.0, 0, 0], [103.0, 0, 0]]
    assert maps["has_evidence"].all()


def test_a_decoy_map_is_measured_against_its_base_context():
    """``bases``: the decoy's map is the JS distance between its own context and the base context
    (here the prompt without the clause), exactly as two plain forwards give it."""
    model, tok = tiny_policy(seed=0)

    def ids(text):
        return tok(text, add_special_tokens=False)["input_ids"]

    original, removed, substituted = (
        ids("Describe rain. Be brief.\nassistant:"),
        ids("Describe rain.\nassistant:"),
        ids("Describe rain. Write at length.\nassistant:"),
    )
    completions = torch.tensor([ids(" It falls and falls")[:4], ids(" Drops")[:1] + [0, 0, 0]])
    lengths = torch.tensor([4, 1])
    group = ReplayGroup([original, removed, substituted], ["in_prompt", "privileged"], completions, lengths, [0, 1])
    (result,) = batch_relevance(model, [group])
    for row, n in enumerate(lengths.tolist()):
        logits = {
            name: completion_logits(model, torch.tensor(ctx), completions[row, :n]).unsqueeze(0)
            for name, ctx in (("original", original), ("removed", removed), ("substituted", substituted))
        }
        own = js_distance(logits["original"], logits["removed"])[0]
        decoy = js_distance(logits["substituted"], logits["removed"])[0]
        torch.testing.assert_close(result.maps[0, row, :n], own, atol=2e-5, rtol=1e-4)
        torch.testing.assert_close(result.maps[1, row, :n], decoy, atol=2e-5, rtol=1e-4)
        assert not torch.allclose(decoy, js_distance(logits["substituted"], logits["original"])[0])
    with pytest.raises(ValueError, match="base context index"):
        batch_relevance(model, [ReplayGroup([original, removed], ["in_prompt"], completions, lengths, [2])])


def batch(relevance, decoy):
    rewards = torch.tensor([[1.0], [0.0]])
    return CreditBatch(
        rewards, 2, torch.ones(2, 3), relevance=relevance, decoy_relevance=decoy, has_evidence=torch.tensor([True])
    )


def test_contrastive_weights_by_hand():
    relevance = torch.tensor([[[1.0, 3.0, 0.0]], [[2.0, 2.0, 2.0]]])
    decoy = torch.tensor([[[1.0, 1.0, 2.0]], [[0.0, 0.0, 0.0]]])
    method = get_method("mrtpo-contrastive")
    # row 0: max(r - d, 0) = (0, 2, 0): weights 3 on the middle token; row 1: no decoy reaction, own map (uniform)
    weights = method.weights(batch(relevance, decoy), CreditConfig(lam=1.0))
    torch.testing.assert_close(weights[:, 0], torch.tensor([[0.0, 3.0, 0.0], [1.0, 1.0, 1.0]]), atol=1e-6, rtol=0)
    # the default shape: 0.8 + 0.2 * 3 = 1.4, capped at 1.2 and renormalised
    bounded = method.weights(batch(relevance, decoy), CreditConfig(lam=0.2, w_max=1.2))
    assert bounded[0, 0].max() == pytest.approx(1.2) and bounded[0, 0].mean() == pytest.approx(1.0)
    # the advantages are MRTPO's on the contrasted map; with zero decoy maps they are MRTPO's
    contrasted = batch((relevance - decoy).clamp_min(0), torch.zeros_like(decoy))
    torch.testing.assert_close(
        compute_advantages("mrtpo-contrastive", batch(relevance, decoy)), compute_advantages("mrtpo", contrasted)
    )
    torch.testing.assert_close(
        compute_advantages("mrtpo-contrastive", batch(relevance, torch.zeros_like(decoy))),
        compute_advantages("mrtpo", batch(relevance, None)),
    )
    with pytest.raises(ValueError, match="'mrtpo-contrastive' needs each reward's map under a decoy"):
        compute_advantages("mrtpo-contrastive", batch(relevance, None))


def test_gym_constraints_trains_with_contrastive_credit(tmp_path):
    """Two steps on the gym: every clause has a decoy (another prompt's clause), so the replay runs
    twice the contexts of ``mrtpo``, and the run logs its weights."""
    env = {**os.environ, "MRTPO_CACHE": str(tmp_path / "cache"), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    runs = {}
    for method in ("mrtpo", "mrtpo-contrastive"):
        out = tmp_path / method
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
                "--output-dir",
                str(out),
                "task_args={policy: {steps: 3, batch_size: 8}}",
                f"method={method}",
                "max_steps=2",
                "num_generations=4",
                "per_device_train_batch_size=8",
                "max_completion_length=24",
                "report=false",
                "save_strategy=no",
                "seed=0",
            ],
            env=env,
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert r.returncode == 0, r.stderr[-3000:]
        runs[method] = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    first = {m: next(s for s in steps if "skip/contexts_replayed" in s) for m, steps in runs.items()}
    # the same first generation (same seed, no update yet): each own context, replayed or skipped, has a decoy
    for key in ("skip/contexts_replayed", "skip/contexts_skipped"):
        assert first["mrtpo-contrastive"][key] == 2 * first["mrtpo"][key]
    assert first["mrtpo"]["skip/contexts_replayed"] > 0


def test_explicit_decoys_replace_the_batch_choice():
    plan = plan_replays(
        [[0], [1]],
        [[BRIEF, GOLD], [LONG, OTHER_GOLD]],
        [2, 2],
        "contrastive",
        decoys=[[None, Evidence("9", "privileged")], [None, None]],
    )
    assert [[cf.decoy for cf in g.counterfactuals if cf.rule == DECOY] for g in plan.groups] == [
        [Evidence("9", "privileged")],
        [],
    ]
    # kinds without decoys ignore them
    assert all(
        cf.rule == EACH
        for g in plan_replays([[0]], [[BRIEF, GOLD]], [2], "per_reward", decoys=[[LONG, OTHER_GOLD]]).groups
        for cf in g.counterfactuals
    )


def test_bench_gym_weighs_contrastive_credit_with_the_next_prompts_evidence(tmp_path):
    """``mrtpo bench gym`` gives each prompt the next prompt's evidence as decoys: on gym-answer the
    format rule (the same in every prompt) keeps MRTPO's weights, the per-prompt evidence does not."""
    env = {**os.environ, "MRTPO_CACHE": str(tmp_path / "cache"), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    out = tmp_path / "precision.json"
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "mrtpo.cli",
            "bench",
            "gym",
            "--task",
            "gym-answer",
            "--task-arg",
            "policy={steps: 3, batch_size: 8}",
            "--prompts",
            "3",
            "--group-size",
            "4",
            "--methods",
            "mrtpo,mrtpo-contrastive",
            "--out",
            str(out),
        ],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    rows = json.loads(out.read_text())["rows"]
    same = {row["reward"]: [] for row in rows}
    for row in rows:
        same[row["reward"]].append(row["lift"]["mrtpo"] == pytest.approx(row["lift"]["mrtpo-contrastive"]))
    assert same["format"] and all(same["format"])
    assert not all(same.get("valid", []) + same.get("result", []))
