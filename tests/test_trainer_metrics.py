"""The trainer's credit metrics, on hand-computed cases (mrtpo.trainer_metrics)."""

import math

import pytest
import torch

from mrtpo.trainer_metrics import credit_metric_keys, credit_metric_sums, credit_sample, top_share_and_set


def test_top_share_and_set_on_a_peaked_and_a_uniform_response():
    share, top = top_share_and_set(torch.tensor([0.0, 0, 0, 0, 0, 0, 0, 0, 0, 10.0]), 10)
    assert share == 1.0 and top == {9}
    share, top = top_share_and_set(torch.ones(20), 20)  # top 10 % of 20 tokens: 2 tokens of 20
    assert share == pytest.approx(0.1) and len(top) == 2


def test_credit_metric_sums_by_hand():
    names = ["a", "b"]
    n = 10
    weights = torch.zeros(2, 2, 12)
    weights[0, 0, 9] = 10.0           # completion 0, reward a: all weight on the last token
    weights[0, 1, :n] = 1.0           # completion 0, reward b: uniform
    weights[1, :, :4] = 1.0           # completion 1: reward a skipped, b uniform over 4 tokens
    relevance = torch.zeros(2, 2, 12)
    relevance[0, 0, :n] = 0.3
    has_evidence = torch.tensor([[True, False], [True, True]])
    skipped = torch.tensor([[False, False], [True, False]])
    sums = credit_metric_sums(weights, [n, 4], names, skipped=skipped, relevance=relevance, has_evidence=has_evidence)
    got = {key: (float(total), int(count)) for key, (total, count) in zip(credit_metric_keys(names), sums)}
    assert got["credit/a/top10_share"] == (1.0, 1)                     # completion 1's a is skipped
    assert got["credit/a/weight_entropy"] == (0.0, 1)                  # one token holds it all
    assert got["credit/a/relevance_mean"] == pytest.approx((0.3, 1))
    assert got["credit/b/top10_share"] == pytest.approx((0.1 + 0.25, 2))  # 1 of 10 tokens; 1 of 4
    assert got["credit/b/weight_entropy"] == pytest.approx((2.0, 2))       # uniform: 1 each
    assert got["credit/b/relevance_mean"] == (0.0, 1)                      # evidence only in completion 1, relevance 0
    # Overlap only where neither reward is skipped: completion 0, {9} vs the uniform's first top token.
    total, count = got["credit/top10_overlap/a~b"]
    assert count == 1 and total in (0.0, 1.0)


def test_credit_metric_sums_skip_empty_completions():
    sums = credit_metric_sums(torch.ones(1, 1, 5), [0], ["a"])
    assert float(sums[:, 1].sum()) == 0


def test_credit_sample_writes_nan_rewards_as_null():
    record = credit_sample(step=3, example_id="x", method="mrtpo", names=["a", "b"], rewards=[1.0, math.nan],
                           token_ids=[5, 6], tokens=["S", "T"], weights=torch.tensor([[1.0, 1.0], [0.5, 1.5]]),
                           advantage=torch.tensor([0.2, -0.1]), relevance=torch.zeros(2, 2))
    assert record["rewards"] == {"a": 1.0, "b": None}
    assert record["weights"]["b"] == [0.5, 1.5] and record["relevance"]["a"] == [0.0, 0.0]
    assert "relevance" not in credit_sample(step=0, example_id="x", method="gdpo", names=["a"], rewards=[0.0],
                                            token_ids=[1], tokens=["t"], weights=torch.ones(1, 1),
                                            advantage=torch.zeros(1))
