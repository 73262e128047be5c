"""``mrtpo.bench.learn.stats``: steps to target, curves over seeds, confidence intervals and paired
tests, the two-level interval over policies and seeds and the value at equal training seconds, on
hand-made records and hand-computed values (closed forms of Student's t for 1 and 2 degrees of
freedom, printed t tables, an exhaustively enumerated bootstrap), cross-checked against scipy's
own tests."""

import itertools
import math

import numpy as np
import pytest

from mrtpo.bench.learn.stats import (
    aggregate_curves,
    describe,
    paired_comparison,
    shared_samples,
    sign_flip_p_value,
    steps_to_target,
    summarise_steps_to_target,
    t_quantile,
    tail_mean,
    training_seconds,
    two_level_interval,
    value_at_seconds,
)

# --------------------------------------------------------------------------------------------
# Steps to target, aggregation (hand-computed).
# --------------------------------------------------------------------------------------------
FIXTURE = [
    {"step": 1, "loss": 0.1, "reward": 0.5},
    {"step": 2, "loss": 0.1, "reward": 1.0},
    {"step": 2, "eval_loss": 9.0, "reward": 99.0},  # an eval line: ignored
    {"step": 3, "loss": 0.1, "reward": 2.6},
    {"step": 4, "loss": 0.1, "reward": float("nan")},  # not finite: ignored
    {"step": 5, "loss": 0.1, "reward": 2.4},
    {"step": 6, "loss": 0.1, "reward": 2.8, "rewards/result/mean": 1.0},
    {"step": 6, "train_runtime": 12.0, "reward": 50.0},  # the end-of-training summary: ignored
]


def test_steps_to_target_on_a_hand_made_metrics_file():
    assert steps_to_target(FIXTURE, 2.5) == 3  # first logged step with reward >= 2.5
    assert steps_to_target(FIXTURE, 1.0) == 2  # >= is inclusive
    assert steps_to_target(FIXTURE, 0.0) == 1
    assert steps_to_target(FIXTURE, 2.7) == 6
    assert steps_to_target(FIXTURE, 3.0) is None  # never: the 50.0 and 99.0 lines do not count
    # Trailing mean over 2 logged values: 0.5, 0.75, 1.8, (nan skipped) 2.5, 2.6 -> 2.5 first at step 5.
    assert steps_to_target(FIXTURE, 2.5, window=2) == 5
    # Over 3: 0.5, 0.75, 1.367, 2.0, 2.6 -> step 6.
    assert steps_to_target(FIXTURE, 2.5, window=3) == 6
    assert steps_to_target(FIXTURE, 1.0, key="rewards/result/mean") == 6
    assert steps_to_target(FIXTURE, 0.0, key="rewards/absent/mean") is None
    with pytest.raises(ValueError, match="window"):
        steps_to_target(FIXTURE, 1.0, window=0)


def test_steps_to_target_summary_counts_only_seeds_that_reached_it():
    s = summarise_steps_to_target({0: 3, 1: None, 2: 4}, max_steps=8)
    assert s["reached"] == 2 and s["of"] == 3 and s["mean"] == 3.5
    assert s["text"] == "3.5 (2/3 seeds; 1 not reached within 8 steps)"
    assert s["per_seed"] == {"0": 3, "1": None, "2": 4}
    none = summarise_steps_to_target({0: None, 1: None}, max_steps=4)
    assert none["mean"] is None and none["text"] == "not reached (0/2 seeds within 4 steps)"
    assert summarise_steps_to_target({0: 2, 1: 5})["text"] == "3.5 (2/2 seeds)"


def test_aggregate_curves_mean_min_max_per_step():
    agg = aggregate_curves({0: ([1, 2, 3], [1.0, 2.0, 3.0]), 1: ([1, 2], [3.0, float("nan")]), 2: ([2], [5.0])})
    assert agg["steps"] == [1, 2, 3]
    assert agg["mean"] == [2.0, 3.5, 3.0] and agg["min"] == [1.0, 2.0, 3.0] and agg["max"] == [3.0, 5.0, 3.0]
    assert agg["n"] == [2, 2, 1]


def test_shared_samples_on_hand_made_batches():
    ref = [["a", "b", "c", "d"], ["e", "f", "g", "h"], ["i", "j", "k", "l"]]
    got = shared_samples(ref, [["a", "b", "c", "d"], ["e", "x", "g", "y"], ["z", "z", "z", "z"]])
    assert got["per_batch"] == [1.0, 0.5, 0.0]
    assert got["share"] == pytest.approx(6 / 12) and got["compared"] == 12
    assert got["first_different"] == 1
    same = shared_samples(ref, ref)
    assert same["share"] == 1.0 and same["first_different"] is None
    # A shorter run is compared over the batches both have.
    assert shared_samples(ref, ref[:1]) == {"share": 1.0, "compared": 4, "per_batch": [1.0], "first_different": None}
    assert shared_samples([], [])["share"] is None


