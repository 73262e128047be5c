"""The report's statistics and rendering rules against independently known values: Wilson intervals
(Newcombe 1998's published examples and a hand computation), the {0,1} test from TRL's logged
(mean, std), the colour scale of the token view, skipped rows, and missing diagnostics."""

import json
import math
import statistics

import pytest

from mrtpo.report.build import make_report
from mrtpo.report.curves import band_rule
from mrtpo.report.diagnostics import diagnostic_rows
from mrtpo.report.samples import no_spread
from mrtpo.report.stats import binary_count, is_binary, mean_interval, reward_bands, wilson_interval
from mrtpo.report.token_view import HIGH, LOW, CompletionView, CreditRow, WeightScale, render_cards


@pytest.mark.parametrize(
    ("k", "n", "low", "high"),
    [
        # Newcombe (1998), "Two-sided confidence intervals for the single proportion", Table I, method 3.
        (81, 263, 0.2553, 0.3662),
        (15, 148, 0.0624, 0.1605),
        (0, 20, 0.0, 0.1611),
        (1, 29, 0.0061, 0.1718),
    ],
)
def test_wilson_interval_matches_newcombe(k, n, low, high):
    lo, hi = wilson_interval(k / n, n)
    assert (round(lo, 4), round(hi, 4)) == (low, high)


def test_wilson_interval_by_hand():
    """6 of 8: z² = 3.841459, centre (0.75 + z²/16) / (1 + z²/8) = 0.990091 / 1.480182 = 0.668898,
    half z / 1.480182 · sqrt(0.75·0.25/8 + z²/256) = 1.959964 · 0.196069 / 1.480182 = 0.259623."""
    lo, hi = wilson_interval(0.75, 8)
    assert lo == pytest.approx(0.668898 - 0.259623, abs=3e-6) and hi == pytest.approx(0.668898 + 0.259623, abs=3e-6)
    assert wilson_interval(1.0, 8)[1] == 1.0 and wilson_interval(0.0, 8)[0] == 0.0
    with pytest.raises(ValueError):
        wilson_interval(0.5, 0)


def test_binary_count_reads_n_from_trl_mean_and_std():
    values = [1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0]  # TRL logs the Bessel-corrected std
    assert binary_count(statistics.mean(values), statistics.stdev(values)) == 8
    twelve = [1.0] * 5 + [0.0] * 7
    assert binary_count(statistics.mean(twelve), statistics.stdev(twelve)) == 12
    graded = [0.0, 0.5, 1.0, 1.0]  # not {0,1}: its variance is below m (1 - m)
    assert binary_count(statistics.mean(graded), statistics.stdev(graded)) is None
    assert binary_count(1.0, 0.0) is None and binary_count(0.0, 0.0) is None


def test_is_binary_needs_a_step_inside_0_1_and_sample_values_in_0_1():
    step = (0.375, statistics.stdev([1.0] * 3 + [0.0] * 5))
    assert is_binary([step, (1.0, 0.0)])
    assert not is_binary([step], sample_values=[0.0, 0.5])  # a sampled 0.5 disproves it
    assert not is_binary([(1.0, 0.0), (1.0, 0.0)], sample_values=[1.0])  # a constant is not called {0,1}
    assert is_binary([step], sample_values=[None, 1.0])  # None: not scored


def test_reward_bands_wilson_stays_in_0_1_where_mean_minus_std_does_not():
    values = [1.0, 1.0] + [0.0] * 6
    m, s = statistics.mean(values), statistics.stdev(values)
    assert m - s < 0  # the old ± std band dipped below 0
    lows, highs, what = reward_bands([m], [s], True, None)
    assert (lows[0], highs[0]) == wilson_interval(0.25, 8) and lows[0] > 0
    assert what == "{0,1}: proportion, 95% Wilson interval"
    lows, highs, what = reward_bands([0.5], [0.2], False, 16)  # 0.5 ± 1.96 · 0.2 / 4
    assert (lows[0], highs[0]) == pytest.approx((0.5 - 0.098, 0.5 + 0.098), abs=1e-4) and "n=16" in what
    assert mean_interval(0.5, 0.2, 16) == pytest.approx((0.402, 0.598), abs=1e-4)


