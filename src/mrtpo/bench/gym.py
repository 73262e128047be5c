"""``mrtpo bench gym``: credit precision against ground truth on the credit gym (before any learning).

For prompts of a gym task's train split, the warm-started tiny policy samples a group of completions;
every completion is replayed once under all the contexts the credit methods need (as ``bench lift``
does), and each method's token weights for each reward are compared with that reward's
*ground-truth relevant positions* (:meth:`mrtpo.gym.task.GymTask.relevant_positions`: where a
required word occurs, the first word, the first wrong item, a wrong argument value, the end-of-turn
token of a length rule). Two numbers per (reward, method), over completions:

- **precision lift**: share of the reward's weight on its relevant positions ÷ their share of the
  tokens (:func:`mrtpo.credit.lift.span_lift`; 1 = uniform, what GRPO and GDPO give);
- **rank correlation**: Spearman's ρ between the weights and the 0/1 relevance indicator (0 =
  unrelated; undefined when the weights or the indicator are constant, e.g. uniform weights).

It also says whether the policy *conditions* on each reward's evidence (what the replays read): the
reward's rate over a group sampled with the evidence (the prompt, or the prompt plus the privileged
reference) against a group sampled without it, and the share of groups where the reward has spread.

    mrtpo bench gym --task gym-constraints --prompts 32 --group-size 8
    mrtpo bench gym --task gym-answer --methods mrtpo,contrast,entropy --lam 0.5

Printed per reward and method, written as JSON (``runs/bench/gym-precision-<task>.json``).
"""

from __future__ import annotations

import argparse
import math
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch

from mrtpo.bench import add_sampling_arguments, method_list, sample_and_weigh, write_record
from mrtpo.cli_help import HelpFormatter
from mrtpo.credit import RELEVANCE_KINDS, CreditConfig
from mrtpo.credit.lift import span_lift, summarise_lifts

DEFAULT_METHODS = ("mrtpo", "contrast", "entropy", "gdpo")


def _parse(argv):
    p = argparse.ArgumentParser(
        prog="mrtpo bench gym", description=__doc__.splitlines()[0], formatter_class=HelpFormatter
    )
    p.add_argument("--task", default="gym-constraints", help="a gym task (any registered gym-* family)")
    p.add_argument(
        "--task-arg",
        action="append",
        default=[],
        metavar="key=value",
        help="a gym setting, e.g. num_clauses=4 (repeatable)",
    )
    add_sampling_arguments(p, prompts=32, max_new_tokens=None, methods=",".join(DEFAULT_METHODS), dtype="float32")
    p.set_defaults(model="gym", group_size=8)
    p.add_argument("--lam", type=float, default=1.0, help="λ of the weights (1: proportional to relevance)")
    p.add_argument("--relevance", default="js", choices=RELEVANCE_KINDS, help="relevance of a replay")
    p.add_argument(
        "--out", type=Path, metavar="FILE", help="JSON record (default: runs/bench/gym-precision-<task>.json)"
    )
    return p.parse_args(argv)


def rank_correlation(weights: torch.Tensor, relevant: torch.Tensor) -> float | None:
    """Spearman's ρ between ``weights`` ``(T,)`` and the bool ``relevant`` ``(T,)`` (average ranks for
    ties); ``None`` when either is constant."""
    from scipy.stats import spearmanr

    w, r = weights.double().numpy(), relevant.double().numpy()
    if len(w) < 2 or w.std() == 0 or r.std() == 0:
        return None
    rho = spearmanr(w, r).statistic
    return None if math.isnan(rho) else float(rho)


def completion_precision(
    weights: dict[str, torch.Tensor], names: list[str], truth: dict[str, list[int]], length: int
) -> list[dict[str, Any]]:
    """One row per reward with a defined lift: its lift and rank correlation under every method.

    ``weights``: method -> ``(K, T)`` token weights of one completion (``T`` ≥ ``length``); ``truth``:
    reward name -> relevant token positions (indices < ``length``).
    """
    mask = torch.ones(length)
    rows = []
    for k, name in enumerate(names):
        relevant = torch.zeros(length, dtype=torch.bool)
        positions = [p for p in truth.get(name, []) if p < length]
        relevant[positions] = True
        lifts = {m: span_lift(w[k, :length], relevant, mask) for m, w in weights.items()}
        if all(v is None for v in lifts.values()):
            continue
        rhos = {m: rank_correlation(w[k, :length], relevant) for m, w in weights.items()}
        rows.append({"reward": name, "relevant": len(positions), "tokens": length, "lift": lifts, "rho": rhos})
    return rows


