"""The report of real runs: a 4-step MRTPO run (held-out evaluation every 2 steps) and a 3-step GDPO
run of the tiny random model on an own task with a {0,1} reward, a graded one and a constant one
(never any spread), every completion of each step saved as a credit sample. Checked against the run's own
files: the sample steps against the metrics' steps, the skipped rewards against the sampled
groups' values, and ``mrtpo report --compare`` drawing both runs."""

import json
import re
import statistics
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from mrtpo.report.build import make_report
from mrtpo.report.command import main as report_main
from mrtpo.report.curves import band_rule, load_metrics, plot_runs, step_records
from mrtpo.report.samples import load_credit_samples, pick_samples

REWARDS = """
from mrtpo import evidence


@evidence("rule")
def even(prompts, completions, **kwargs):
    return [float(len(c) % 2 == 0) for c in completions]


def graded(prompts, completions, **kwargs):
    return [sum(ch in "aeiou" for ch in c) / max(1, len(c)) for c in completions]


def constant(prompts, completions, **kwargs):
    return [1.0 for _ in completions]
"""

TASK = """task:
  dataset: prompts.jsonl
  prompt: prompt
  eval_fraction: 0.34
  rewards:
    rewards.py:even: 1.0
    rewards.py:graded: 1.0
    rewards.py:constant: 1.0
num_generations: 4
per_device_train_batch_size: 8
max_completion_length: 12
logging_steps: 1
save_steps: 100
report_to: none
eval_strategy: steps
eval_steps: 2
eval_size: 2
credit_samples: 8
report: false
"""
GROUP = 4