def test_tail_mean_of_the_last_finite_values():
    assert tail_mean([1.0, float("nan"), 2.0, 4.0], 2) == 3.0
    assert tail_mean([5.0], 3) == 5.0
    assert tail_mean([float("nan")], 3) is None


# --------------------------------------------------------------------------------------------
# Confidence intervals and paired tests.
# --------------------------------------------------------------------------------------------
def test_t_quantile_matches_closed_forms_and_the_printed_table():
    # df = 1 (Cauchy): tan(pi (p - 1/2)); df = 2: (2p - 1) sqrt(2 / (4 p (1 - p))).
    assert t_quantile(0.975, 1) == pytest.approx(math.tan(math.pi * 0.475), rel=1e-9)  # 12.706
    assert t_quantile(0.975, 2) == pytest.approx(0.95 * math.sqrt(2 / (4 * 0.975 * 0.025)), rel=1e-9)  # 4.303
    assert t_quantile(0.975, 3) == pytest.approx(3.182, abs=5e-4)  # t tables
    assert t_quantile(0.975, 30) == pytest.approx(2.042, abs=5e-4)


def test_describe_gives_mean_std_and_a_student_t_interval():
    d = describe([1.0, 2.0, 3.0, 4.0, float("nan"), None])
    assert (d["n"], d["mean"], d["min"], d["max"]) == (4, 2.5, 1.0, 4.0)
    assert d["std"] == pytest.approx(math.sqrt(5 / 3))
    half = 3.182446305284263 * math.sqrt(5 / 3) / 2  # t(0.975, 3) * s / sqrt(n)
    assert d["ci95"] == pytest.approx([2.5 - half, 2.5 + half])
    one = describe([7.0])
    assert one["mean"] == 7.0 and one["std"] is None and one["ci95"] is None  # no spread to use
    assert describe([])["mean"] is None and describe([])["n"] == 0


def test_paired_comparison_by_hand():
    # Differences 1, 2, 3 (seed 9 only on one side, seed 4 not finite: both left out).
    method = {0: 2.0, 1: 4.0, 2: 6.0, 9: 1.0, 4: float("nan")}
    reference = {0: 1.0, 1: 2.0, 2: 3.0, 4: 0.0}
    c = paired_comparison(method, reference)
    assert c["seeds"] == ["0", "1", "2"] and c["n"] == 3
    assert c["mean_difference"] == 2.0 and c["std_difference"] == pytest.approx(1.0)
    t = 2 / (1 / math.sqrt(3))
    assert c["t"] == pytest.approx(t) and c["df"] == 2
    assert c["p_value"] == pytest.approx(1 - t / math.sqrt(2 + t * t))  # two-sided, closed form for df = 2
    half = 0.95 * math.sqrt(2 / (4 * 0.975 * 0.025)) / math.sqrt(3)
    assert c["ci95"] == pytest.approx([2 - half, 2 + half])
    # Sign flips of (1, 2, 3): sums 6, 4, 2, 0, 0, -2, -4, -6; |sum| >= 6 in 2 of 8.
    assert c["p_sign_flip"] == 0.25


def test_paired_comparison_without_spread_or_pairs():
    same = paired_comparison({0: 2.0, 1: 3.0}, {0: 1.0, 1: 2.0})  # both differences are 1
    assert same["mean_difference"] == 1.0 and same["t"] is None and same["p_value"] is None
    assert same["p_sign_flip"] == 0.5  # (+1, +1) and (-1, -1) of 4 patterns
    single = paired_comparison({0: 2.0}, {0: 1.0})
    assert single["n"] == 1 and single["ci95"] is None and single["p_value"] is None
    assert single["p_sign_flip"] == 1.0
    empty = paired_comparison({0: 1.0}, {1: 1.0})
    assert empty["n"] == 0 and empty["mean_difference"] is None and empty["p_sign_flip"] is None


def test_sign_flip_p_value_edges():
    assert sign_flip_p_value([0.0, 0.0, 0.0]) == 1.0  # every pattern ties with the observed 0
    assert sign_flip_p_value([1.0, -1.0]) == 1.0
    assert sign_flip_p_value([0.5] * 5) == pytest.approx(2 / 32)
    assert sign_flip_p_value([1.0] * 17) is None  # beyond the exact enumeration


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_paired_comparison_agrees_with_scipy(seed):
    stats = pytest.importorskip("scipy.stats")
    rng = np.random.default_rng(seed)
    ref = rng.normal(1.0, 0.5, size=6)
    meth = ref + rng.normal(0.3, 0.4, size=6)
    c = paired_comparison(dict(enumerate(meth.tolist())), dict(enumerate(ref.tolist())))
    t = stats.ttest_rel(meth, ref)
    assert c["t"] == pytest.approx(t.statistic) and c["p_value"] == pytest.approx(t.pvalue)
    ci = t.confidence_interval(0.95)
    assert c["ci95"] == pytest.approx([ci.low, ci.high])
    perm = stats.permutation_test(
        (meth, ref),
        lambda x, y: np.mean(x - y),
        permutation_type="samples",
        alternative="two-sided",
        n_resamples=10_000,
    )  # 2^6 = 64 < n: exact
    assert c["p_sign_flip"] == pytest.approx(perm.pvalue)


