"""The trainer's credit metrics, on hand-computed cases (mrtpo.trainer.metrics)."""

import math

import pytest
import torch

from mrtpo.trainer.metrics import credit_metric_keys, credit_metric_sums, credit_sample


def test_top_share_on_a_peaked_and_a_uniform_response():
    peaked = torch.zeros(1, 1, 10)
    peaked[0, 0, 9] = 10.0
    share = credit_metric_sums(peaked, [10], ["a"])[0]
    assert share.tolist() == [1.0, 1.0]
    share = credit_metric_sums(torch.ones(1, 1, 20), [20], ["a"])[0]  # top 10 % of 20 tokens: 2 of 20
    assert share[0] == pytest.approx(0.1) and share[1] == 1


def top_share_and_set(weights, length):
    """Share of a response's total weight on its top 10 % of tokens, and those positions (reference)."""
    top = max(1, math.ceil(0.1 * length))
    w = weights[:length]
    idx = torch.topk(w, top).indices
    total = float(w.sum())
    return (float(w[idx].sum()) / total if total > 0 else 0.0), set(idx.tolist())


def test_credit_metric_sums_by_hand():
    names = ["a", "b"]
    n = 10
    weights = torch.zeros(2, 2, 12)
    weights[0, 0, 9] = 10.0  # completion 0, reward a: all weight on the last token
    weights[0, 1, :n] = 1.0  # completion 0, reward b: uniform
    weights[1, :, :4] = 1.0  # completion 1: reward a skipped, b uniform over 4 tokens
    relevance = torch.zeros(2, 2, 12)
    relevance[0, 0, :n] = 0.3
    has_evidence = torch.tensor([[True, False], [True, True]])
    skipped = torch.tensor([[False, False], [True, False]])
    sums = credit_metric_sums(weights, [n, 4], names, skipped=skipped, relevance=relevance, has_evidence=has_evidence)
    got = {key: (float(total), int(count)) for key, (total, count) in zip(credit_metric_keys(names), sums)}
    assert got["credit/a/top10_share"] == (1.0, 1)  # completion 1's a is skipped
    assert got["credit/a/weight_entropy"] == (0.0, 1)  # one token holds it all
    assert got["credit/a/relevance_mean"] == pytest.approx((0.3, 1))
    assert got["credit/b/top10_share"] == pytest.approx((0.1 + 0.25, 2))  # 1 of 10 tokens; 1 of 4
    assert got["credit/b/weight_entropy"] == pytest.approx((2.0, 2))  # uniform: 1 each
    assert got["credit/b/relevance_mean"] == (0.0, 1)  # evidence only in completion 1, relevance 0
    # Overlap only where neither reward is skipped: completion 0, {9} vs the uniform's first top token.
    total, count = got["credit/top10_overlap/a~b"]
    assert count == 1 and total in (0.0, 1.0)


def test_concentration_and_decile_metrics_by_hand():
    weights = torch.zeros(2, 1, 10)
    weights[0, 0, 3] = 4.0  # completion 0 (4 tokens): all weight on its last token
    weights[1, 0, :10] = 1.0  # completion 1 (10 tokens): uniform
    relevance = torch.zeros(2, 1, 10)
    relevance[0, 0, 3] = 0.5  # the last of 4 tokens: position decile 3 * 10 // 4 = 7
    relevance[1, 0, :10] = 0.2  # one token in each tenth
    sums = credit_metric_sums(
        weights, [4, 10], ["a"], relevance=relevance, has_evidence=torch.ones(2, 1, dtype=torch.bool)
    )
    got = {key: (float(total), int(count)) for key, (total, count) in zip(credit_metric_keys(["a"]), sums)}
    assert got["credit/a/gini"] == pytest.approx((3 / 4 + 0.0, 2))  # (n - 1) / n, then 0
    assert got["credit/a/half_weight_share"] == pytest.approx((1 / 4 + 5 / 10, 2))
    assert got["credit/a/relevance_decile7"] == pytest.approx((1.0 + 0.1, 2))
    assert got["credit/a/relevance_decile0"] == pytest.approx((0.0 + 0.1, 2))
    assert sum(got[f"credit/a/relevance_decile{d}"][0] for d in range(10)) == pytest.approx(2.0)


def test_credit_metric_sums_skip_empty_completions():
    sums = credit_metric_sums(torch.ones(1, 1, 5), [0], ["a"])
    assert float(sums[:, 1].sum()) == 0


