"""``mrtpo bench signal``: the policy gradient each credit method gives, before any training (issue 37).

The trainer of a task and model is built as ``mrtpo train`` builds it (a ``bench learn`` preset, then
``--model`` and ``key=value`` settings; LoRA for real models, every weight of the gym's policy). Its
policy samples ``--groups`` groups once; each group is replayed once under every context the methods
need (:func:`mrtpo.bench.sample_and_weigh`); each method then weighs the *same* completions, maps and
rewards, gets its advantages as training does (one ``CreditBatch`` per step of ``--step-groups``
groups: the batch statistics of a step) and takes one gradient per group over the trainable
parameters through the trainer's own loss (``MRTPOTrainer._compute_loss``, on-policy, dropout off),
every method's from one forward of the group (:func:`group_gradients`).

Reported per method (:mod:`mrtpo.credit.signal`): ``SNR = ‖ḡ‖² / (tr Σ̂ / N)`` over the ``N`` group
gradients, its excess ``SNR − 1`` (a method with no signal still has ``SNR ≈ 1``), ``cos(ḡ, ḡ_ref)``
with the reference method (gdpo when listed), ``G_eff = (SNR / SNR_ref) · cos²`` (and from the
excess), the pre-clip norm of a step's gradient and the share of steps above ``max_grad_norm``; per
reward the lift ``ℓ`` (mean weight on the known relevant tokens: the gym's ground truth, a real
task's checked spans as ``bench lift`` finds them), ``E[w²]`` and the predicted ``G = ℓ² / E[w²]``.
Intervals: percentile bootstrap over groups (every method on the same resample).

    mrtpo bench signal --task gym-constraints --groups 32 --methods gdpo,mrtpo,paper=mrtpo \\
        --method-setting paper:lam=1 --method-setting paper:w_max=null
    mrtpo bench signal --task instructions --model smollm2-135m --groups 8 --methods gdpo,mrtpo

A table on stdout and a JSON record (``runs/bench/signal-<task>.json``).
"""

from __future__ import annotations

import argparse
import dataclasses
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any
from unittest import mock

import torch

from mrtpo.bench import method_list, sample_and_weigh, write_record
from mrtpo.cli_help import HelpFormatter
from mrtpo.credit import CreditBatch, CreditConfig, get_method
from mrtpo.credit.signal import (
    bootstrap_counts,
    cross_gram,
    gram,
    group_sums,
    lift_and_mean_square,
    percentile_interval,
    pooled,
    predicted_gain,
    signal_stats,
)
from mrtpo.task_base import implements

#: Credit settings ``--method-setting LABEL:key=value`` may give one method (the rest is shared).
CREDIT_KEYS = ("lam", "reward_lam", "w_max", "weighting", "rank_power", "weight_mean")


def _parse(argv):
    p = argparse.ArgumentParser(
        prog="mrtpo bench signal",
        description=__doc__.splitlines()[0],
        formatter_class=HelpFormatter,
        epilog="Any training key can follow as key=value (e.g. num_generations=8).",
    )
    p.add_argument("--task", default="gym-constraints", help="a registered task (gym-*, instructions, ...) or .yaml")
    p.add_argument("--model", help="preset, local dir or hub id (default: the preset's; gym: the task's policy)")
    p.add_argument("--preset", help="bench learn preset or YAML (default: gym for gym-* tasks, else cpu)")
    p.add_argument(
        "--methods",
        default="gdpo,mrtpo",
        help="comma-separated credit methods; LABEL=METHOD adds a variant under its own name",
    )
    p.add_argument(
        "--method-setting",
        action="append",
        default=[],
        metavar="LABEL:key=value",
        help=f"a credit setting for one method ({', '.join(CREDIT_KEYS)}); repeatable",
    )
    p.add_argument("--groups", type=int, default=32, help="prompt groups sampled (one gradient each per method)")
    p.add_argument("--step-groups", type=int, help="groups per training step (default: the preset's batch)")
    p.add_argument("--seed", type=int, default=0, help="sampling seed")
    p.add_argument("--bootstrap", type=int, default=1000, help="bootstrap resamples over groups")
    p.add_argument("--out", type=Path, metavar="FILE", help="JSON record (default: runs/bench/signal-<task>.json)")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="training settings")
    return p.parse_args(argv)