@pytest.fixture(scope="module")
def runs(tiny_dir, tmp_path_factory):
    from mrtpo.train import main

    root = tmp_path_factory.mktemp("report-runs")
    task = root / "task"
    task.mkdir()
    rows = [
        {"prompt": f"Say something about item {i}. Do not use the letter z.", "rule": "Do not use the letter z."}
        for i in range(6)
    ]
    (task / "prompts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (task / "rewards.py").write_text(REWARDS)
    (task / "config.yaml").write_text(TASK)
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        out = {}
        for method, seed, steps, evaluate in (("mrtpo", 0, 4, "steps"), ("gdpo", 1, 3, "no")):
            out[method] = root / method
            assert (
                main(
                    [
                        "--config",
                        str(task / "config.yaml"),
                        "--model",
                        str(tiny_dir),
                        "--method",
                        method,
                        "--output-dir",
                        str(out[method]),
                        "--max-steps",
                        str(steps),
                        f"seed={seed}",
                        f"eval_strategy={evaluate}",
                    ]
                )
                == 0
            )
    finally:
        torch.set_num_threads(before)
    make_report(out["mrtpo"], samples=2)
    return out


def test_sample_steps_are_the_curves_steps(runs):
    """Each step's credit samples are the whole batch: their mean reward is the metrics line of the
    step the report shows them under (tag + 1), for every step of both runs."""
    for run in runs.values():
        records = load_metrics(run)
        logged = {int(r["step"]): r for r in step_records(records)}
        samples = load_credit_samples(run / "credit_samples.jsonl")
        tags = sorted({s["step"] for s in samples})
        assert [t + 1 for t in tags] == sorted(logged) == list(range(1, len(tags) + 1)) and len(tags) >= 3
        for tag in tags:
            batch = [s for s in samples if s["step"] == tag]
            assert len(batch) == 8
            for name in ("even", "graded"):
                assert statistics.mean(s["rewards"][name] for s in batch) == pytest.approx(
                    logged[tag + 1][f"rewards/{name}/mean"], abs=1e-6
                )
    html = (runs["mrtpo"] / "report.html").read_text()
    shown = [int(h) for h in re.findall(r"<h3>step (\d+)</h3>", html)]
    titles = [int(h) for h in re.findall(r"<h3>step (\d+) · mrtpo · ", html)]
    assert shown[0] == 1 and set(shown) <= {1, 2, 3, 4} and set(titles) == set(shown)


def test_skipped_rewards_are_the_groups_without_spread(runs):
    """``no_spread`` of each sample is the rewards whose 4 values in its group are all equal
    (computed here from the samples), the constant reward always; the report labels those rows."""
    run = runs["mrtpo"]
    samples = load_credit_samples(run / "credit_samples.jsonl")
    for tag in sorted({s["step"] for s in samples}):
        batch = [s for s in samples if s["step"] == tag]
        for g in range(0, len(batch), GROUP):
            group = batch[g : g + GROUP]
            assert len({s["example_id"] for s in group}) == 1
            flat = {n for n in ("even", "graded", "constant") if len({s["rewards"][n] for s in group}) == 1}
            assert "constant" in flat
            assert all(set(s["no_spread"]) == flat for s in group)
    html = (run / "report.html").read_text()
    cards = html.split("<div class='card'>")[1:]
    assert cards and all(
        "<div class='row skipped'><div class='label'><b>constant</b><small class='skip'>skipped "
        "(no spread)</small>" in c
        for c in cards
    )
    md = (run / "report.md").read_text()
    assert "- `constant` skipped (no spread)" in md


def test_the_same_prompt_at_the_first_and_the_latest_step_that_sampled_it(runs):
    samples = load_credit_samples(runs["mrtpo"] / "credit_samples.jsonl")
    first = [s["example_id"] for s in samples if s["step"] == 0]
    later = [t for t in (3, 2, 1) if any(s["example_id"] in first for s in samples if s["step"] == t)]
    shown = pick_samples(samples, 2)
    if later:  # the prompt shown first comes back under the latest such step (numbered as the curves)
        assert shown[1].step == later[0] + 1
        assert {r["example_id"] for r in shown[0].records} == {r["example_id"] for r in shown[1].records}
    else:
        assert shown[1].note.startswith("no prompt sampled at step 1 was sampled again")


def test_even_is_read_as_a_proportion_over_the_batch(runs):
    rule = band_rule(load_metrics(runs["mrtpo"]), {}, load_credit_samples(runs["mrtpo"] / "credit_samples.jsonl"))
    assert rule.binary == {"even"} and rule.n_hint == 8
    md = (runs["mrtpo"] / "report.md").read_text()
    assert "| even ({0,1}) |" in md and "(Wilson, n=8)" in md and "## Held-out evaluation" in md
    assert "| eval_rewards/even/mean |" in md


def _pixels(png: Path, rgb: tuple[int, int, int]) -> int:
    a = np.asarray(Image.open(png).convert("RGB"))
    return int((a == np.array(rgb, dtype=np.uint8)).all(-1).sum())


def test_compare_draws_both_runs_on_one_figure(runs, tmp_path, capsys):
    out = tmp_path / "cmp" / "gdpo-vs-mrtpo.html"
    assert report_main(["--compare", str(runs["gdpo"]), str(runs["mrtpo"]), "--output", str(out)]) == 0
    printed = capsys.readouterr().out
    assert f"{out}" in printed and f"{out.with_suffix('.png')}" in printed
    html = out.read_text()
    assert "gdpo · gdpo" in html and "mrtpo · mrtpo" in html and "data:image/png;base64," in html
    png = out.with_suffix(".png")
    # one colour per run: matplotlib's first two cycle colours, each drawing many pixels
    assert _pixels(png, (0x1F, 0x77, 0xB4)) > 500 and _pixels(png, (0xFF, 0x7F, 0x0E)) > 500
    svg = plot_runs({"gdpo · gdpo": runs["gdpo"], "mrtpo · mrtpo": runs["mrtpo"]}, tmp_path / "c.svg").read_text()
    assert svg.count("gdpo · gdpo") >= 5 and svg.count("mrtpo · mrtpo") >= 5  # in the legends, as text


def test_compare_refuses_what_it_cannot_draw(runs, tmp_path, capsys):
    assert report_main(["--compare", str(runs["gdpo"])]) == 2
    assert "--compare needs at least two run folders, got 1" in capsys.readouterr().err
    assert report_main(["--compare", str(runs["gdpo"]), str(tmp_path)]) == 2
    assert f"{tmp_path} holds no metrics.jsonl" in capsys.readouterr().err
    assert report_main([str(runs["gdpo"]), "--compare", str(runs["gdpo"]), str(runs["mrtpo"])]) == 2
    assert "not both" in capsys.readouterr().err
    assert report_main([]) == 2 and "name a run folder" in capsys.readouterr().err
