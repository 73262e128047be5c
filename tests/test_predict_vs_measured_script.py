"""scripts/predict_vs_measured.py and the digest reading of scripts/gym_speedup.py, on cases computed by hand."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


pvm = _load("predict_vs_measured")
speed = _load("gym_speedup")


def test_average_ranks_share_ties():
    assert pvm.average_ranks([10.0, 20.0, 20.0, 30.0]) == [1.0, 2.5, 2.5, 4.0]
    assert pvm.average_ranks([3.0, 1.0, 2.0]) == [3.0, 1.0, 2.0]


def test_spearman_by_hand():
    # no ties: 1 - 6 * sum(d^2) / (n (n^2 - 1)) = 1 - 6 * 4 / 120
    assert pvm.spearman([1, 2, 3, 4, 5], [2, 1, 4, 3, 5]) == pytest.approx(0.8)
    # ties in x: ranks [1, 2.5, 2.5, 4] against [1, 3, 2, 4]: 4.5 / sqrt(4.5 * 5) = 3 / sqrt(10)
    assert pvm.spearman([1, 2, 2, 3], [1, 3, 2, 4]) == pytest.approx(3 / math.sqrt(10))
    assert pvm.spearman([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)
    assert math.isnan(pvm.spearman([1, 1, 1], [1, 2, 3]))


def test_exact_permutation_p_matches_the_table_for_five():
    # rho >= 0.8 for n = 5: identity (1), one adjacent swap (4), two disjoint adjacent swaps (3): 8 of 120
    assert pvm.exact_permutation_p([1, 2, 3, 4, 5], [2, 1, 4, 3, 5]) == pytest.approx(8 / 120)
    assert pvm.exact_permutation_p([1, 2, 3, 4, 5], [1, 2, 3, 4, 5]) == pytest.approx(1 / 120)


def test_monte_carlo_p_and_bootstrap_on_a_perfect_ranking():
    x = [0.2, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 5.0]
    y = [v * v for v in x]
    assert pvm.bootstrap_interval(x, y, resamples=500) == [1.0, 1.0]
    # 1 ordering in 8! = 40320 reaches rho = 1: the estimate is (hits + 1) / (permutations + 1)
    assert pvm.permutation_p(x, y, permutations=2000) < 0.01
    assert pvm.permutation_p(x, [-v for v in y], permutations=2000) == pytest.approx(1.0)


def test_within_family_kendall_by_hand():
    x = [1, 2, 1, 2, 3]
    y = [0.1, 0.2, 0.3, 0.1, 0.2]
    strata = ["a", "a", "b", "b", "b"]
    # a: one concordant pair; b: (1,2) discordant, (1,3) discordant, (2,3) concordant -> (2 - 2) / 4
    assert pvm.within_kendall(x, y, strata) == pytest.approx(0.0)
    assert pvm.within_kendall([1, 2, 3], [1, 2, 3], ["a", "a", "a"]) == pytest.approx(1.0)
    assert pvm.within_permutation_p([1, 2, 3, 4], [1, 2, 3, 4], ["a", "a", "b", "b"], permutations=999) == (
        pytest.approx(0.25, abs=0.05)
    )


def test_page_means_read_the_two_level_table():
    text = (ROOT / "docs/results/gym-tune300/call.md").read_text()
    means = pvm.page_means(text)
    assert means["mrtpo"] == pytest.approx(-0.028) and means["bounded"] == pytest.approx(-0.001)
    means = pvm.page_means((ROOT / "docs/results/gym-tune300/constraints.md").read_text())
    assert (means["mrtpo"], means["bounded"], means["shuffled"]) == (0.105, 0.058, 0.010)


def _digest(rewards: list[float]) -> dict:
    n = len(rewards)
    return {
        "finished": {},
        "per_step": {"step": list(range(1, n + 1)), "reward": rewards, "step_time": [1.0] * n},
        "eval": [],
    }


def test_gym_speedup_reads_digests(tmp_path):
    # gdpo climbs 0 -> 1 over 20 steps; "fast" reaches gdpo's final reward in half the steps
    slow = [i / 19 for i in range(20)]
    fast = [min(1.0, 2 * i / 19) for i in range(20)]
    for policy in (0, 1):
        (tmp_path / f"gdpo-policy{policy}-seed0.json").write_text(json.dumps(_digest(slow)))
        (tmp_path / f"fast-policy{policy}-seed0.json").write_text(json.dumps(_digest(fast)))
    (tmp_path / "notes.md").write_text("ignored")
    found = speed.runs(tmp_path)
    assert sorted(found) == [("fast", 0, 0), ("fast", 1, 0), ("gdpo", 0, 0), ("gdpo", 1, 0)]
    result = speed.speedups(tmp_path, "gdpo", tail=5, window=3)["fast"]
    target = sum(slow[-5:]) / 5  # 0.895
    gdpo_steps = next(i + 1 for i in range(2, 20) if sum(slow[i - 2 : i + 1]) / 3 >= target)
    fast_steps = next(i + 1 for i in range(2, 20) if sum(fast[i - 2 : i + 1]) / 3 >= target)
    assert result["steps"]["mean"] == pytest.approx(gdpo_steps / fast_steps)
    assert result["reward"]["mean"] == pytest.approx(1.0 - target)


def test_the_committed_gym_long_digests_give_the_page_figures():
    measured = pvm.outcomes(ROOT / "docs/results/gym-tune300", ROOT / "docs/results/gym-long-runs")
    assert measured[("gym-long", "oracle")]["speedup"] == pytest.approx(1.10, abs=0.005)
    assert measured[("gym-long", "oracle")]["reward"] == pytest.approx(0.085, abs=0.0005)
    assert measured[("gym-long", "shuffled")]["speedup"] == pytest.approx(0.92, abs=0.005)
    assert measured[("gym-answer", "shuffled")]["reward"] == pytest.approx(0.004)
