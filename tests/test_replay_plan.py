"""The one replay plan (:mod:`mrtpo.replay_plan`): which contexts each ``needs`` kind replays, the
skip masks of zero-coefficient rewards, the scatter back to ``(B, K, T)``; a new ``needs`` kind
through the registry and the plan alone; no second context builder; the demo weighs as training."""

from __future__ import annotations

import ast
import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

import mrtpo
import mrtpo.credit.methods as credit_methods
from mrtpo import replay_plan
from mrtpo.credit import (
    DEFAULT_LAM,
    DEFAULT_W_MAX,
    NEEDS,
    CreditBatch,
    CreditConfig,
    compute_advantages,
    get_method,
    register_method,
    relevance_weights,
    reward_coefficients,
    token_advantages,
)
from mrtpo.replay_plan import (
    ALL,
    CONTEXT_RULES,
    ContextRule,
    context_rule,
    group_contexts,
    group_rows,
    needs_evidence,
    plan_group,
    plan_replays,
)
from mrtpo.verifiers import Evidence

BRIEF = Evidence("Be brief.", "in_prompt")
GOLD = Evidence("42", "privileged")
#: reward 0: in-prompt evidence; reward 1: none; reward 2: privileged evidence
EVIDENCES = [BRIEF, None, GOLD]
GROUPS = [[0, 1, 2], [3, 4, 5]]
LENGTHS = [2, 3, 1, 4, 0, 2]
#: group 0: every reward spreads; group 1: only reward 1 (no evidence) spreads, 0 and 2 are constant
REWARDS = torch.tensor(
    [
        [1.0, 0.5, 0.0],
        [0.0, 0.5, 1.0],
        [1.0, 0.5, 0.0],
        [1.0, 0.0, 3.0],
        [1.0, 1.0, 3.0],
        [1.0, 2.0, 3.0],
    ]
)


def nonzero() -> list[list[bool]]:
    return (reward_coefficients(REWARDS, 3) != 0).tolist()


def plan(needs):
    return plan_replays(GROUPS, [EVIDENCES, EVIDENCES], LENGTHS, needs, nonzero())


def test_every_needs_kind_has_a_rule():
    assert set(CONTEXT_RULES) == set(NEEDS)
    with pytest.raises(KeyError, match="no replay rule for needs 'nope'"):
        context_rule("nope")
    assert [needs_evidence(kind) for kind in NEEDS] == [False, True, True, False, True, False]
    assert [CONTEXT_RULES[kind].replays for kind in NEEDS] == [False, True, True, True, True, False]


def test_group_rows_in_first_seen_order():
    assert group_rows(["b", "a", "b", "c", "a"]) == [[0, 2], [1, 4], [3]]


@pytest.mark.parametrize(
    "needs, rewards, placements, entropy",
    [
        ("none", [], [], False),
        ("per_reward", [(0,), (2,)], ["in_prompt", "privileged"], False),  # one per reward with evidence
        ("joint", [(0, 2)], ["in_prompt"], False),  # every reward's evidence at once
        ("entropy", [], [], True),  # the original alone
        (["entropy", "joint", "per_reward"], [(0,), (2,), (0, 2)], ["in_prompt", "privileged", "in_prompt"], True),
    ],
)
def test_contexts_per_needs_kind(needs, rewards, placements, entropy):
    group = plan_group([0, 1], EVIDENCES, [True] * 3, needs, width=2)
    assert [cf.rewards for cf in group.counterfactuals] == rewards
    assert group.placements == placements and group.entropy is entropy
    assert group.replayed is bool(rewards or entropy)
    assert group.skipped == [] and group.contexts_skipped == 0


def test_counterfactual_texts_and_ids_by_hand():
    prompt = "Q? Be brief. Say it."
    ids_of = lambda text: [len(text)]  # noqa: E731
    render = lambda messages: pytest.fail("a string prompt is not rendered")  # noqa: E731
    group = plan_group([0], EVIDENCES, [True] * 3, ["per_reward", "joint"])
    seen = []
    contexts = group_contexts(
        group,
        [7],
        prompt,
        ["brief", "plain", "gold"],
        render,
        lambda text: seen.append(text) or ids_of(text),
        header="REF:",
    )
    assert seen == ["Q? Say it.", "Q? Be brief. Say it.\n\nREF:\n42", "Q? Say it.\n\nREF:\n42"]
    assert contexts == [[7], [10], [29], [19]]


@pytest.mark.parametrize(
    "needs, counts, skipped_group_1, replayed",
    [
        # group 1: rewards 0 and 2 (the ones with evidence) have zero spread, so neither is replayed
        ("per_reward", (3, 3, 2, 2), [True, False, True], [True, False]),
        # joint and entropy need their one map wherever any reward spreads: reward 1 does in group 1
        ("joint", (6, 0, 2, 0), [False] * 3, [True, True]),
        ("entropy", (6, 0, 0, 0), [False] * 3, [True, True]),
    ],
)
def test_zero_coefficient_rewards_are_not_replayed(needs, counts, skipped_group_1, replayed):
    p = plan(needs)
    keys = ("completions_replayed", "completions_skipped", "contexts_replayed", "contexts_skipped")
    assert [g.replayed for g in p.groups] == replayed
    assert p.counts() == dict(zip(keys, counts))
    assert p.skipped().tolist() == [[False] * 3] * 3 + [skipped_group_1] * 3