# --------------------------------------------------------------------------------------------
# Two levels: policies, then seeds within each policy.
# --------------------------------------------------------------------------------------------
TABLE = {"A": [1.0, 2.0, 3.0], "B": [0.0, 0.5, 1.0]}  # paired differences, 2 policies x 3 seeds


def test_two_level_interval_by_hand():
    c = two_level_interval({**TABLE, "C": [float("nan")]})  # a policy without a finite pair is left out
    assert c["policies"] == ["A", "B"] and (c["n_policies"], c["n_pairs"], c["positive"]) == (2, 6, 5)
    assert c["per_policy_mean"] == {"A": 2.0, "B": 0.5} and c["mean"] == 1.25
    between = 1.5 / math.sqrt(2)  # sample std of (2, 0.5)
    assert c["between_policy_std"] == pytest.approx(between)
    assert c["within_policy_std"] == pytest.approx(math.sqrt((2 + 0.5) / 4))  # SS 2 and 0.5 over 2 + 2 df
    t975 = math.tan(math.pi * 0.475)  # t(0.975, 1) in closed form: 12.706...
    half = t975 * between / math.sqrt(2)
    assert c["ci95_t"] == pytest.approx([1.25 - half, 1.25 + half]) and c["df"] == 1
    t = 1.25 / (between / math.sqrt(2))
    assert c["t"] == pytest.approx(5 / 3) and c["p_value"] == pytest.approx(1 - 2 / math.pi * math.atan(t))


def test_two_level_bootstrap_matches_the_enumerated_bootstrap_and_is_reproducible():
    c = two_level_interval(TABLE)
    # Every outcome of the two-stage bootstrap, equally likely: 2 slots x (a policy, then 3 of its seeds).
    outcomes = sorted(
        (sum(a) / 3 + sum(b) / 3) / 2
        for first, second in itertools.product(TABLE.values(), repeat=2)
        for a in itertools.product(first, repeat=3)
        for b in itertools.product(second, repeat=3)
    )
    exact = np.quantile(outcomes, [0.025, 0.975])
    low, high = c["ci95_bootstrap"]
    assert low < 1.25 < high and (low, high) == pytest.approx(exact, abs=0.08)  # support steps are 1/12
    assert two_level_interval(TABLE)["ci95_bootstrap"] == c["ci95_bootstrap"]  # fixed RNG seed
    # No seed noise: the bootstrap only draws policies, means 2 / 1.25 / 1.25 / 0.5 with 1/4 each.
    flat = two_level_interval({"A": [2.0, 2.0], "B": [0.5, 0.5]})
    assert flat["ci95_bootstrap"] == [0.5, 2.0] and flat["within_policy_std"] == 0.0


def test_two_level_interval_needs_two_policies_and_a_spread():
    one = two_level_interval({"A": [1.0, 2.0, 3.0]})
    assert one["mean"] == 2.0 and one["within_policy_std"] == pytest.approx(1.0)
    assert one["ci95_t"] is None and one["ci95_bootstrap"] is None and one["between_policy_std"] is None
    same = two_level_interval({"A": [1.0], "B": [1.0]})
    assert same["between_policy_std"] == 0.0 and same["t"] is None and same["within_policy_std"] is None


# --------------------------------------------------------------------------------------------
# Equal wall-clock: a run's value after a number of training seconds.
# --------------------------------------------------------------------------------------------
TIMED = [{"step": s, "step_time": float(s), "reward": 10.0 * s} for s in (1, 2, 3, 4)]  # cumulative 1, 3, 6, 10 s


def test_value_at_seconds_takes_the_last_step_within_the_budget():
    assert training_seconds(TIMED) == ([1, 2, 3, 4], [1.0, 3.0, 6.0, 10.0])
    at = value_at_seconds(TIMED, "reward", 7.0, tail=2)
    assert at == {"step": 3, "seconds": 6.0, "value": 25.0, "ran_out": False}  # mean of steps 2 and 3
    assert value_at_seconds(TIMED, "reward", 10.0, tail=1) == {
        "step": 4,
        "seconds": 10.0,
        "value": 40.0,
        "ran_out": False,
    }  # exactly its own length
    assert value_at_seconds(TIMED, "reward", 50.0, tail=1)["ran_out"] is True  # ended before the budget
    assert value_at_seconds(TIMED, "reward", 0.5, tail=1) is None  # not even one step


def test_without_a_time_for_every_step_there_is_no_equal_time_value():
    gap = [r for r in TIMED if r["step"] != 2]  # logging_steps > 1: step 2's time is unknown
    assert training_seconds(gap) is None and value_at_seconds(gap, "reward", 5.0, 1) is None
    assert training_seconds([{"step": 1, "reward": 1.0}]) is None
