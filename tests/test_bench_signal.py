"""``mrtpo bench signal``: the signal math by hand, the method variants, the relevant tokens, and the
gradient it takes against a plain autograd of the on-policy policy-gradient loss (the gym's policy)."""

import json
import math

import pytest
import torch

from mrtpo.credit import CreditConfig
from mrtpo.credit.signal import (
    bootstrap_interval,
    cosine,
    cross_gram,
    gram,
    group_sums,
    lift_and_mean_square,
    pair_mean,
    pooled,
    predicted_gain,
    signal_stats,
    snr,
    snr_excess,
    trace_covariance,
)

G = torch.tensor([[1.0, 0.0], [3.0, 0.0], [2.0, 1.0], [2.0, -1.0]])  # mean (2, 0), deviations of squared norm 1 each
B = G + torch.tensor([0.0, 2.0])  # the same noise around (2, 2)
ONES = torch.ones(4, dtype=torch.float64)


def test_snr_by_hand():
    # ‖ḡ‖² = 4; tr Σ̂ = (1 + 1 + 1 + 1) / 3 = 4/3; SNR = 4 / (4/3 / 4) = 12
    assert float(trace_covariance(gram(G), ONES)) == pytest.approx(4 / 3)
    assert snr(gram(G), ONES) == pytest.approx(12.0)
    # pairs of different groups: (‖Σ g‖² − Σ ‖g_i‖²) / 12 = (64 − 20) / 12 = 11/3 = ‖ḡ‖² − tr Σ̂ / N
    assert float(pair_mean(gram(G), ONES)) == pytest.approx(11 / 3)
    assert snr_excess(gram(G), ONES) == pytest.approx(11.0)


def test_cosine_and_effective_gain_by_hand():
    grams = {"g": gram(G), "b": gram(B)}
    cross = {"g": cross_gram(G, B), "b": cross_gram(B, B)}
    # ḡ_b = (2, 2): ‖ḡ_b‖² = 8, SNR_b = 8 / (1/3) = 24; cos(ḡ, ḡ_b) = 4 / (2 · 2√2) = 1/√2
    assert cosine(cross["g"], grams["g"], grams["b"], ONES) == pytest.approx(1 / math.sqrt(2))
    stats = signal_stats(grams, cross, "b", ONES)
    assert stats["b"]["snr"] == pytest.approx(24.0)
    assert stats["g"]["snr"] == pytest.approx(12.0)
    assert stats["g"]["g_eff"] == pytest.approx(12 / 24 * 0.5)
    assert stats["b"]["g_eff"] == pytest.approx(1.0) and stats["b"]["cos_to_ref"] == pytest.approx(1.0)
    # noise taken out: ⟨μ, μ_b⟩ ≈ 11/3 (the offset's cross terms cancel), ‖μ_b‖² ≈ 11/3 + 4 = 23/3, equal noise
    assert stats["g"]["g_eff_excess"] == pytest.approx((11 / 3) ** 2 / (23 / 3) ** 2)


def test_scaled_gradients_have_the_same_signal():
    stats = signal_stats({"g": gram(G), "twice": gram(2 * G)}, {"g": gram(G), "twice": cross_gram(2 * G, G)}, "g", ONES)
    assert stats["twice"]["g_eff"] == pytest.approx(1.0)
    assert stats["twice"]["g_eff_excess"] == pytest.approx(1.0)


def test_snr_excess_estimates_the_population_ratio():
    """N draws with mean μ and covariance diag(σ²): SNR − 1 ≈ N ‖μ‖² / Σ σ² (here 2000 · 1 / 40 = 50)."""
    torch.manual_seed(0)
    n, mu, sigma = 2000, torch.tensor([0.6, 0.8, 0.0, 0.0]), torch.tensor([1.0, 2.0, 3.0, 4.47213595])
    draws = mu + sigma * torch.randn(n, 4)
    assert snr_excess(gram(draws), torch.ones(n, dtype=torch.float64)) == pytest.approx(50.0, rel=0.2)
    noise_only = sigma * torch.randn(n, 4)
    assert abs(snr_excess(gram(noise_only), torch.ones(n, dtype=torch.float64))) < 5.0  # ≈ 0 ± √2


