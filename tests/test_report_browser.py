"""report.html in a real browser: headless Chromium renders it to a PNG, and the screenshot is read
back. Skipped where no Chromium / Chrome is installed (``apt-get install chromium``).

The run is hand-written: weights in the default range [0.8, 1.2] (the case whose shading used to
be faint) and a 300-token completion (rows must wrap, not run off the page).
"""

import json
import re
import shutil
import subprocess

import numpy as np
import pytest
from PIL import Image

from mrtpo.report.build import make_report
from mrtpo.report.token_view import HIGH

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
BROWSER = next((path for path in map(shutil.which, BROWSERS) if path), None)
WIDTH, HEIGHT = 1280, 6000

pytestmark = pytest.mark.skipif(
    BROWSER is None,
    reason="no headless browser installed (none of chromium, chromium-browser, google-chrome on "
    "PATH): the report.html screenshot check did not run",
)


def _run(folder):
    metrics = [
        {
            "step": s,
            "loss": 0.0,
            "reward": 0.5,
            "reward_std": 0.5,
            "rewards/format/mean": 0.5,
            "rewards/format/std": 0.5345224838248488,
            "rewards/result/mean": 0.25,
            "rewards/result/std": 0.4629100498862757,
            "skip/zero_spread/format": 0.0,
            "skip/zero_spread/result": 0.5,
            "grad_norm": 1.0 + s,
        }
        for s in (1, 2, 3)
    ]
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in metrics))
    tokens = [f" w{i:03d}" for i in range(300)]
    graded = [0.8 + 0.4 * (i % 9) / 8 for i in range(300)]  # [0.8, 1.2], the default weights' range
    samples = [
        {
            "step": tag,
            "example_id": "p0",
            "method": "mrtpo",
            "tokens": tokens,
            "rewards": {"format": 1.0, "result": 0.0, "flat": 1.0},
            "weights": {"format": graded, "result": [1.2] * 300, "flat": [1.0] * 300},
            "advantage": [0.1 * (w - 1.0) for w in graded],
            "no_spread": ["flat"],
        }
        for tag in (0, 2)
    ]
    (folder / "credit_samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in samples))
    (folder / "config.yaml").write_text("task: own\nmethod: mrtpo\nmodel: tiny\nper_device_train_batch_size: 8\n")
    return make_report(folder, samples=1)["html"]


def test_screenshot_shows_labelled_colour_bars_and_wrapped_rows(tmp_path):
    page = _run(tmp_path)
    shot = tmp_path / "report.png"
    proc = subprocess.run(
        [
            BROWSER,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
            f"--window-size={WIDTH},{HEIGHT}",
            f"--screenshot={shot}",
            page.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert shot.is_file(), proc.stderr[-2000:]
    assert shot.stat().st_size > 50_000  # a page of text, tables, a figure and coloured tokens
    image = np.asarray(Image.open(shot).convert("RGB"))
    assert image.shape == (HEIGHT, WIDTH, 3)
    html = page.read_text()

    def count(hex_colour: str) -> int:
        rgb = np.array([int(hex_colour[i : i + 2], 16) for i in (1, 3, 5)], dtype=np.uint8)
        return int((image == rgb).all(-1).sum())

    # The format row's colour bar: 7 swatches (0.80 … 1.00 … 1.20), each drawn in its own colour.
    bar = html.split("<b>format</b>")[1].split("class='tokens'")[0]
    swatches = re.findall(r"class='sw' style='background:(#[0-9a-f]{6})[^>]*>([0-9.]+)<", bar)
    assert [label for _, label in swatches] == ["0.80", "0.86", "0.93", "1.00", "1.06", "1.13", "1.20"]
    assert len({colour for colour, _ in swatches}) == 7
    assert all(count(colour) > 40 for colour, _ in swatches)
    # The result row (every weight 1.2, the top of its scale): full orange, wrapped over many lines
    # inside the page, not one line running off its right edge.
    orange = (image == np.array(HIGH, dtype=np.uint8)).all(-1)
    lines = int((orange.sum(1) > 20).sum())
    assert lines > 200, f"orange tokens cover only {lines} pixel rows: the token rows did not wrap"
    assert np.nonzero(orange.any(0))[0].max() < WIDTH - 20
    # The skipped reward is hatched grey, not white: its label is on the page.
    assert html.count("skipped (no spread)</small>") == 2
