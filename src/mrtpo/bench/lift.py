"""``mrtpo bench lift``: does each method's credit land on the tokens a verifier reads? (docs/design.md#measurement)

For prompts of a task's train split, the policy samples a group of completions; every completion
is replayed once under all the contexts the credit methods need (the original prompt, each
reward's counterfactual, the joint counterfactual, and the policy's own entropy come with the
original). Each method's token weights for each reward (:meth:`CreditMethod.weights`, the same
weights training uses) are compared with the *checked span* of that reward in that completion —
the characters its verifier reads (task modules ``spans.py``: an end phrase, a keyword, a P.S.
block, a wrong argument value, a code fence) — through the lift of :func:`mrtpo.credit.lift.span_lift`:
the share of the reward's weight on the span over the span's share of the tokens (1 = uniform,
> 1 = the credit concentrates where the checker reads).

Printed per span kind and method (mean ± std over completions, median, share above 1) and written
as JSON (``runs/bench/lift-<task>.json``, with every completion's lifts and text).
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path

import torch

from mrtpo.bench import add_sampling_arguments, method_list, sample_and_weigh, write_record
from mrtpo.cli_help import HelpFormatter
from mrtpo.credit.lift import char_spans_to_tokens, span_lift, summarise_lifts
from mrtpo.known_positions import token_offsets

DEFAULT_METHODS = ("mrtpo", "contrast", "entropy", "gdpo")
#: completion caps: room for the spans (an instructions answer asks for 40-120 words)
DEFAULT_MAX_NEW_TOKENS = {"instructions": 192, "toolcall": 96, "sql": 64}


def _parse(argv):
    p = argparse.ArgumentParser(
        prog="mrtpo bench lift", description=__doc__.splitlines()[0], formatter_class=HelpFormatter
    )
    p.add_argument("--task", default="instructions", help="instructions, toolcall, sql or any task with checked_spans")
    add_sampling_arguments(p, prompts=8, max_new_tokens=None, methods=",".join(DEFAULT_METHODS), dtype="bfloat16")
    p.add_argument("--scan", type=int, default=500, help="train examples scanned for prompts with a span")
    p.add_argument("--out", type=Path, metavar="FILE", help="JSON record (default: runs/bench/lift-<task>.json)")
    return p.parse_args(argv)


def completion_lifts(weights: dict[str, torch.Tensor], names: list[str], spans, offsets) -> list[dict]:
    """Lifts of one completion: one row per checked span, with every method's lift.

    ``weights``: method -> ``(K, T)`` token weights of this completion (``T`` = its length);
    ``spans``: ``[(verifier name, kind, character spans)]``; ``offsets``: ``T`` character ranges.
    """
    rows = []
    t = len(offsets)
    mask = torch.ones(t)
    for name, kind, char_spans in spans:
        on_span = char_spans_to_tokens(offsets, char_spans)
        k = names.index(name)
        lifts = {m: span_lift(w[k, :t], on_span, mask) for m, w in weights.items()}
        if all(v is None for v in lifts.values()):
            continue
        rows.append({"reward": name, "kind": kind, "span_tokens": int(on_span.sum()), "tokens": t, "lift": lifts})
    return rows


def summarise(rows: list[dict], methods: list[str]) -> list[dict]:
    """One summary per span kind: count, mean span share of the tokens, lift statistics per method."""
    by_kind = defaultdict(list)
    for r in rows:
        by_kind[r["kind"]].append(r)
    out = []
    for kind, items in sorted(by_kind.items()):
        out.append(
            {
                "kind": kind,
                "n": len(items),
                "span_share": sum(r["span_tokens"] / r["tokens"] for r in items) / len(items),
                "lift": {
                    m: summarise_lifts([r["lift"][m] for r in items if r["lift"][m] is not None]) for m in methods
                },
            }
        )
    return out


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    from mrtpo.hub import prepare_hub

    prepare_hub()  # offline only where the user or the machine says so
    from tqdm.auto import tqdm

    from mrtpo.counterfactual import prompt_renderer
    from mrtpo.models import load_policy
    from mrtpo.task_base import implements
    from mrtpo.tasks import get_task

    methods = method_list(args.methods)
    max_new = args.max_new_tokens or DEFAULT_MAX_NEW_TOKENS.get(args.task, 128)
    out_path = args.out or Path("runs/bench") / f"lift-{args.task}.json"
    torch.manual_seed(args.seed)
    model, tok = load_policy(args.model, dtype=getattr(torch, args.dtype))
    model.eval()
    task = get_task(args.task)
    if not implements(task, "checked_spans"):
        print(f"mrtpo bench lift: task {args.task!r} defines no checked_spans(example, text)", file=sys.stderr)
        return 2
    verifiers = task.verifiers()
    names = [v.name for v in verifiers]
    render = prompt_renderer(task, tok)
    candidates = task.load("train", limit=args.scan)
    examples = [e for e in candidates if task.may_have_checked_spans(e)][: args.prompts]
    if not examples:
        print(
            f"mrtpo bench lift: none of the first {args.scan} {args.task} train examples can have a checked span",
            file=sys.stderr,
        )
        return 2

    rows = []
    for ex in tqdm(examples, desc=f"lift · {args.task}", unit="prompt"):
        group = sample_and_weigh(
            model, tok, ex, verifiers, render, methods, args.group_size, max_new, spans_of=task.checked_spans
        )
        comps, lengths, texts = group.completions, group.lengths, group.texts
        rewards, weights = group.rewards, group.weights
        for i, text in enumerate(texts):
            n = int(lengths[i])
            spans = task.checked_spans(ex, text)
            offsets = token_offsets(tok, comps[i, :n].tolist())
            for r in completion_lifts({m: w[i] for m, w in weights.items()}, names, spans, offsets):
                rows.append(
                    {
                        "example": ex.id,
                        "completion": i,
                        "reward_value": float(rewards[i, names.index(r["reward"])]),
                        **r,
                        "text": text,
                    }
                )

    summary = summarise(rows, methods)
    header = f"{'span kind':<22} {'n':>4} {'share':>6} " + " ".join(f"{m:>20}" for m in methods)
    print(
        f"\nlift = share of a reward's weight on its checked span / the span's share of tokens "
        f"(mean ± std over completions; 1 = uniform)\n{header}\n{'-' * len(header)}"
    )
    for s in summary:
        cells = []
        for m in methods:
            st = s["lift"][m]
            cells.append(f"{st['mean']:.2f} ± {st['std']:.2f} ({st['above_1']:.0%}>1)" if st["n"] else "—")
        print(f"{s['kind']:<22} {s['n']:>4} {s['span_share']:>6.2f} " + " ".join(f"{c:>20}" for c in cells))
    write_record(
        out_path,
        "credit lift on the verifier's checked span",
        "mrtpo bench lift " + " ".join(argv or []),
        rows,
        summary=summary,
        settings={k: str(v) for k, v in vars(args).items()},
        prompts=[e.id for e in examples],
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