def method_configs(entries: list[str], settings: list[str], base: CreditConfig) -> dict[str, tuple[str, CreditConfig]]:
    """``{label: (registered method, its CreditConfig)}`` from ``--methods`` entries (``m`` or
    ``LABEL=m``) and ``--method-setting LABEL:key=value`` (credit keys only, over ``base``)."""
    from mrtpo.bench.learn.plan import method_variants
    from mrtpo.config import parse_overrides

    labels, bases = method_variants(entries)
    method_list(",".join(bases.get(label, label) for label in labels))  # unknown method names fail here
    own: dict[str, dict[str, Any]] = {label: {} for label in labels}
    for item in settings:
        label, sep, setting = item.partition(":")
        if not sep or label not in own:
            raise ValueError(f"--method-setting {item!r}: want LABEL:key=value with LABEL one of {labels}")
        values = parse_overrides([setting])
        bad = sorted(set(values) - set(CREDIT_KEYS))
        if bad:
            raise ValueError(
                f"--method-setting {item!r}: only credit settings ({', '.join(CREDIT_KEYS)}) differ "
                "between methods here (one sampled batch); give others as key=value for all"
            )
        own[label].update(values)
    return {label: (bases.get(label, label), dataclasses.replace(base, **own[label])) for label in labels}


def relevant_mask(
    task: Any, example: Any, verifiers: list[Any], texts: list[str], ids: list[list[int]], width: int, tokenizer: Any
) -> torch.Tensor | None:
    """``(G, K, T)`` bool: the tokens each reward is known to read in each completion
    (:func:`mrtpo.known_positions.known_position_mask`: a gym verifier's ground truth, else the task's
    ``checked_spans`` mapped to tokens as ``bench lift`` does); ``None`` when the task knows none."""
    from mrtpo.known_positions import known_position_mask, knows_positions

    spans_of = task.checked_spans if implements(task, "checked_spans") else None
    if not any(knows_positions(v, spans_of) for v in verifiers):
        return None
    return known_position_mask(verifiers, [example] * len(texts), texts, ids, width, tokenizer, spans_of).bool()


def _pad(tensors: list[torch.Tensor | None], width: int) -> torch.Tensor | None:
    """Concatenate ``(G, ..., T_i)`` tensors along rows after right-padding the last dim to ``width``."""
    if any(t is None for t in tensors):
        return None
    return torch.cat([torch.nn.functional.pad(t, (0, width - t.shape[-1])) for t in tensors])


def step_batch(groups: list[Any], relevant: list[torch.Tensor | None], group_size: int) -> CreditBatch:
    """One training step's :class:`CreditBatch` from its sampled groups (maps padded to the longest)."""
    width = max(g.completions.shape[1] for g in groups)
    fields = {key: _pad([g.maps.get(key) for g in groups], width) for key in groups[0].maps if key != "has_evidence"}
    masks = [(torch.arange(width).unsqueeze(0) < g.lengths.view(-1, 1)).float() for g in groups]
    extra = {}
    if "known_positions" in CreditBatch.__dataclass_fields__ and all(r is not None for r in relevant):
        extra["known_positions"] = _pad([r.float() for r in relevant], width)  # what an oracle method reads
    return CreditBatch(
        torch.cat([g.rewards for g in groups]),
        group_size,
        torch.cat(masks),
        has_evidence=torch.cat([g.maps["has_evidence"] for g in groups]),
        **fields,
        **extra,
    )