def test_credit_sample_writes_nan_rewards_as_null():
    record = credit_sample(
        step=3,
        example_id="x",
        method="mrtpo",
        names=["a", "b"],
        rewards=[1.0, math.nan],
        token_ids=[5, 6],
        tokens=["S", "T"],
        weights=torch.tensor([[1.0, 1.0], [0.5, 1.5]]),
        advantage=torch.tensor([0.2, -0.1]),
        relevance=torch.zeros(2, 2),
    )
    assert record["rewards"] == {"a": 1.0, "b": None}
    assert record["weights"]["b"] == [0.5, 1.5] and record["relevance"]["a"] == [0.0, 0.0]
    assert "relevance" not in credit_sample(
        step=0,
        example_id="x",
        method="gdpo",
        names=["a"],
        rewards=[0.0],
        token_ids=[1],
        tokens=["t"],
        weights=torch.ones(1, 1),
        advantage=torch.zeros(1),
    )


def _loop_reference(weights, lengths, names, skipped, relevance, has_evidence):
    """The metrics one completion and reward at a time, straight from their definitions."""
    sums = {key: [0.0, 0] for key in credit_metric_keys(names)}
    for j, n in enumerate(lengths):
        if n == 0:
            continue
        tops = []
        for i, name in enumerate(names):
            if skipped[j, i]:
                tops.append(None)
                continue
            w = weights[j, i, :n].double()
            share, top = top_share_and_set(w, n)
            tops.append(top)
            p = w / w.sum()
            entropy = float(-(p * p.clamp_min(1e-12).log()).sum()) / math.log(n) if n > 1 else 1.0
            ascending = w.sort().values
            gini = float(sum((2 * (r + 1) - n - 1) * x for r, x in enumerate(ascending.tolist()))) / (
                n * float(w.sum())
            )
            cumulative = w.sort(descending=True).values.cumsum(0)
            half = (int((cumulative < 0.5 * w.sum()).sum()) + 1) / n
            for key, value in (
                (f"credit/{name}/top10_share", share),
                (f"credit/{name}/weight_entropy", entropy),
                (f"credit/{name}/gini", gini),
                (f"credit/{name}/half_weight_share", half),
            ):
                sums[key][0] += value
                sums[key][1] += 1
            if has_evidence[j, i]:
                r = relevance[j, i, :n].double()
                sums[f"credit/{name}/relevance_mean"][0] += float(r.mean())
                sums[f"credit/{name}/relevance_mean"][1] += 1
                for pos in range(n):
                    sums[f"credit/{name}/relevance_decile{pos * 10 // n}"][0] += float(r[pos] / r.sum())
                for d in range(10):
                    sums[f"credit/{name}/relevance_decile{d}"][1] += 1
        for a in range(len(names)):
            for c in range(a + 1, len(names)):
                if tops[a] is not None and tops[c] is not None:
                    key = f"credit/top10_overlap/{names[a]}~{names[c]}"
                    sums[key][0] += len(tops[a] & tops[c]) / len(tops[a] | tops[c])
                    sums[key][1] += 1
    return sums


def test_credit_metric_sums_equal_the_per_completion_definitions_on_random_batches():
    """Continuous random weights (no ties), random lengths (some 0, 1) and skips: the batched sums
    equal the metrics computed one completion and reward at a time."""
    gen = torch.Generator().manual_seed(0)
    names = ["a", "b", "c"]
    for _ in range(5):
        b, t = 9, 23
        weights = torch.rand(b, 3, t, generator=gen) * 3
        relevance = torch.rand(b, 3, t, generator=gen)
        lengths = torch.randint(0, t + 1, (b,), generator=gen).tolist()
        lengths[0], lengths[1] = 0, 1
        skipped = torch.rand(b, 3, generator=gen) < 0.3
        has_evidence = torch.rand(b, 3, generator=gen) < 0.7
        sums = credit_metric_sums(
            weights, lengths, names, skipped=skipped, relevance=relevance, has_evidence=has_evidence
        )
        expected = _loop_reference(weights, lengths, names, skipped, relevance, has_evidence)
        for key, (total, count) in zip(credit_metric_keys(names), sums.tolist()):
            assert count == expected[key][1], key
            assert total == pytest.approx(expected[key][0], rel=1e-9, abs=1e-12), key