def test_weight_scale_spans_the_weights_present():
    scale = WeightScale.of([0.8, 1.0, 1.1, 1.2])  # the default weights' range
    assert (scale.low, scale.high) == (0.8, 1.2)
    full_high = "#" + "".join(f"{c:02x}" for c in HIGH)
    full_low = "#" + "".join(f"{c:02x}" for c in LOW)
    assert scale.colour(1.2) == full_high and scale.colour(0.8) == full_low and scale.colour(1.0) == "#ffffff"
    assert scale.intensity(1.1) == pytest.approx(math.log(1.1) / math.log(1.2))
    ticks = scale.ticks()
    assert ticks[0] == pytest.approx(0.8) and ticks[3] == 1.0 and ticks[-1] == pytest.approx(1.2)
    assert len({scale.colour(t) for t in ticks}) == 7


def test_token_rows_carry_a_numbered_bar_and_a_skipped_row_says_so():
    view = CompletionView(
        "t",
        ["a", "b", "c"],
        [
            CreditRow("format", 1.0, [0.8, 1.0, 1.2]),
            CreditRow("flat", 1.0, [1.0, 1.0, 1.0], skipped=True),
            CreditRow("even", 0.0, [1.0, 1.0, 1.0]),
        ],
        advantage=[0.5, -0.25, 0.0],
    )
    html = render_cards([view])
    bar = html.split("class='bar'")[1]
    assert ">0.80</span>" in bar and ">1.00</span>" in bar and ">1.20</span>" in bar
    assert html.count("skipped (no spread)</small>") == 1  # only the flat row; the legend explains it
    assert "<div class='row skipped'><div class='label'><b>flat</b>" in html
    assert "every weight 1" in html.split("<b>even</b>")[1].split("</div>")[0]  # uniform, not skipped
    assert ">+0.5</span>" in html and ">-0.5</span>" in html  # the advantage bar: -max … +max


def test_no_spread_reads_the_record_or_falls_back_on_the_step_share():
    assert no_spread({"step": 0, "no_spread": ["b"], "weights": {"a": [], "b": []}}, []) == {"b"}
    metrics = [{"step": 1, "loss": 0.0, "skip/zero_spread/a": 1.0, "skip/zero_spread/b": 0.5}]
    # an older record (no list): a reward is flat where every group was flat at that step (tag 0 = step 1)
    assert no_spread({"step": 0, "weights": {"a": [], "b": []}}, metrics) == {"a"}


def _line(n, **extra):
    return {
        "step": n,
        "loss": 0.0,
        "reward": 0.5,
        "reward_std": 0.5,
        "rewards/ok/mean": 0.5,
        "rewards/ok/std": statistics.stdev([1.0, 1.0, 0.0, 0.0]),
        **extra,
    }


def test_diagnostics_name_what_the_run_did_not_log(tmp_path):
    records = [_line(1, grad_norm=2.0, kl=0.01), _line(2, grad_norm=4.0, kl=0.03)]
    rows = {r["key"]: r for r in diagnostic_rows(records, {"beta": 0.04})}
    assert rows["grad_norm"]["mean"] == 3.0 and rows["kl"]["last"] == 0.03
    assert rows["clip_ratio/region_mean"]["missing"] and rows["skip/zero_spread/ok"]["missing"]
    no_kl = {r["key"]: r for r in diagnostic_rows([_line(1)], {"beta": 0.0})}
    assert no_kl["kl"]["missing"] and no_kl["kl"]["why"] == "beta = 0: TRL computes no KL"
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in [_line(1), _line(2)]))
    (tmp_path / "config.yaml").write_text("beta: 0.0\nper_device_train_batch_size: 4\n")
    report = make_report(tmp_path)
    html, md = report["html"].read_text(), report["md"].read_text()
    assert "<td colspan='3' class='missing'>not in metrics.jsonl</td>" in html  # grad_norm, never logged
    assert "not in metrics.jsonl (beta = 0: TRL computes no KL)" in html
    assert "No held-out evaluation in metrics.jsonl" in html and "No held-out evaluation in metrics.jsonl" in md
    # 0.5 over n = 4 (read from the logged std): Wilson [0.150, 0.850], in the summary table
    lo, hi = wilson_interval(0.5, 4)
    assert f"[{lo:.3f}, {hi:.3f}] (Wilson, n=4)" in md and band_rule(records).binary == {"ok"}
