"""scripts/gym_pairs.py: two methods of one bench learn folder paired per (policy, seed), by hand."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "gym_pairs.py"


def run(method, policy, seed, reward):
    return {"method": method, "policy": policy, "seed": seed, "final": {"reward": reward},
            "heldout": {"reward_total": {"end": reward / 2}}, "equal_time": {"value": reward}}


def test_pairs_by_policy_and_seed_with_the_two_level_interval(tmp_path):
    runs = []
    for policy, diffs in ((0, [0.1, 0.3]), (1, [0.2, 0.4]), (2, [0.0, 0.2])):
        for seed, d in enumerate(diffs):
            runs += [run("b", policy, seed, 1.0), run("a-1", policy, seed, 1.0 + d)]
    runs.append(run("a-1", 2, 9, 5.0))  # no partner: left out
    (tmp_path / "comparison.json").write_text(json.dumps({"runs": runs}))
    out = tmp_path / "pairs.json"
    r = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path), "--pairs", "a-1:b,a-1:nope", "--json", str(out)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    (row,) = json.loads(out.read_text())
    # per-policy means 0.2, 0.3, 0.1: mean 0.2, std 0.1, t interval 0.2 ± t(0.975, 2) * 0.1 / sqrt(3)
    assert row["per_policy_mean"] == pytest.approx({"0": 0.2, "1": 0.3, "2": 0.1})
    assert row["mean"] == pytest.approx(0.2) and row["n_pairs"] == 6 and row["positive"] == 5
    half = 4.302652729911275 * 0.1 / 3 ** 0.5
    assert row["ci95_t"] == pytest.approx([0.2 - half, 0.2 + half])
    assert "| a-1 − nope | not run |" in r.stdout
