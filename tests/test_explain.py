"""``mrtpo explain``: the token-credit view of one prompt/completion pair on a real Spider example."""

import os
import re
import subprocess
import sys

import pytest
import torch

from mrtpo.explain import explain, main

ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HUB_DISABLE_TELEMETRY": "1", "OMP_NUM_THREADS": "1"}
# spider-dev-0 asks "How many singers do we have?"; its gold query is exactly this one.
RIGHT = "```sql\nSELECT count(*) FROM singer\n```"
WRONG_TABLE = "```sql\nSELECT count(*) FROM singers\n```"


@pytest.fixture(scope="module")
def tiny():
    from mrtpo.testing import tiny_policy

    return tiny_policy(seed=0, max_position_embeddings=4096)


@pytest.fixture(scope="module")
def tiny_dir(tiny, tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny-model")
    tiny[0].save_pretrained(path)
    tiny[1].save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def sql():
    from mrtpo.tasks import get_task

    task = get_task("sql", sample_rows=0)
    return task, task.load("train", 1)[0]


def test_explain_command_writes_the_view(tiny_dir, tmp_path):
    out = tmp_path / "view.html"
    cmd = [
        sys.executable,
        "-m",
        "mrtpo.cli",
        "explain",
        "--task",
        "sql",
        "--index",
        "0",
        "--model",
        str(tiny_dir),
        "--completion",
        RIGHT,
        "--task-arg",
        "sample_rows=0",
        "--out",
        str(out),
    ]
    proc = subprocess.run(cmd, check=False, capture_output=True, text=True, env=ENV, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    # The gold query: every sql reward is 1.
    for name in ("format", "executes", "result"):
        assert re.search(rf"{name} = 1 ", proc.stdout), proc.stdout
    html = out.read_text()
    n_tokens = len(RIGHT.encode()) + 1  # byte-level tokenizer, plus the end-of-turn token
    assert html.count("class='tok'") == 3 * n_tokens  # one row per reward, no advantage row
    assert "spider-dev-0" in html and "reward 1 · privileged" in html and "reward 1 · in_prompt" in html


def test_weights_follow_the_method(tiny, sql, one_thread):
    model, tok = tiny
    task, example = sql
    ids = tok(WRONG_TABLE, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    res = explain(model, tok, task, example, ids, WRONG_TABLE, method="mrtpo", lam=1.0, w_max=None)  # the paper's
    assert res["rewards"] == [1.0, 0.0, 0.0]  # well formed, but table "singers" does not exist
    w, rel = res["weights"], res["relevance"]
    assert w.shape == (3, len(ids)) and torch.all(rel >= 0)
    # Credit is moved between tokens, never created: every reward's weights average to 1 (λ = 1).
    torch.testing.assert_close(w.mean(1), torch.ones(3))
    # λ = 1, no cap: weights are relevance over its mean.
    torch.testing.assert_close(w[2], rel[2] / rel[2].mean())
    assert not torch.allclose(w[0], w[2])  # reward-specific maps
    uniform = explain(model, tok, task, example, ids, WRONG_TABLE, method="gdpo")["weights"]
    assert torch.equal(uniform, torch.ones_like(uniform))
    half = explain(model, tok, task, example, ids, WRONG_TABLE, method="mrtpo", lam=0.5, w_max=None)["weights"]
    torch.testing.assert_close(half, 0.5 + 0.5 * w)
    # the default shape is training's: λ 0.2 and a cap of 1.2, so every weight lies in [0.8, 1.2]
    default = explain(model, tok, task, example, ids, WRONG_TABLE, method="mrtpo")["weights"]
    assert float(default.min()) >= 0.8 - 1e-6 and float(default.max()) <= 1.2 + 1e-6
    torch.testing.assert_close(default.mean(1), torch.ones(3))
    joint = explain(model, tok, task, example, ids, WRONG_TABLE, method="contrast")["weights"]
    torch.testing.assert_close(joint[0], joint[1])  # one shared map for every reward
    # one example has no other prompt to take a decoy from: the contrastive weights are MRTPO's
    contrastive = explain(model, tok, task, example, ids, WRONG_TABLE, method="mrtpo-contrastive", lam=1.0, w_max=None)[
        "weights"
    ]
    torch.testing.assert_close(contrastive, w)


def test_greedy_completion_when_none_is_given(tiny_dir, tmp_path, capsys, one_thread):
    out = tmp_path / "greedy.html"
    rc = main(
        [
            "--task",
            "sql",
            "--model",
            str(tiny_dir),
            "--max-new-tokens",
            "6",
            "--task-arg",
            "sample_rows=0",
            "--out",
            str(out),
        ]
    )
    assert rc == 0
    printed = capsys.readouterr().out
    assert "greedy completion of" in printed
    n = int(re.search(r"· (\d+) tokens ·", printed).group(1))
    assert 1 <= n <= 6  # stops at the end-of-turn token or the length cap
    assert out.read_text().count("class='tok'") == 3 * n


def test_bad_inputs_exit_2(tiny_dir, tmp_path, capsys):
    assert (
        main(
            [
                "--task",
                "sql",
                "--index",
                "100000",
                "--model",
                str(tiny_dir),
                "--completion",
                "x",
                "--task-arg",
                "sample_rows=0",
            ]
        )
        == 2
    )
    assert "out of range" in capsys.readouterr().err
    assert main(["--task", "sql", "--model", str(tiny_dir), "--completion-file", str(tmp_path / "missing.txt")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_every_registered_method_explains(tiny, sql, one_thread):
    """``--method`` takes the registry's names: every method (controls and plugins' included) gives a
    ``(K, T)`` weight map whose rows average 1 over the completion (credit moved, not created)."""
    from mrtpo.credit import available_methods
    from mrtpo.explain import _parse

    model, tok = tiny
    task, example = sql
    ids = tok(WRONG_TABLE, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    for method in available_methods():
        assert _parse(["--task", "sql", "--method", method]).method == method
        weights = explain(model, tok, task, example, ids, WRONG_TABLE, method=method)["weights"]
        assert weights.shape == (3, len(ids))
        torch.testing.assert_close(weights.mean(-1), torch.ones(3), msg=method)
