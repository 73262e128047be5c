"""``mrtpo demo``: one MRTPO credit-assignment step on a real model and task, shown token by token.

Samples a group of completions for one training prompt, scores them with the task's verifiers,
replays the whole group once per context (the prompt, and the prompt with or without each
reward's evidence: the contexts the trainer plans, :mod:`mrtpo.replay_plan`), and turns the JS
distances into the registered ``mrtpo`` method's per-reward token weights and per-token advantages
(:mod:`mrtpo.credit`, as training computes them; next to GDPO's uniform ones). Prints where each reward's
credit went and writes an HTML token-credit view plus a JSON record.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import torch

from mrtpo.cli_help import HelpFormatter

#: The credit method whose replays, weights and advantages the demo shows (the registered one, as training runs it).
METHOD = "mrtpo"


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="mrtpo demo", description=__doc__.splitlines()[0], formatter_class=HelpFormatter
    )
    parser.add_argument("--model", default="qwen2.5-coder-0.5b", help="preset, local dir, .gguf file or hub id")
    parser.add_argument("--task", default="toolcall", help="task name (toolcall, instructions, sql)")
    parser.add_argument("--split", default="train", help="split to draw the prompt from")
    parser.add_argument("--index", type=int, default=0, help="which example of the split")
    parser.add_argument("--group-size", type=int, default=4, help="completions sampled for the prompt")
    parser.add_argument("--max-new-tokens", type=int, default=96, help="completion length cap")
    parser.add_argument("--temperature", type=float, default=1.0, help="sampling and replay temperature")
    parser.add_argument("--seed", type=int, default=0, help="sampling seed")
    parser.add_argument(
        "--output-dir", "--out", dest="out", type=Path, default=Path("runs/demo"), metavar="DIR", help="output folder"
    )
    return parser.parse_args(argv)


def _show_tokens(tokenizer, ids: list[int]) -> list[str]:
    return [tokenizer.decode([i]) for i in ids]


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    from mrtpo.hub import prepare_hub

    prepare_hub()  # offline only where the user or the machine says so
    from tqdm import tqdm

    from mrtpo.counterfactual import DEFAULT_PRIVILEGED_HEADER, prompt_renderer
    from mrtpo.credit import DEFAULT_LAM, DEFAULT_W_MAX, CreditBatch, CreditConfig, compute_advantages, get_method
    from mrtpo.models import load_policy
    from mrtpo.replay import run_replay_plan
    from mrtpo.replay_plan import example_contexts, plan_replays
    from mrtpo.report.token_view import CompletionView, CreditRow, render_html
    from mrtpo.sampling import sample_group
    from mrtpo.tasks import get_task

    torch.manual_seed(args.seed)
    steps = tqdm(total=5, desc="demo", unit="step", file=sys.stderr)
    t0 = time.perf_counter()
    steps.set_postfix_str(f"loading {args.model}")
    model, tokenizer = load_policy(args.model)
    task = get_task(args.task)
    example = task.load(args.split, limit=args.index + 1)[args.index]
    verifiers = task.verifiers()
    render = prompt_renderer(task, tokenizer)
    prompt = render(example)

    def ids_of(text: str) -> list[int]:
        return list(tokenizer(text, add_special_tokens=False)["input_ids"])

    steps.update()

    steps.set_postfix_str(f"sampling {args.group_size} completions")
    prompt_ids = ids_of(prompt)
    sampled, lengths = sample_group(
        model, tokenizer, prompt_ids, args.group_size, args.max_new_tokens, args.temperature
    )
    completions = [row[:n].tolist() for row, n in zip(sampled, lengths.tolist())]
    texts = [tokenizer.decode(ids, skip_special_tokens=True) for ids in completions]
    steps.update()

    steps.set_postfix_str("scoring")
    rewards = torch.tensor(
        [[float("nan") if (r := v(text, example)) is None else float(r) for v in verifiers] for text in texts]
    )
    evidences = [v.evidence(example) for v in verifiers]
    names = [v.name for v in verifiers]
    steps.update()

    credit = get_method(METHOD)
    t_max = sampled.shape[1]
    plan = plan_replays([list(range(len(completions)))], [evidences], lengths.tolist(), credit.needs)
    (group,) = plan.groups
    steps.set_postfix_str(f"replaying the group ({1 + len(group.counterfactuals)} contexts)")
    maps = run_replay_plan(
        model,
        plan,
        lambda g: example_contexts(g, example, names, render, ids_of),
        sampled,
        lengths,
        temperature=args.temperature,
    )
    mask = (torch.arange(t_max).unsqueeze(0) < lengths.view(-1, 1)).float()
    relevance = maps["relevance"]
    steps.update()

    batch = CreditBatch(rewards, args.group_size, mask, **maps)
    shape = CreditConfig(lam=DEFAULT_LAM, w_max=DEFAULT_W_MAX)  # training's default weight shape
    mrtpo_adv = credit(batch, shape)
    gdpo_adv = compute_advantages("gdpo", batch)
    weights = credit.weights(batch, shape)  # (G, K, T): the weights training gives each reward
    steps.update()
    steps.close()

    print(f"\nmodel {args.model} · task {args.task} · example {example.id} · {time.perf_counter() - t0:.0f}s")
    for k, (name, ev) in enumerate(zip(names, evidences)):
        where = f"{ev.placement} evidence: {ev.text[:70]!r}" if ev else "no evidence (uniform weights)"
        print(f"  reward {k} {name!r}: {where}")
    views = []
    for j, ids in enumerate(completions):
        tokens = _show_tokens(tokenizer, ids)
        reward_str = ", ".join(
            f"{n}={'n/a' if math.isnan(r) else f'{r:g}'}" for n, r in zip(names, rewards[j].tolist())
        )
        print(f"\ncompletion {j}: {reward_str}; GDPO advantage {gdpo_adv[j, 0]:+.3f}")
        print("  " + texts[j].replace("\n", "\n  ")[:400])
        rows = []
        for k, name in enumerate(names):
            w = weights[j, k, : len(ids)]
            if evidences[k] is not None:
                top = torch.topk(w, min(5, len(ids))).indices.tolist()
                shown = ", ".join(f"{tokens[i]!r}×{w[i]:.1f}" for i in top)
                print(f"  {name:>14}: credit peaks on {shown}")
            rows.append(
                CreditRow(
                    name,
                    rewards[j, k].item(),
                    w.tolist(),
                    relevance[j, k, : len(ids)].tolist(),
                    evidences[k].placement if evidences[k] else None,
                )
            )
        views.append(
            CompletionView(
                f"completion {j} · {reward_str}",
                tokens,
                rows,
                mrtpo_adv[j, : len(ids)].tolist(),
                {"GDPO advantage (every token)": f"{gdpo_adv[j, 0]:+.3f}"},
            )
        )
    args.out.mkdir(parents=True, exist_ok=True)
    html_path = args.out / "token_credit.html"
    html_path.write_text(
        render_html(
            views,
            f"MRTPO token credit · {args.task} · {example.id}",
            f"Prompt evidence per reward; privileged evidence is appended under '{DEFAULT_PRIVILEGED_HEADER}'.",
        )
    )
    record = {
        "model": args.model,
        "task": args.task,
        "example": example.id,
        "method": METHOD,
        "rewards": names,
        "completions": [
            {
                "text": t,
                "rewards": r,
                "token_ids": c,
                "tokens": _show_tokens(tokenizer, c),
                "weights": weights[j, :, : len(c)].tolist(),
                "relevance": relevance[j, :, : len(c)].tolist(),
                "has_evidence": maps["has_evidence"][j].tolist(),
                "mrtpo_advantage": mrtpo_adv[j, : len(c)].tolist(),
                "gdpo_advantage": gdpo_adv[j, 0].item(),
            }
            for j, (t, r, c) in enumerate(zip(texts, rewards.tolist(), completions))
        ],
    }
    (args.out / "demo.json").write_text(json.dumps(record, indent=1))
    print(f"\nwrote {html_path} and {args.out / 'demo.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
