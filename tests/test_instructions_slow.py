"""End to end (slow: loads a real embedded model): the sanity script generates and scores."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_sanity_script_runs_on_the_small_model(tmp_path: Path) -> None:
    out = tmp_path / "sanity.json"
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "scripts" / "sanity_instructions.py"),
            "--model",
            "smollm2-135m",
            "--n",
            "3",
            "--batch-size",
            "3",
            "--max-new-tokens",
            "16",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    record = json.loads(out.read_text(encoding="utf-8"))
    assert record["summary"]["n_prompts"] == 3
    assert [r["id"] for r in record["responses"]] == ["ifeval-1000", "ifeval-1001", "ifeval-1005"]
    assert all(isinstance(r["response"], str) and 0 < r["tokens"] <= 16 for r in record["responses"])
    for key in ("prompt_level_strict", "instruction_level_strict", "instruction_level_loose"):
        assert 0.0 <= record["summary"][key] <= 1.0
    assert record["summary"]["prompt_level_strict"] <= record["summary"]["prompt_level_loose"]
