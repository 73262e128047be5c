"""Training metrics of the gradient signal: each reward's lift ℓ, E[w²] and predicted G = ℓ²/E[w²] on the
tokens it is known to read (the gym's ground truth)."""

import json

import pytest
import torch

from mrtpo.trainer.metrics import predicted_gains, signal_metric_keys, signal_metric_sums


def test_signal_metric_sums_by_hand():
    weights = torch.tensor(
        [[[2.0, 1.0, 0.5, 0.5], [1.0, 1.0, 1.0, 1.0]], [[3.0, 0.0, 0.0, 7.0], [0.5, 1.5, 9.0, 9.0]]]
    )  # (B=2, K=2, T=4)
    relevant = torch.zeros(2, 2, 4, dtype=torch.bool)
    relevant[0, 0, 0] = relevant[1, 0, 0] = True  # reward a: the first token
    relevant[0, 1, 1] = relevant[1, 1, 1] = True  # reward b: the second
    sums = signal_metric_sums(weights, relevant, [4, 3], ["a", "b"])
    assert signal_metric_keys(["a", "b"]) == ["credit/a/lift", "credit/a/mean_w2", "credit/b/lift", "credit/b/mean_w2"]
    # a: ℓ = 2 (row 0), 3 (row 1 of length 3); E[w²] = (4 + 1 + .25 + .25) / 4 = 1.375 and 9 / 3 = 3
    # b: ℓ = 1, 1.5; E[w²] = 1 and (0.25 + 2.25 + 81) / 3
    expected = torch.tensor([[5.0, 2], [4.375, 2], [2.5, 2], [1 + 83.5 / 3, 2]], dtype=torch.float64)
    torch.testing.assert_close(sums, expected)
    skipped = torch.tensor([[False, True], [False, False]])
    assert signal_metric_sums(weights, relevant, [4, 3], ["a", "b"], skipped=skipped)[2, 1] == 1


def test_predicted_gains_from_the_means():
    means = {"credit/a/lift": 2.0, "credit/a/mean_w2": 1.6, "credit/b/lift": 1.0}
    assert predicted_gains(means, ["a", "b"]) == {"credit/a/predicted_g": pytest.approx(2.5)}


def test_gym_training_logs_lift_mean_square_and_predicted_gain(tmp_path):
    from mrtpo.config import load_config
    from mrtpo.train import build_trainer

    config = load_config(
        overrides={
            "task": "gym-constraints",
            "model": "gym",
            "method": "mrtpo",
            "lam": 1.0,
            "w_max": None,
            "max_steps": 1,
            "num_generations": 4,
            "per_device_train_batch_size": 8,
            "max_completion_length": 16,
            "seed": 0,
            "output_dir": str(tmp_path),
            "report": False,
            "report_to": "none",
            "save_strategy": "no",
            "credit_samples": 0,
            "logging_steps": 1,
            "skip_zero_advantage": False,
        }
    )
    build_trainer(config).train()
    logs = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    step = next(r for r in logs if "credit/c1/top10_share" in r)
    for name in ("c1", "c2", "c3"):
        if f"credit/{name}/lift" not in step:
            continue
        lift, w2 = step[f"credit/{name}/lift"], step[f"credit/{name}/mean_w2"]
        assert w2 >= 1.0 - 1e-9  # mean-1 weights: E[w²] = 1 + CV²
        assert step[f"credit/{name}/predicted_g"] == pytest.approx(lift**2 / w2)
    assert any(f"credit/{n}/lift" in step for n in ("c1", "c2", "c3"))