def test_counts_are_multiplicities():
    twice = torch.cat([G, G[:1]])
    counts = torch.tensor([2.0, 1.0, 1.0, 1.0], dtype=torch.float64)
    assert snr(gram(G), counts) == pytest.approx(snr(gram(twice), torch.ones(5, dtype=torch.float64)))
    # a group never pairs with its own copy: the pair mean leaves the duplicated self-product out
    g = gram(G).double()
    expected = sum(counts[i] * counts[j] * g[i, j] for i in range(4) for j in range(4) if i != j) / (
        25 - float((counts**2).sum())
    )
    assert float(pair_mean(g, counts)) == pytest.approx(float(expected))


def test_bootstrap_interval_of_a_mean():
    torch.manual_seed(1)
    values = torch.randn(400, dtype=torch.float64)

    def mean(counts):
        return float((counts * values).sum() / counts.sum())

    low, high = bootstrap_interval(mean, 400, resamples=400, seed=3)
    assert low < float(values.mean()) < high
    assert high - low == pytest.approx(2 * 1.96 * float(values.std()) / 20, rel=0.25)
    assert bootstrap_interval(lambda c: 7.0, 5, resamples=20) == (7.0, 7.0)


def test_lift_mean_square_and_predicted_gain_by_hand():
    w = torch.tensor([2.0, 0.5, 0.5, 1.0, 9.0])
    relevant = torch.tensor([True, False, False, False, True])
    mask = torch.tensor([1.0, 1.0, 1.0, 1.0, 0.0])  # the last token is padding
    lift, w2 = lift_and_mean_square(w, relevant, mask)
    assert (lift, w2) == (pytest.approx(2.0), pytest.approx((4 + 0.25 + 0.25 + 1) / 4))
    assert predicted_gain(lift, w2) == pytest.approx(4 / 1.375)
    assert lift_and_mean_square(w, torch.zeros(5, dtype=torch.bool), mask) is None
    assert lift_and_mean_square(w, mask.bool(), mask) is None
    # uniform weights: ℓ = 1, E[w²] = 1, G = 1
    assert predicted_gain(*lift_and_mean_square(torch.ones(4), relevant[:4], torch.ones(4))) == pytest.approx(1.0)


def test_pooled_counts_each_group():
    sums, sizes = group_sums([[1.0, 2.0], [3.0]])
    assert pooled(sums, sizes, torch.tensor([2.0, 1.0])) == pytest.approx(9 / 5)  # (1 + 2 + 1 + 2 + 3) / 5
    assert math.isnan(pooled(*group_sums([[], []]), torch.ones(2)))


def test_method_configs_variants_and_their_credit_settings():
    from mrtpo.bench.signal import method_configs

    base = CreditConfig(lam=0.2, w_max=1.2)
    methods = method_configs(
        ["gdpo", "mrtpo", "paper=mrtpo", "rank=mrtpo"], ["paper:lam=1", "paper:w_max=null", "rank:weighting=rank"], base
    )
    assert list(methods) == ["gdpo", "mrtpo", "paper", "rank"]
    assert methods["paper"] == ("mrtpo", CreditConfig(lam=1.0, w_max=None))
    assert methods["rank"] == ("mrtpo", CreditConfig(lam=0.2, w_max=1.2, weighting="rank"))
    assert methods["mrtpo"] == ("mrtpo", base)
    with pytest.raises(ValueError, match="only credit settings"):
        method_configs(["mrtpo"], ["mrtpo:learning_rate=1e-3"], base)
    with pytest.raises(ValueError, match="LABEL"):
        method_configs(["mrtpo"], ["other:lam=1"], base)
    with pytest.raises(KeyError, match="unknown credit method"):
        method_configs(["nope"], [], base)


def test_relevant_mask_is_the_gym_ground_truth():
    from mrtpo.bench.signal import relevant_mask
    from mrtpo.tasks import get_task

    task = get_task("gym-constraints")
    example = task.load("train", 1)[0]
    names = [v.name for v in task.verifiers()]
    text = "the a and of to in on with so then"
    ids = [list(range(11))]  # ten words and the end-of-turn token
    mask = relevant_mask(task, example, task.verifiers(), [text], ids, 13, None)
    truth = task.relevant_positions(example, text.split())
    for k, name in enumerate(names):
        assert mask[0, k].nonzero().view(-1).tolist() == [p for p in truth[name] if p < 11]
    assert not mask[0, :, 11:].any()