def test_a_group_where_nothing_spreads_is_skipped_whole():
    rewards = torch.tensor([[1.0, 0.0, 2.0]] * 3)
    active = (reward_coefficients(rewards, 3) != 0).tolist()
    for needs, contexts_skipped in (("per_reward", 2), ("joint", 1), ("entropy", 0)):
        p = plan_replays([[0, 1, 2]], [EVIDENCES], [3, 3, 3], needs, active)
        assert not p.groups[0].replayed and p.counts()["contexts_skipped"] == contexts_skipped
        expected = [[True, False, True]] * 3 if needs == "per_reward" else [[True] * 3] * 3
        assert p.skipped().tolist() == expected


def test_a_group_of_empty_completions_is_not_replayed():
    p = plan_replays([[0, 1]], [EVIDENCES], [0, 0], "per_reward")
    assert not p.groups[0].replayed and p.groups[0].placements == ["in_prompt", "privileged"]
    assert list(p.counts().values()) == [0, 2, 0, 0] and not p.skipped().any()
    assert p.scatter([], width=3)["relevance"].abs().sum() == 0


def test_scatter_back_to_batch_shape():
    p = plan("per_reward")  # group 0 replays rewards 0 and 2 over its 3 positions; group 1 nothing
    maps = torch.arange(1, 19, dtype=torch.float32).view(2, 3, 3)
    out = p.scatter([SimpleNamespace(maps=maps, entropy=None)], width=5)
    assert out["joint_relevance"] is None and out["entropy"] is None
    expected = torch.zeros(6, 3, 5)
    expected[0:3, 0, :3] = maps[0]
    expected[0:3, 2, :3] = maps[1]
    assert torch.equal(out["relevance"], expected)
    assert out["has_evidence"].tolist() == [[True, False, True]] * 3 + [[False] * 3] * 3
    with pytest.raises(ValueError, match="one result per replayed group"):
        p.scatter([], width=5)

    both = plan(["joint", "entropy"])  # both groups: the joint map and the original's entropy
    results = [
        SimpleNamespace(maps=torch.full((1, 3, 3), 1.0), entropy=torch.full((3, 3), 2.0)),
        SimpleNamespace(maps=torch.full((1, 3, 4), 3.0), entropy=torch.full((3, 4), 4.0)),
    ]
    out = both.scatter(results, width=5)
    assert out["relevance"] is None and not out["has_evidence"].any()
    assert out["joint_relevance"].tolist() == [[1.0] * 3 + [0.0] * 2] * 3 + [[3.0] * 4 + [0.0]] * 3
    assert out["entropy"].tolist() == [[2.0] * 3 + [0.0] * 2] * 3 + [[4.0] * 4 + [0.0]] * 3


# --- a new needs kind: one row in the registry, one in the plan --------------------------------

NEW_KIND, NEW_METHOD = "joint_entropy", "test-joint-entropy"


@pytest.fixture
def joint_entropy_method(monkeypatch):
    """A ``needs`` kind that replays the joint counterfactual *and* reads the original's entropy,
    added to the registry's NEEDS and the plan's CONTEXT_RULES only, with a method using it."""
    monkeypatch.setattr(credit_methods, "NEEDS", (*credit_methods.NEEDS, NEW_KIND))
    monkeypatch.setitem(CONTEXT_RULES, NEW_KIND, ContextRule(counterfactuals=ALL, entropy=True))

    @register_method(NEW_METHOD, needs=NEW_KIND, description="GDPO on the joint map times the entropy")
    def _joint_entropy(batch, config):
        n, k = batch.local_rewards().shape
        weights = relevance_weights(batch.joint_relevance * batch.entropy, batch.mask).unsqueeze(1).expand(n, k, -1)
        return token_advantages(
            batch.rewards,
            batch.group_size,
            weights,
            batch.mask,
            config.reward_weights,
            config.batch_norm,
            rows=batch.rows,
        )

    try:
        yield NEW_METHOD
    finally:
        credit_methods._METHODS.pop(NEW_METHOD)


