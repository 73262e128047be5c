"""`mrtpo demo` end to end on the tiny model: its group replay gives the same token weights as
replaying each completion on its own (no padding leaks between completions)."""

from __future__ import annotations

import json

import pytest
import torch

from mrtpo.counterfactual import prompt_renderer
from mrtpo.credit import DEFAULT_LAM, DEFAULT_W_MAX, relevance_weights
from mrtpo.demo import main as demo_main
from mrtpo.models import load_policy
from mrtpo.replay import replay_completion
from mrtpo.tasks import get_task


def test_demo_group_replay_matches_per_completion_replay(tiny_model_dir, tmp_path):
    out = tmp_path / "demo"
    rc = demo_main(
        [
            "--model",
            str(tiny_model_dir),
            "--task",
            "instructions",
            "--index",
            "2",
            "--group-size",
            "3",
            "--max-new-tokens",
            "10",
            "--seed",
            "1",
            "--out",
            str(out),
        ]
    )
    assert rc == 0
    record = json.loads((out / "demo.json").read_text())
    assert (out / "token_credit.html").read_text().count("completion ") >= 3

    model, tokenizer = load_policy(str(tiny_model_dir))
    task = get_task("instructions")
    example = task.load("train", limit=3)[2]
    verifiers = task.verifiers()
    evidences = [v.evidence(example) for v in verifiers]
    assert any(ev is not None for ev in evidences)
    assert len(record["completions"]) == 3

    for completion in record["completions"]:
        ids = torch.tensor(completion["token_ids"])
        alone = replay_completion(
            model,
            tokenizer,
            example,
            ids,
            evidences,
            render=prompt_renderer(task, tokenizer),
            verifiers=[v.name for v in verifiers],
        )
        weights = torch.tensor(completion["weights"])  # (K, T)
        for k, ev in enumerate(evidences):
            if ev is None:
                assert torch.equal(weights[k], torch.ones(len(ids)))  # uniform where nothing is replayed
                continue
            expected = relevance_weights(
                alone.relevance[k : k + 1], torch.ones(1, len(ids)), DEFAULT_LAM, DEFAULT_W_MAX
            )[0]
            assert weights[k] == pytest.approx(expected.tolist(), abs=1e-4)
            assert weights[k].mean().item() == pytest.approx(1.0, abs=1e-5)
        assert len(completion["mrtpo_advantage"]) == len(completion["tokens"]) == len(ids)