def test_relevant_mask_maps_a_real_tasks_checked_spans_to_tokens():
    from mrtpo.bench.signal import relevant_mask

    class Tokenizer:
        pieces = ["He", "llo", " wor", "ld", "!"]

        def decode(self, ids, skip_special_tokens=True):
            return "".join(self.pieces[i] for i in ids)

    class Task:
        def checked_spans(self, example, text):
            assert text == "Hello world!"
            return [("kw", "keyword", [(6, 11)])]  # "world": the tokens " wor" and "ld"

    from types import SimpleNamespace

    verifiers = [SimpleNamespace(name="len"), SimpleNamespace(name="kw")]
    mask = relevant_mask(Task(), None, verifiers, ["Hello world!"], [[0, 1, 2, 3, 4]], 6, Tokenizer())
    assert mask[0, 1].tolist() == [False, False, True, True, False, False]
    assert not mask[0, 0].any()
    assert relevant_mask(object(), None, verifiers[1:], ["x"], [[0]], 1, None) is None  # a task that knows nothing


def _gym_args(tmp_path, *extra):
    return [
        "--task",
        "gym-constraints",
        "--groups",
        "4",
        "--step-groups",
        "2",
        "--bootstrap",
        "20",
        "--out",
        str(tmp_path / "signal.json"),
        "num_generations=4",
        "per_device_train_batch_size=8",
        "max_completion_length=12",
        *extra,
    ]


def test_group_gradient_is_the_on_policy_policy_gradient(tmp_path):
    """The trainer's loss at ratio 1 has the gradient −Σ_t A_t ∇ log π(y_t) / tokens: checked against a
    plain forward of the gym's policy and autograd."""
    from mrtpo.bench.signal import _config, _parse, group_gradients
    from mrtpo.sampling import sample_group
    from mrtpo.train import build_trainer

    args = _parse(_gym_args(tmp_path))
    config, _ = _config(args, tmp_path / "run")
    trainer = build_trainer(config)
    model, tok = trainer.model, trainer.processing_class
    model.eval()
    task = trainer.mrtpo_task
    from mrtpo.counterfactual import prompt_renderer

    prompt = tok(prompt_renderer(task, tok)(task.load("train", 1)[0]), add_special_tokens=False)["input_ids"]
    torch.manual_seed(0)
    comps, lengths = sample_group(model, tok, prompt, 4, 12)
    t = comps.shape[1]
    mask = (torch.arange(t).unsqueeze(0) < lengths.view(-1, 1)).float()
    advantages = torch.randn(4, t) * mask
    params = [p for p in model.parameters() if p.requires_grad]
    (got,) = group_gradients(trainer, params, prompt, comps, lengths, [advantages], [advantages.mean(1)])

    ids = torch.cat([torch.tensor([prompt] * 4), comps], 1)
    logits = model(input_ids=ids).logits[:, len(prompt) - 1 : -1].float()
    logp = torch.log_softmax(logits / trainer.temperature, -1).gather(-1, comps.unsqueeze(-1)).squeeze(-1)
    loss = -(advantages * logp * mask).sum() / mask.sum()
    expected = torch.cat([g.reshape(-1) for g in torch.autograd.grad(loss, params)])
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize(
    "case",
    ["gym full weights", "LoRA dapo", "LoRA grpo + entropy bonus"],
)
def test_one_forward_gives_each_methods_own_gradient(tmp_path, tiny_model_dir, one_thread, case):
    """:func:`group_gradients` (one forward, the loss's coefficients, one backward per method) equals, per
    method, autograd of the trainer's own loss on its own forward: float32, the gym's policy (every
    weight) and a tiny Qwen2 under LoRA, TRL's per-sequence normalisation (grpo) and an entropy bonus
    (a term outside the advantages) included."""
    from mrtpo.bench.signal import _config, _parse, group_gradients, loss_inputs
    from mrtpo.counterfactual import prompt_renderer
    from mrtpo.sampling import sample_group
    from mrtpo.train import build_trainer

    real = [] if case.startswith("gym") else ["--task", "instructions", "--model", str(tiny_model_dir)]
    settings = [] if not real else ["lora_r=4", "dtype=float32"]
    settings += ["loss_type=grpo", "entropy_coef=0.1"] if case.endswith("entropy bonus") else []
    args = _parse([*real, "num_generations=4", "per_device_train_batch_size=8", "max_completion_length=12", *settings])
    trainer = build_trainer(_config(args, tmp_path / "run")[0])
    model, tok, task = trainer.model, trainer.processing_class, trainer.mrtpo_task
    model.eval()
    prompt = tok(prompt_renderer(task, tok)(task.load("train", 1)[0]), add_special_tokens=False)["input_ids"]
    torch.manual_seed(0)
    comps, lengths = sample_group(model, tok, prompt, 4, 12)
    mask = (torch.arange(comps.shape[1]).unsqueeze(0) < lengths.view(-1, 1)).float()
    advantages = [torch.randn(4, comps.shape[1]) * mask for _ in range(3)]
    advantages[2] = advantages[2].abs()  # one method with every advantage positive
    params = [p for p in model.parameters() if p.requires_grad]
    got = group_gradients(trainer, params, prompt, comps, lengths, advantages, [a.mean(1) for a in advantages])
    assert got.shape == (3, sum(p.numel() for p in params))
    for m, a in enumerate(advantages):
        loss = trainer._compute_loss(model, loss_inputs(trainer, prompt, comps, lengths, a, a.mean(1)))
        grads = torch.autograd.grad(loss, params, allow_unused=True)
        expected = torch.cat([(torch.zeros_like(p) if d is None else d).reshape(-1) for p, d in zip(params, grads)])
        torch.testing.assert_close(got[m], expected, rtol=1e-5, atol=1e-7)
    assert not torch.allclose(got[0], got[1])