def test_a_new_needs_kind_touches_only_the_registry_and_the_plan(joint_entropy_method, tmp_path):
    from test_trainer import char_code, has_letter_e, make_trainer, plain_length
    from test_trainer_skip import REWARDS as TRAINER_REWARDS, G, synthetic_batch

    assert needs_evidence(NEW_KIND) and context_rule(NEW_KIND).replays
    group = plan_group([0], EVIDENCES, [True] * 3, NEW_KIND)
    assert [cf.rule for cf in group.counterfactuals] == [ALL] and group.entropy
    # the trainer, unchanged, replays what the new kind asks for and the method consumes it
    trainer = make_trainer(
        tmp_path,
        [has_letter_e, char_code, plain_length],
        method=joint_entropy_method,
        per_device_train_batch_size=12,
        num_generations=G,
    )
    inputs, out = synthetic_batch(trainer)
    maps = trainer._replay(inputs, out, reward_coefficients(TRAINER_REWARDS, G))
    assert maps["relevance"] is None and maps["joint_relevance"].shape == maps["entropy"].shape == (12, 7)
    assert trainer._replay_counts["contexts_replayed"] == 3  # group 2 has no spread: neither map
    assert maps["entropy"][:6].abs().sum() > 0 and maps["joint_relevance"][6:9].abs().sum() == 0
    mask = out["completion_mask"].float()
    batch = CreditBatch(TRAINER_REWARDS, G, mask, **{f: maps[f] for f in replay_plan.CREDIT_FIELDS})
    advantages = compute_advantages(joint_entropy_method, batch)
    assert advantages.shape == mask.shape and torch.isfinite(advantages).all()


def test_the_new_kind_is_gone_after_the_test():
    assert NEW_KIND not in CONTEXT_RULES and NEW_KIND not in NEEDS
    with pytest.raises(KeyError):
        get_method(NEW_METHOD)


# --- one context builder -------------------------------------------------------------------------

SRC = Path(mrtpo.__file__).parent
#: Builders of replay contexts and hand-made token weights: only the plan (and the module defining
#: them) may call the first three, only the credit registry the last.
CONTEXT_BUILDERS = {"counterfactual_text", "counterfactual_prompt", "replay_contexts"}
ALLOWED = {"replay_plan.py", "counterfactual.py"}


def builder_calls(path: Path, names: set[str]) -> list[str]:
    """``file:line name`` of each call of one of ``names`` in ``path``, however it was imported
    (a plain name, an alias, or an attribute of an imported module)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    aliases = {
        alias.asname or alias.name: alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
        if alias.name in names
    }
    calls = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        called = (
            aliases.get(func.id, func.id)
            if isinstance(func, ast.Name)
            else func.attr
            if isinstance(func, ast.Attribute)
            else None
        )
        if called in names:
            calls.append(f"{path.name}:{node.lineno} {called}")
    return calls


def test_no_second_context_builder():
    outside = [
        call
        for path in sorted(SRC.rglob("*.py"))
        if path.name not in ALLOWED or path.parent != SRC
        for call in builder_calls(path, CONTEXT_BUILDERS)
    ]
    assert outside == [], "build replay contexts through mrtpo.replay_plan"
    by_hand = [
        call
        for path in sorted(SRC.rglob("*.py"))
        if "credit" not in path.relative_to(SRC).parts
        for call in builder_calls(path, {"relevance_weights"})
    ]
    assert by_hand == [], "weigh tokens through the registered credit method (mrtpo.credit)"


def test_the_guard_sees_aliases_and_attributes(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text(
        "from mrtpo.counterfactual import counterfactual_text as cf\nimport mrtpo.counterfactual as c\n\n"
        "def f(p):\n    cf(p, [], str)\n    c.counterfactual_prompt(p, [], str)\n"
        "    counterfactual_text(p)\n"
    )
    assert builder_calls(probe, CONTEXT_BUILDERS) == [
        "probe.py:5 counterfactual_text",
        "probe.py:6 counterfactual_prompt",
        "probe.py:7 counterfactual_text",
    ]


# --- the demo weighs as training does ----------------------------------------------------------


def test_demo_weights_are_the_registered_methods(tiny_model_dir, tmp_path, one_thread):
    from mrtpo.demo import METHOD, main as demo_main

    out = tmp_path / "demo"
    assert (
        demo_main(
            [
                "--model",
                str(tiny_model_dir),
                "--task",
                "instructions",
                "--index",
                "2",
                "--group-size",
                "3",
                "--max-new-tokens",
                "8",
                "--seed",
                "2",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    record = json.loads((out / "demo.json").read_text())
    assert record["method"] == METHOD == "mrtpo"
    completions = record["completions"]
    k, t = len(record["rewards"]), max(len(c["token_ids"]) for c in completions)
    mask, relevance = torch.zeros(len(completions), t), torch.zeros(len(completions), k, t)
    for j, c in enumerate(completions):
        mask[j, : len(c["token_ids"])] = 1
        relevance[j, :, : len(c["token_ids"])] = torch.tensor(c["relevance"])
    batch = CreditBatch(
        torch.tensor([c["rewards"] for c in completions]),
        len(completions),
        mask,
        relevance=relevance,
        has_evidence=torch.tensor([c["has_evidence"] for c in completions]),
    )
    assert batch.has_evidence.any() and relevance.abs().sum() > 0
    shape = CreditConfig(lam=DEFAULT_LAM, w_max=DEFAULT_W_MAX)  # training's default weight shape
    weights, advantages = get_method(METHOD).weights(batch, shape), compute_advantages(METHOD, batch, shape)
    for j, c in enumerate(completions):
        n = len(c["token_ids"])
        torch.testing.assert_close(torch.tensor(c["weights"]), weights[j, :, :n])
        torch.testing.assert_close(torch.tensor(c["mrtpo_advantage"]), advantages[j, :n])
