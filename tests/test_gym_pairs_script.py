"""scripts/gym_pairs.py: two methods of one bench learn folder paired per (policy, seed), by hand."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "gym_pairs.py"


def run(method, policy, seed, reward):
    return {
        "method": method,
        "policy": policy,
        "seed": seed,
        "final": {"reward": reward},
        "heldout": {"reward_total": {"end": reward / 2}},
        "equal_time": {"value": reward},
    }


def test_pairs_by_policy_and_seed_with_the_two_level_interval(tmp_path):
    runs = []
    for policy, diffs in ((0, [0.1, 0.3]), (1, [0.2, 0.4]), (2, [0.0, 0.2])):
        for seed, d in enumerate(diffs):
            runs += [run("b", policy, seed, 1.0), run("a-1", policy, seed, 1.0 + d)]
    runs.append(run("a-1", 2, 9, 5.0))  # no partner: left out
    (tmp_path / "comparison.json").write_text(json.dumps({"runs": runs}))
    out = tmp_path / "pairs.json"
    r = subprocess.run(
        [sys.executable, str(SCRIPT), str(tmp_path), "--pairs", "a-1:b,a-1:nope", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    (row,) = json.loads(out.read_text())
    # per-policy means 0.2, 0.3, 0.1: mean 0.2, std 0.1, t interval 0.2 ± t(0.975, 2) * 0.1 / sqrt(3)
    assert row["per_policy_mean"] == pytest.approx({"0": 0.2, "1": 0.3, "2": 0.1})
    assert row["mean"] == pytest.approx(0.2) and row["n_pairs"] == 6 and row["positive"] == 5
    half = 4.302652729911275 * 0.1 / 3**0.5
    assert row["ci95_t"] == pytest.approx([0.2 - half, 0.2 + half])
    assert "| a-1 − nope | not run |" in r.stdout


def test_diagnostics_by_hand(tmp_path):
    runs = []
    for method, norms, gini in (("gdpo", [0.5, 2.0, 0.7], 0.0), ("mrtpo", [3.0, 2.0, 0.2], 0.6)):
        folder = tmp_path / f"{method}-policy0-seed0"
        folder.mkdir()
        (folder / "config.yaml").write_text("max_grad_norm: 1.0\n")
        (folder / "metrics.jsonl").write_text(
            "\n".join(
                json.dumps(
                    {"step": i, "grad_norm": n, "credit/r/gini": gini, "credit/r/half_weight_share": 0.5 - gini / 2}
                )
                for i, n in enumerate(norms)
            )
            + "\n"
            + json.dumps({"eval_reward": 1.0})
            + "\n"
        )
        runs.append({**run(method, 0, 0, 1.0), "folder": str(folder)})
    (tmp_path / "comparison.json").write_text(json.dumps({"runs": runs}))
    r = subprocess.run(
        [sys.executable, str(SCRIPT), str(tmp_path), "--diagnostics"], capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 0, r.stderr
    # medians 0.7 and 2.0; one of three steps above 1.0 for gdpo, two of three for mrtpo
    assert f"| {tmp_path.name} | gdpo | 0.70 | 33% | 0.00 | 0.50 |" in r.stdout
    assert f"| {tmp_path.name} | mrtpo | 2.00 | 67% | 0.60 | 0.20 |" in r.stdout
