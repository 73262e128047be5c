"""The training report: curves, summary table and token-credit view from hand-written run files."""

import base64
import json
import re

import pytest
import yaml

from mrtpo.report.build import make_report, pick_samples, summarise
from mrtpo.report.curves import plot_run, plot_runs, reward_names, series, step_records

PNG = b"\x89PNG\r\n\x1a\n"


def step(n, fmt, res, loss, **extra):
    """A metrics line as MRTPOTrainer logs it (two rewards, time split, credit metrics)."""
    return {
        "step": n,
        "epoch": n / 4,
        "time": 1.0e9 + n,
        "loss": loss,
        "reward": fmt + res,
        "reward_std": 0.5,
        "rewards/format/mean": fmt,
        "rewards/format/std": 0.25,
        "rewards/result/mean": res,
        "rewards/result/std": 0.1,
        "completions/mean_length": 10.0 + n,
        "time/generation": 2.0,
        "time/scoring": 0.5,
        "time/replay": 1.0,
        "time/update": 3.0,
        "step_time": 6.5,
        "credit/format/top10_share": 0.2,
        "credit/result/relevance_mean": 0.05 * n,
        **extra,
    }


def sample(st, example_id, tokens, w_format, w_result, rewards):
    return {
        "step": st,
        "example_id": example_id,
        "method": "mrtpo",
        "rewards": rewards,
        "tokens": tokens,
        "weights": {"format": w_format, "result": w_result},
        "advantage": [0.5 * w for w in w_format],
        "relevance": {"format": [0.1 * w for w in w_format], "result": [0.2 * w for w in w_result]},
    }


@pytest.fixture
def run_dir(tmp_path):
    lines = [
        step(1, 0.25, 0.0, 0.1),
        step(2, 0.5, 0.25, 0.2),
        {"step": 2, "eval_loss": 9.0, "eval_reward": 9.0},  # evaluation line: not a training step
        step(3, 0.75, 0.5, -0.3),
        {"step": 3, "train_runtime": 20.0, "train_loss": 0.0},
    ]  # end-of-training summary
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    samples = [
        sample(
            0, "spider-dev-0", ["```", "sql", "\n"], [0.5, 2.0, 0.5], [1.0, 1.0, 1.0], {"format": 1.0, "result": 0.0}
        ),
        sample(0, "spider-dev-1", ["SEL", "ECT"], [1.0, 1.0], [1.5, 0.5], {"format": 0.0, "result": None}),
        sample(0, "spider-dev-2", ["x"], [1.0], [1.0], {"format": 0.0, "result": 0.0}),
        sample(1, "spider-dev-3", ["mid"], [1.0], [1.0], {"format": 0.0, "result": 0.0}),
        sample(2, "spider-dev-1", ["<b>", "FROM"], [1.25, 0.75], [0.25, 1.75], {"format": 1.0, "result": 1.0}),
    ]
    (tmp_path / "credit_samples.jsonl").write_text("".join(json.dumps(s) + "\n" for s in samples))
    config = {
        "task": "sql",
        "method": "mrtpo",
        "model": "tiny",
        "lora_r": 0,
        "train_size": 4,
        "task_args": {"sample_rows": 0},
        "per_device_train_batch_size": 4,
        "num_generations": 4,
        "max_completion_length": 12,
        "learning_rate": 1e-6,
    }
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    return tmp_path


def test_metric_helpers(run_dir):
    from mrtpo.report.curves import load_metrics

    records = load_metrics(run_dir)
    assert [r["step"] for r in step_records(records)] == [1, 2, 3]  # eval and summary lines left out
    assert reward_names(records) == ["format", "result"]
    assert series(records, "rewards/result/mean") == ([1, 2, 3], [0.0, 0.25, 0.5])
    assert series(records, "not-logged") == ([], [])
    # A step logged twice (an interrupted run's line, then the resumed one): the last line wins.
    again = [*records, step(3, 1.0, 1.0, 0.0)]
    assert series(again, "rewards/format/mean") == ([1, 2, 3], [0.25, 0.5, 1.0])


def test_summary_first_last_mean(run_dir):
    from mrtpo.report.curves import load_metrics

    summary = summarise(load_metrics(run_dir))
    rows = {r["name"]: r for r in summary["rows"]}
    assert (rows["format"]["first"], rows["format"]["last"]) == (0.25, 0.75)
    assert rows["format"]["mean"] == pytest.approx(0.5)
    assert rows["total reward"]["last"] == pytest.approx(1.25)
    assert rows["loss"]["mean"] == pytest.approx(0.0)
    assert summary["time_total"] == {"generation": 6.0, "scoring": 1.5, "replay": 3.0, "update": 9.0, "step_time": 19.5}
    assert summary["steps"] == 3 and summary["last_step"] == 3


def test_pick_samples_shows_one_prompt_at_the_first_and_the_last_step():
    """Samples are tagged before their update (tag s = curves' step s + 1). Prompt b is sampled at the
    first (tag 0) and the last (tag 3) step: both headings show b, under steps 1 and 4."""
    recs = [
        {"step": st, "example_id": ex, "i": i}
        for i, (st, ex) in enumerate([(0, "a"), (0, "b"), (0, "b"), (1, "c"), (3, "b"), (3, "d"), (3, "b")])
    ]
    shown = pick_samples(recs, 2)
    assert [s.step for s in shown] == [1, 4]
    assert [r["i"] for r in shown[0].records] == [1, 2] and [r["i"] for r in shown[1].records] == [4, 6]
    assert shown[1].note == "the same prompt (b) as at step 1"
    assert [s.step for s in pick_samples(recs[:3], 5)] == [1]  # one step only: shown once
    assert pick_samples(recs, 0) == [] and pick_samples([], 2) == []