def loss_inputs(
    trainer: Any, prompt: list[int], completions: torch.Tensor, lengths: torch.Tensor, advantages, sequence
) -> dict[str, Any]:
    """The trainer's loss inputs for one group: ``prompt`` ids, ``completions`` ``(G, T)``, ``lengths``
    ``(G,)``, token ``advantages`` ``(G, ≥T)``, ``sequence`` advantages ``(G,)``; on-policy (no old
    log-probabilities: ratio 1), normalised by the group's own token count."""
    from mrtpo.trainer.config import SEQUENCE_ADVANTAGES_KEY

    g, t = completions.shape
    mask = (torch.arange(t).unsqueeze(0) < lengths.view(-1, 1)).long()
    prompt_ids = torch.tensor([prompt] * g)
    inputs = {
        "prompt_ids": prompt_ids,
        "prompt_mask": torch.ones_like(prompt_ids),
        "completion_ids": completions,
        "completion_mask": mask,
        "advantages": advantages[:, :t],
        SEQUENCE_ADVANTAGES_KEY: sequence,
        "num_items_in_batch": mask.sum(),
        "old_per_token_logps": None,
    }
    device = trainer.accelerator.device
    return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}


def loss_coefficients(
    trainer: Any, inputs: dict[str, Any], logps: torch.Tensor, entropies: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(∂loss/∂logps, ∂loss/∂entropies)``, each ``(G, T)``: the trainer's own loss
    (``MRTPOTrainer._compute_loss``, TRL's clipping, masks and normalisation included) evaluated on the
    given per-token log-probabilities and entropies in place of its forward, no model call. The loss
    reaches the parameters only through those two (no MoE aux loss), so by the chain rule its gradient
    is ``Jᵀ`` of these coefficients, exactly, whatever the loss does with them."""
    leaves = logps.detach().requires_grad_(), entropies.detach().requires_grad_()
    with mock.patch.object(trainer, "_get_per_token_logps_and_entropies", lambda *a, **k: (*leaves, None)):
        loss = trainer._compute_loss(trainer.model, inputs)
    grads = torch.autograd.grad(loss, leaves, allow_unused=True)
    return tuple(torch.zeros_like(x) if d is None else d for x, d in zip(leaves, grads))


def group_gradients(
    trainer: Any,
    params: list[torch.nn.Parameter],
    prompt: list[int],
    completions: torch.Tensor,
    lengths: torch.Tensor,
    advantages: list[torch.Tensor],
    sequences: list[torch.Tensor],
) -> torch.Tensor:
    """``(M, P)`` float32 gradients of the trainer's loss on one group under each of ``M`` methods'
    token ``advantages`` ``(G, ≥T)`` and ``sequences`` ``(G,)`` (:func:`loss_inputs`), from ONE forward:
    each method's :func:`loss_coefficients` on the forward's log-probabilities and entropies, then one
    backward per method through the retained graph (``is_grads_batched`` cannot run here: TRL's fused
    log-prob head's backward adds in place, which vmap refuses). In eval mode (no dropout); the same
    gradients as ``M`` separate losses, to float rounding."""
    if getattr(trainer, "aux_loss_enabled", False):
        raise ValueError("bench signal: a loss with an MoE aux loss does not reach the parameters through log-probs")
    inputs = [loss_inputs(trainer, prompt, completions, lengths, a, s) for a, s in zip(advantages, sequences)]
    first = inputs[0]
    ids = torch.cat([first["prompt_ids"], first["completion_ids"]], 1)
    attention = torch.cat([first["prompt_mask"], first["completion_mask"]], 1)
    with torch.enable_grad():
        logps, entropies, _ = trainer._get_per_token_logps_and_entropies(
            trainer.model, ids, attention, completions.shape[1], compute_entropy=True
        )
    rows = [loss_coefficients(trainer, x, logps, entropies) for x in inputs]
    outputs, seeds = [logps], [torch.stack([r[0] for r in rows])]
    d_entropy = torch.stack([r[1] for r in rows])
    if entropies.requires_grad and bool(d_entropy.any()):  # an entropy bonus: its own share of the gradient
        outputs.append(entropies)
        seeds.append(d_entropy)
    out = torch.zeros(len(inputs), sum(p.numel() for p in params))
    for m in range(len(inputs)):
        grads = torch.autograd.grad(
            outputs, params, [seed[m] for seed in seeds], retain_graph=m < len(inputs) - 1, allow_unused=True
        )
        out[m] = torch.cat(
            [(torch.zeros_like(p) if d is None else d).reshape(-1).float().cpu() for p, d in zip(params, grads)]
        )
    return out


def _config(args, output_dir: Path):
    from mrtpo.bench.learn.plan import read_preset, resolve_preset
    from mrtpo.config import load_config, parse_overrides

    preset = args.preset or ("gym" if args.task.startswith("gym-") else "cpu")
    train, _ = read_preset(resolve_preset(preset), args.task)
    settings = {
        **train,
        "task": args.task,
        "method": "gdpo",
        "max_steps": 1,
        "seed": args.seed,
        "output_dir": str(output_dir),
        "save_strategy": "no",
        "report": False,
        "report_to": "none",
        "credit_samples": 0,
        **({"model": args.model} if args.model else {}),
        **parse_overrides(args.overrides),
    }
    return load_config(overrides=settings), preset


def summarise(
    grads: dict[str, torch.Tensor],
    lifts: dict[str, dict[str, list[list[tuple[float, float]]]]],
    step_norms: dict[str, list[float]],
    reference: str,
    resamples: int,
    max_grad_norm: float | None,
    seed: int = 0,
) -> dict[str, dict[str, Any]]:
    """Per method: the signal statistics with bootstrap intervals over groups (every method on the same
    resamples), the step gradient norm and clip rate, and per reward ``lift``, ``mean_w2``,
    ``predicted_g`` with intervals.

    ``grads``: method -> ``(N, P)`` group gradients; ``lifts``: method -> reward -> per group a list of
    ``(ℓ, E[w²])`` per completion; ``step_norms``: method -> pre-clip norm of each step's gradient."""
    n = next(iter(grads.values())).shape[0]
    grams = {m: gram(g) for m, g in grads.items()}
    cross = {m: cross_gram(g, grads[reference]) for m, g in grads.items()}

    sums = {
        (m, name): (
            group_sums([[v[0] for v in g] for g in per_group]),
            group_sums([[v[1] for v in g] for g in per_group]),
        )
        for m, per_reward in lifts.items()
        for name, per_group in per_reward.items()
    }

    def figures(counts: torch.Tensor) -> dict[str, dict[str, float]]:
        out = signal_stats(grams, cross, reference, counts)
        for m, per_reward in lifts.items():
            for name in per_reward:
                (lift_sums, sizes), (w2_sums, _) = sums[(m, name)]
                lift, w2 = pooled(lift_sums, sizes, counts), pooled(w2_sums, sizes, counts)
                out[m].update(
                    {f"{name}/lift": lift, f"{name}/mean_w2": w2, f"{name}/predicted_g": predicted_gain(lift, w2)}
                )
        return out

    point = figures(torch.ones(n, dtype=torch.float64))
    draws = [figures(c) for c in bootstrap_counts(n, resamples, seed)]
    result: dict[str, dict[str, Any]] = {}
    for m in grads:
        ci = {key: percentile_interval([d[m][key] for d in draws]) for key in point[m]}
        row: dict[str, Any] = {}
        for key in ("snr", "snr_excess", "cos_to_ref", "g_eff", "g_eff_excess"):
            row[key], row[f"{key}_ci"] = point[m][key], ci[key]
        norms = step_norms[m]
        row["grad_norm"] = sum(norms) / len(norms)
        row["clip_rate"] = None if max_grad_norm is None else sum(v > max_grad_norm for v in norms) / len(norms)
        row["rewards"] = {}
        for name, per_group in lifts[m].items():
            groups = sum(bool(g) for g in per_group)
            reward: dict[str, Any] = {"n": sum(len(g) for g in per_group), "groups": groups}
            for key in ("lift", "mean_w2", "predicted_g"):  # one group with values: no interval over groups
                reward[key] = point[m][f"{name}/{key}"]
                reward[f"{key}_ci"] = ci[f"{name}/{key}"] if groups > 1 else (float("nan"), float("nan"))
            row["rewards"][name] = reward
        result[m] = row
    return result


def _ci(value: float, ci: tuple[float, float], spec: str = "{:.2f}") -> str:
    return f"{spec.format(value)} [{spec.format(ci[0])}, {spec.format(ci[1])}]"


def print_table(stats: dict[str, dict[str, Any]], reference: str) -> None:
    header = (
        f"{'method':<14} {'SNR [95%]':>22} {'SNR-1':>7} {'cos(ref)':>9} {'G_eff [95%]':>22} "
        f"{'G_eff(SNR-1) [95%]':>24} {'|g| step':>9} {'clip':>5}"
    )
    print(
        f"\ngradient signal per method (reference {reference}; intervals: bootstrap over groups)\n{header}\n"
        f"{'-' * len(header)}"
    )
    for m, r in stats.items():
        clip = "—" if r["clip_rate"] is None else f"{r['clip_rate']:.0%}"
        print(
            f"{m:<14} {_ci(r['snr'], r['snr_ci']):>22} {r['snr_excess']:>7.2f} {r['cos_to_ref']:>9.3f} "
            f"{_ci(r['g_eff'], r['g_eff_ci']):>22} {_ci(r['g_eff_excess'], r['g_eff_excess_ci']):>24} "
            f"{r['grad_norm']:>9.3g} {clip:>5}"
        )
    rewards = list(next(iter(stats.values()))["rewards"])
    if rewards:
        print("\nper reward: lift ℓ (mean weight on the known relevant tokens) / E[w²] / predicted G = ℓ²/E[w²]")
        print(f"{'method':<14} " + " ".join(f"{name:>22}" for name in rewards))
        for m, r in stats.items():
            cells = [f"{v['lift']:.2f}/{v['mean_w2']:.2f}/{v['predicted_g']:.2f}" for v in r["rewards"].values()]
            print(f"{m:<14} " + " ".join(f"{c:>22}" for c in cells))


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    from mrtpo.hub import prepare_hub

    prepare_hub()  # offline only where the user or the machine says so
    from mrtpo.train import build_trainer

    scratch = Path(tempfile.mkdtemp(prefix="mrtpo-bench-signal-"))
    try:
        config, preset = _config(args, scratch)
        return _run(args, argv, build_trainer(config), f"{config.run.model} (preset {preset})")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _run(args, argv, trainer, model_name: str) -> int:
    from mrtpo.counterfactual import prompt_renderer
    from mrtpo.replay_plan import choose_decoys

    task, tok, model = trainer.mrtpo_task, trainer.processing_class, trainer.model
    methods = method_configs(args.methods.split(","), args.method_setting, trainer.credit_config)
    reference = "gdpo" if "gdpo" in methods else next(iter(methods))
    g_size = trainer.num_generations
    step_groups = args.step_groups or max(1, trainer.args.generation_batch_size // g_size)
    max_new = trainer.max_completion_length
    verifiers = task.verifiers()
    names = [v.name for v in verifiers]
    render = prompt_renderer(task, tok)
    filtered = implements(task, "checked_spans")  # prompts that can have a checked span, as bench lift picks
    candidates = task.load("train", 50 * args.groups if filtered else args.groups)
    examples = [e for e in candidates if not filtered or task.may_have_checked_spans(e)][: args.groups]
    if len(examples) < 2:
        print(
            f"mrtpo bench signal: {len(examples)} usable {args.task} train examples; need at least 2", file=sys.stderr
        )
        return 2
    model.eval()
    params = [p for p in model.parameters() if p.requires_grad]
    needed = sorted({m for m, _ in methods.values()})
    torch.manual_seed(args.seed)
    size = sum(p.numel() for p in params)  # every group gradient of every method, held once (no stacking copy)
    grads = {label: torch.zeros(len(examples), size) for label in methods}
    lifts = {label: {name: [] for name in names} for label in methods}
    step_norms = {label: [] for label in methods}
    evidences = [[v.evidence(ex) for v in verifiers] for ex in examples]
    timing = {"sample_and_replay": 0.0, "gradients": 0.0}
    print(
        f"mrtpo bench signal: {args.task}, model {model_name}, "
        f"{len(examples)} groups x {g_size}, {step_groups} groups per step, {size:,} "
        f"trainable parameters, methods {', '.join(methods)}"
    )
    for start in range(0, len(examples), step_groups):
        chunk = range(start, min(start + step_groups, len(examples)))
        began = time.perf_counter()
        groups, relevant = [], []
        for i in chunk:
            decoys = choose_decoys([evidences[i], evidences[(i + 1) % len(examples)]])[0]
            group = sample_and_weigh(
                model,
                tok,
                examples[i],
                verifiers,
                render,
                needed,
                g_size,
                max_new,
                trainer.credit_config,
                kind=trainer.args.relevance,
                decoys=decoys,
                temperature=trainer.temperature,
                fast=trainer.args.fast_generation,
            )
            groups.append(group)
            ids = [c[:n].tolist() for c, n in zip(group.completions, group.lengths.tolist())]
            relevant.append(
                relevant_mask(task, examples[i], verifiers, group.texts, ids, group.completions.shape[1], tok)
            )
        timing["sample_and_replay"] += time.perf_counter() - began
        began = time.perf_counter()
        batch = step_batch(groups, relevant, g_size)
        labels = list(methods)
        advantages, weights, sequence = {}, {}, {}
        for label, (name, config) in methods.items():
            method = get_method(name)
            advantages[label], weights[label] = method(batch, config), method.weights(batch, config)
            sequence[label] = method.sequence_advantages(batch, config)
        step_sum, step_tokens = 0.0, 0
        for j, group in enumerate(groups):
            rows = slice(j * g_size, (j + 1) * g_size)
            per_method = group_gradients(
                trainer,
                params,
                group.contexts[0],
                group.completions,
                group.lengths,
                [advantages[m][rows] for m in labels],
                [sequence[m][rows] for m in labels],
            )
            tokens = int(group.lengths.sum())
            step_sum, step_tokens = step_sum + per_method * tokens, step_tokens + tokens
            for label, grad in zip(labels, per_method):
                grads[label][start + j] = grad
                if relevant[j] is None:
                    continue
                for k, name_k in enumerate(names):
                    values = []
                    for c in range(g_size):
                        t = int(group.lengths[c])
                        w = weights[label][rows][c, k, :t]
                        got = lift_and_mean_square(w, relevant[j][c, k, :t], torch.ones(t))
                        if got is not None:
                            values.append(got)
                    lifts[label][name_k].append(values)
        for label, total in zip(labels, step_sum / max(step_tokens, 1)):
            step_norms[label].append(float(total.norm()))
        timing["gradients"] += time.perf_counter() - began
        print(
            f"  groups {chunk.start + 1}-{chunk.stop} of {len(examples)} "
            f"({timing['sample_and_replay']:.0f} s sampling and replay, {timing['gradients']:.0f} s gradients)"
        )
    lifts = {m: {k: v for k, v in per.items() if v} for m, per in lifts.items()}
    stats = summarise(grads, lifts, step_norms, reference, args.bootstrap, trainer.args.max_grad_norm, args.seed)
    print_table(stats, reference)
    out = args.out or Path("runs/bench") / f"signal-{Path(args.task).stem}.json"
    rows = [
        {
            "method": label,
            "base": methods[label][0],
            "credit": {k: getattr(methods[label][1], k) for k in CREDIT_KEYS},
            **stats[label],
        }
        for label in methods
    ]
    write_record(
        out,
        "gradient signal per credit method",
        "mrtpo bench signal " + " ".join(argv or sys.argv[1:]),
        rows,
        methods={
            r["method"]: {
                "snr": r["snr"],
                "cos_to_gdpo": r["cos_to_ref"],
                "g_eff": r["g_eff"],
                "g_eff_excess": r["g_eff_excess"],
                "rewards": {k: {"lift": v["lift"], "mean_w2": v["mean_w2"]} for k, v in r["rewards"].items()},
            }
            for r in rows
        },
        reference=reference,
        groups=len(examples),
        group_size=g_size,
        step_groups=step_groups,
        model=model_name,
        parameters=size,
        timing_s=timing,
        prompts=[e.id for e in examples],
        settings={k: str(v) for k, v in vars(args).items()},
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