def summarise(rows: list[dict], methods: list[str], by: str = "reward") -> list[dict]:
    """Per reward (or per ``by`` key of the rows, e.g. the clause ``kind``): count, relevant share, lift
    statistics and mean ρ per method."""
    by_reward = defaultdict(list)
    for r in rows:
        by_reward[r[by]].append(r)
    out = []
    for reward, items in sorted(by_reward.items()):
        rho = {}
        for m in methods:
            values = [r["rho"][m] for r in items if r["rho"][m] is not None]
            rho[m] = {"n": len(values), "mean": sum(values) / len(values) if values else None}
        out.append(
            {
                "reward": reward,
                "n": len(items),
                "relevant_share": sum(r["relevant"] / r["tokens"] for r in items) / len(items),
                "lift": {
                    m: summarise_lifts([r["lift"][m] for r in items if r["lift"][m] is not None]) for m in methods
                },
                "rho": rho,
            }
        )
    return out


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    from mrtpo.hub import prepare_hub

    prepare_hub()  # offline only where the user or the machine says so
    from tqdm.auto import tqdm

    from mrtpo.config import parse_overrides
    from mrtpo.counterfactual import prompt_renderer
    from mrtpo.models import load_policy
    from mrtpo.replay_plan import choose_decoys
    from mrtpo.sampling import sample_group
    from mrtpo.task_base import implements
    from mrtpo.tasks import get_task

    methods = method_list(args.methods)
    task = get_task(args.task, **parse_overrides(args.task_arg))
    if not implements(task, "relevant_positions"):
        print(
            f"mrtpo bench gym: task {args.task!r} reports no ground-truth relevant positions (use a gym-* task)",
            file=sys.stderr,
        )
        return 2
    torch.manual_seed(args.seed)
    if args.model == "gym":
        model, tok = task.policy(getattr(torch, args.dtype))
    else:
        model, tok = load_policy(args.model, dtype=getattr(torch, args.dtype))
    model.eval()
    verifiers = task.verifiers()
    names = [v.name for v in verifiers]
    render = prompt_renderer(task, tok)
    max_new = args.max_new_tokens or task.max_new_tokens
    config = CreditConfig(lam=args.lam)

    rows, conditioning = [], defaultdict(lambda: {"with": [], "without": [], "spread": []})
    examples = list(task.load("train", args.prompts))
    evidences = [[v.evidence(ex) for v in verifiers] for ex in examples]
    for i, ex in enumerate(tqdm(examples, desc=f"precision · {args.task}", unit="prompt")):
        # a contrasting method's decoys come from the next prompt, as from the next group of a training batch
        decoys = choose_decoys([evidences[i], evidences[(i + 1) % len(examples)]])[0]
        group = sample_and_weigh(
            model,
            tok,
            ex,
            verifiers,
            render,
            methods,
            args.group_size,
            max_new,
            config,
            kind=args.relevance,
            decoys=decoys,
        )
        texts, lengths, rewards, weights = group.texts, group.lengths, group.rewards, group.weights
        for c, name in enumerate(group.present):
            k = names.index(name)
            other, other_n = sample_group(model, tok, group.contexts[1 + c], args.group_size, max_new)
            other_rate = (
                sum(
                    float(verifiers[k](tok.decode(o[:n].tolist(), skip_special_tokens=True), ex) or 0.0)
                    for o, n in zip(other, other_n.tolist())
                )
                / args.group_size
            )
            base_rate = float(torch.nan_to_num(rewards[:, k]).mean())
            in_prompt = group.placements[c] == "in_prompt"
            with_ev, without_ev = (base_rate, other_rate) if in_prompt else (other_rate, base_rate)
            conditioning[name]["with"].append(with_ev)
            conditioning[name]["without"].append(without_ev)
        for k, name in enumerate(names):
            conditioning[name]["spread"].append(float(torch.nan_to_num(rewards[:, k]).std() > 0))
        for i, text in enumerate(texts):
            truth = task.relevant_positions(ex, text.split())
            for r in completion_precision({m: w[i] for m, w in weights.items()}, names, truth, int(lengths[i])):
                rows.append(
                    {
                        "example": ex.id,
                        "completion": i,
                        "reward_value": float(rewards[i, names.index(r["reward"])]),
                        "kind": task.reward_kind(ex, r["reward"]),
                        **r,
                        "text": text,
                    }
                )

    summary = summarise(rows, methods)
    by_kind = summarise(rows, methods, by="kind")
    evidence_table = {
        name: {key: sum(v) / len(v) if v else None for key, v in c.items()} for name, c in sorted(conditioning.items())
    }
    print("\ndoes the policy condition on the evidence? mean reward sampled with / without it; groups with spread")
    for name, c in evidence_table.items():
        with_ev = "—" if c["with"] is None else f"{c['with']:.2f}"
        without_ev = "—" if c["without"] is None else f"{c['without']:.2f}"
        print(f"  {name:<12} with {with_ev}  without {without_ev}  spread {c['spread']:.2f}")
    header = f"{'reward':<12} {'n':>4} {'share':>6} " + " ".join(f"{m:>24}" for m in methods)
    print(
        f"\nprecision lift (weight share on the ground-truth positions / their token share; 1 = uniform), "
        f"mean ± std [Spearman ρ]\n{header}\n{'-' * len(header)}"
    )
    for s in summary + ([] if [s["reward"] for s in by_kind] == [s["reward"] for s in summary] else by_kind):
        cells = []
        for m in methods:
            st, rho = s["lift"][m], s["rho"][m]["mean"]
            cells.append(
                f"{st['mean']:.2f} ± {st['std']:.2f} [{'—' if rho is None else f'{rho:+.2f}'}]" if st["n"] else "—"
            )
        print(f"{s['reward']:<12} {s['n']:>4} {s['relevant_share']:>6.2f} " + " ".join(f"{c:>24}" for c in cells))
    out = args.out or Path("runs/bench") / f"gym-precision-{args.task}.json"
    write_record(
        out,
        "credit precision against the gym's ground truth",
        "mrtpo bench gym " + " ".join(argv or []),
        rows,
        summary=summary,
        by_kind=by_kind,
        conditioning=evidence_table,
        settings={k: str(v) for k, v in vars(args).items()},
        task=task.cache_key(),
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