def test_fast_sampling_goes_through_fast_decode(one_thread):
    """``sample_group(fast=True)`` draws what :func:`mrtpo.fast_decode.sample` draws from the same seed
    (its random stream, not ``generate``'s), cut at the first end-of-sequence like the plain path."""
    import copy

    from mrtpo.fast_decode import sample
    from mrtpo.sampling import sample_group
    from mrtpo.testing import tiny_policy

    model, tok = tiny_policy(seed=0)
    prompt = tok("hello there", add_special_tokens=False)["input_ids"]
    torch.manual_seed(3)
    comps, lengths = sample_group(model, tok, prompt, 4, 10, fast=True)
    config = copy.deepcopy(model.generation_config)
    config.update(do_sample=True, temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=10, pad_token_id=tok.pad_token_id)
    ids = torch.tensor([prompt] * 4)
    torch.manual_seed(3)
    direct = sample(model, ids, torch.ones_like(ids), config)[:, len(prompt) :]
    for row, n, ref in zip(comps, lengths.tolist(), direct):
        assert row[:n].tolist() == ref[:n].tolist()
        assert (row[n:] == tok.pad_token_id).all()


def test_bench_signal_on_the_gym_writes_every_figure(tmp_path, capsys):
    from mrtpo.bench import main

    assert (
        main(
            [
                "signal",
                *_gym_args(
                    tmp_path,
                    "--methods",
                    "gdpo,mrtpo,twice=gdpo,shuffled=mrtpo-shuffled",
                    "--method-setting",
                    "mrtpo:lam=1",
                ),
            ]
        )
        == 0
    )
    record = json.loads((tmp_path / "signal.json").read_text())
    rows = {r["method"]: r for r in record["rows"]}
    assert record["reference"] == "gdpo" and record["groups"] == 4 and rows["mrtpo"]["credit"]["lam"] == 1.0
    assert rows["gdpo"]["g_eff"] == pytest.approx(1.0) and rows["gdpo"]["cos_to_ref"] == pytest.approx(1.0)
    # the same method on the same rollouts gives the same gradients
    assert rows["twice"]["snr"] == pytest.approx(rows["gdpo"]["snr"])
    assert rows["twice"]["cos_to_ref"] == pytest.approx(1.0)
    for name, reward in rows["gdpo"]["rewards"].items():  # uniform weights: ℓ = E[w²] = G = 1
        assert (reward["lift"], reward["mean_w2"], reward["predicted_g"]) == (pytest.approx(1.0),) * 3, name
    assert set(record["methods"]["mrtpo"]) >= {"snr", "cos_to_gdpo", "g_eff", "rewards"}
    assert set(next(iter(record["methods"]["mrtpo"]["rewards"].values()))) == {"lift", "mean_w2"}
    assert any(r["lift"] > 1.0 for r in rows["mrtpo"]["rewards"].values())
    assert "G_eff" in capsys.readouterr().out
