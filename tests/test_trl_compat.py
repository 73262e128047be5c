"""The PyTorch kernel given to TRL 1.15's fused LM head where it has none (mrtpo.trl_compat)."""

import math

import pytest
import torch

from mrtpo.trl_compat import KERNEL_NAME, ensure_fused_head_runs, head_statistics

ALL = ("entropy", "log_sum_sq_probs", "mean_logits", "is_top1")


def test_head_statistics_by_hand():
    """One token, hidden (1, 2), vocabulary 3, identity-like head: logits [1, 0, 2] + bias [0, 0, -1]."""
    hidden = torch.tensor([[1.0, 0.0]])
    weight = torch.tensor([[1.0, 0.0], [0.0, 1.0], [2.0, 0.0]])
    bias = torch.tensor([0.0, 0.0, -1.0])  # logits (1, 0, 1)
    log_probs, entropy, log_sum_sq, mean_logits, is_top1 = head_statistics(
        hidden, weight, bias, torch.tensor([1]), temperature=1.0, chunk_size=4, outputs=ALL
    )
    z = math.log(2 * math.e + 1)  # log-partition of (1, 0, 1)
    p = [math.exp(1 - z), math.exp(-z), math.exp(1 - z)]
    assert log_probs.item() == pytest.approx(-z, abs=1e-6)
    assert entropy.item() == pytest.approx(-sum(q * math.log(q) for q in p), abs=1e-6)
    assert log_sum_sq.item() == pytest.approx(math.log(sum(q * q for q in p)), abs=1e-6)
    assert mean_logits.item() == pytest.approx(2 / 3, abs=1e-6)
    assert not is_top1.item()  # the target (index 1) is not the maximum
    # temperature 2 halves every logit; a soft cap c = 0.5 maps z to 0.5·tanh(2z)
    halved = head_statistics(hidden, weight, bias, torch.tensor([0]), 2.0, 4, outputs=ALL)
    assert halved[0].item() == pytest.approx(0.5 - math.log(2 * math.exp(0.5) + 1), abs=1e-6)
    assert halved[4].item()  # index 0 is the first of the two maxima
    capped = head_statistics(hidden, weight, bias, torch.tensor([0]), 1.0, 4, final_logit_softcapping=0.5)
    c = 0.5 * math.tanh(2.0)
    assert capped[0].item() == pytest.approx(c - math.log(2 * math.exp(c) + 1), abs=1e-6)
    only_logps = head_statistics(hidden, weight, bias, torch.tensor([0]), 1.0, 4, outputs=())
    assert only_logps[1:] == (None, None, None, None)


def test_head_statistics_equal_trl_kernel_values_and_gradients():
    """Against the installed TRL's own kernel (TRL ≥ 1.16 runs it in PyTorch on the CPU)."""
    try:  # TRL's own kernel, not whatever the trainer module's name holds (ours, once a trainer has run on 1.15)
        from trl.kernels import ChunkedLogProbFunction as kernel
    except ImportError:
        pytest.skip("the installed TRL has no fused-head kernel here (1.15 without Triton): nothing to compare with")
    gen = torch.Generator().manual_seed(0)
    hidden = torch.randn(7, 5, generator=gen, requires_grad=True)
    weight = torch.randn(11, 5, generator=gen, requires_grad=True)
    bias = torch.randn(11, generator=gen)
    targets = torch.randint(0, 11, (7,), generator=gen)
    settings = dict(temperature=0.7, chunk_size=4, final_logit_softcapping=3.0, logit_scale=1.3, outputs=ALL)
    ours = head_statistics(hidden, weight, bias, targets, **settings)
    theirs = kernel.apply(
        hidden, weight, bias, targets, *(settings[k] for k in settings if k != "outputs"), settings["outputs"]
    )
    for mine, trl_value in zip(ours, theirs, strict=True):
        if mine.dtype == torch.bool:
            assert torch.equal(mine, trl_value)
        else:
            torch.testing.assert_close(mine, trl_value.float(), atol=1e-5, rtol=1e-5)
    grads = []
    for out in (ours, theirs):
        hidden.grad = weight.grad = None
        (out[0].sum() + 0.3 * out[1].sum()).backward()
        grads.append((hidden.grad.clone(), weight.grad.clone()))
    torch.testing.assert_close(grads[0], grads[1], atol=1e-5, rtol=1e-5)


def test_ensure_fused_head_runs_only_where_the_kernel_is_missing(monkeypatch):
    from trl.trainer import utils

    installed = getattr(utils, KERNEL_NAME)
    if installed is not None:
        assert ensure_fused_head_runs() is False  # a TRL with its own kernel is left alone
        assert getattr(utils, KERNEL_NAME) is installed
    monkeypatch.setattr(utils, KERNEL_NAME, None)  # what TRL 1.15 leaves without Triton
    assert ensure_fused_head_runs() is True
    assert getattr(utils, KERNEL_NAME).apply is head_statistics
    assert ensure_fused_head_runs() is False  # once is enough


def test_the_imported_trl_is_one_the_project_supports():
    """The TRL imported is inside pyproject's range, and is the one a minor check asked for
    (scripts/trl_minor_check.sh sets MRTPO_EXPECT_TRL), so that job cannot pass on the pinned TRL."""
    import os
    import tomllib
    from pathlib import Path

    import trl
    from packaging.requirements import Requirement

    pyproject = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())
    (spec,) = [Requirement(d).specifier for d in pyproject["project"]["dependencies"] if Requirement(d).name == "trl"]
    assert spec.contains(trl.__version__), f"trl {trl.__version__} is outside pyproject's {spec}"
    expected = os.environ.get("MRTPO_EXPECT_TRL")
    if expected:
        assert trl.__version__ == expected