def test_pick_samples_when_the_last_step_has_other_prompts_or_none_recurs():
    recs = [
        {"step": st, "example_id": ex, "i": i}
        for i, (st, ex) in enumerate([(0, "a"), (0, "b"), (2, "b"), (2, "c"), (5, "d")])
    ]
    shown = pick_samples(recs, 2)  # b came back at tag 2 (step 3), not at the last step (6)
    assert [(s.step, [r["i"] for r in s.records]) for s in shown] == [(1, [1]), (3, [2]), (6, [4])]
    assert "latest step that sampled it again" in shown[1].note and shown[2].note == "the last step: other prompts"
    none_back = pick_samples([recs[0], recs[4]], 2)
    assert [s.step for s in none_back] == [1, 6]
    assert none_back[1].note.startswith("no prompt sampled at step 1 was sampled again")


def test_make_report_writes_html_md_png(run_dir):
    paths = make_report(run_dir, samples=2)
    assert set(paths) == {"html", "md", "curves"}
    assert paths["curves"].read_bytes()[:8] == PNG
    html = paths["html"].read_text()
    embedded = re.search(r"src='data:image/png;base64,([A-Za-z0-9+/=]+)'", html)
    assert embedded and base64.b64decode(embedded.group(1)) == paths["curves"].read_bytes()
    # Prompt spider-dev-1 is sampled at the first (tag 0) and the last (tag 2) step: shown at both,
    # numbered as the curves number them (tag + 1); the other prompts are not shown.
    assert "<h3>step 1</h3>" in html and "<h3>step 3</h3>" in html and "<h3>step 2</h3>" not in html
    assert "spider-dev-0" not in html and "spider-dev-2" not in html and "spider-dev-3" not in html
    assert "step 1 · mrtpo · format=0, result=n/a" in html and "step 3 · mrtpo · format=1, result=1" in html
    # Hover text carries each token's weight and relevance for that reward; tokens are escaped.
    assert "result · token 0 &#x27;SEL&#x27;: weight 1.500, relevance 0.3000" in html
    assert "result · token 1 &#x27;FROM&#x27;: weight 1.750, relevance 0.3500" in html
    assert "&lt;b&gt;" in html and "<b>FROM" not in html
    # Summary table and (from the real Spider examples named in the samples) the question asked.
    assert "<td>format</td><td>0.250</td><td>0.750</td>" in html
    assert "What is the total number of singers?" in html
    assert "reward 1 · in_prompt" in html and "privileged" in html  # sql: format in_prompt, result privileged
    md = paths["md"].read_text()
    assert "| format | 0.250 | 0.750 |" in md and "| result | 0.000 | 0.500 |" in md
    assert "![training curves](curves.png)" in md
    assert "`result` credit peaks on 'FROM'×1.75" in md
    assert "generation 6 s, scoring 2 s, replay 3 s, update 9 s" in md


def test_report_without_credit_samples_or_config(tmp_path):
    (tmp_path / "metrics.jsonl").write_text(json.dumps(step(1, 0.5, 0.5, 0.0)) + "\n")
    paths = make_report(tmp_path)
    assert "No credit samples were recorded" in paths["md"].read_text()
    assert paths["curves"].read_bytes()[:8] == PNG


def test_report_needs_metrics(tmp_path):
    with pytest.raises(FileNotFoundError, match="metrics.jsonl"):
        make_report(tmp_path)


def test_plot_single_and_overlay(run_dir, tmp_path):
    from mrtpo.report.curves import load_metrics

    one = plot_run(run_dir / "metrics.jsonl", tmp_path / "one.png", title="t")
    other = [step(1, 0.1, 0.2, 0.0), step(2, 0.3, 0.4, 0.0)]
    many = plot_runs({"mrtpo": run_dir, "gdpo": other}, tmp_path / "many.png", title="bench")
    for p in (one, many):
        assert p.read_bytes()[:8] == PNG and p.stat().st_size > 10_000
    with pytest.raises(ValueError, match="at least one run"):
        plot_runs({}, tmp_path / "none.png")
    assert load_metrics(run_dir)  # plotting leaves the inputs alone


def test_report_names_a_revisited_pool_and_the_reward_trend(tmp_path):
    """8 steps of 2 prompts from a pool of 4: each prompt came back 4 times; the trend line averages
    the first and last 2 steps of the total reward (0.25 + 0.5 → 1.5 + 1.75)."""
    totals = [0.25, 0.5, 1.0, 0.75, 1.25, 1.0, 1.5, 1.75]
    lines = [step(i + 1, total / 2, total / 2, 0.0) for i, total in enumerate(totals)]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    config = {
        "task": "sql",
        "method": "mrtpo",
        "model": "tiny",
        "train_size": 4,
        "per_device_train_batch_size": 8,
        "num_generations": 4,
    }
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    md = make_report(tmp_path)["md"].read_text()
    assert (
        "**prompt pool**: the first 4 train prompts, each revisited about 4 times: a rising reward shows the "
        "loop learns on these prompts, not that it generalises"
    ) in md
    assert "**total reward trend**: 0.375 over the first 2 steps → 1.625 over the last 2 (of 8)" in md
    # A pool larger than what the steps visit is not a revisited pool; fewer than 4 steps give no trend.
    (tmp_path / "config.yaml").write_text(yaml.safe_dump({**config, "train_size": 100}))
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines[:3]))
    md = make_report(tmp_path)["md"].read_text()
    assert "prompt pool" not in md and "trend" not in md
