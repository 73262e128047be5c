"""Benchmarks (commands that print and write figures; never timed tests): ``mrtpo bench <name>``."""

from __future__ import annotations

import importlib
import json
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mrtpo.cli_help import did_you_mean
from mrtpo.machine import machine_info

BENCHMARKS: dict[str, str] = {
    "relevance": "mrtpo.bench.relevance",
    "cost": "mrtpo.bench.cost",
    "learn": "mrtpo.bench.learn",
    "lift": "mrtpo.bench.lift",
    "gym": "mrtpo.bench.gym",
    "gpu": "mrtpo.bench.gpu",
    "replay": "mrtpo.bench.replay_floor",
    "step": "mrtpo.bench.step",
    "signal": "mrtpo.bench.signal",
}


def add_batch_arguments(parser, *, prompts: int, group_size: int = 4, max_new_tokens: int | None) -> None:
    """The batch a benchmark replays from one policy: ``--model --prompts --group-size --max-new-tokens``."""
    parser.add_argument("--model", default="qwen2.5-coder-0.5b", help="preset, local dir, .gguf or hub id")
    parser.add_argument("--prompts", type=int, default=prompts, help="prompts, one group of completions each")
    parser.add_argument("--group-size", type=int, default=group_size, help="completions per prompt")
    parser.add_argument(
        "--max-new-tokens",
        type=int,
        default=max_new_tokens,
        help="completion length cap" + ("" if max_new_tokens else " (default: per task)"),
    )


def add_sampling_arguments(parser, *, prompts: int, max_new_tokens: int | None, methods: str, dtype: str) -> None:
    """The options of a benchmark that samples groups from one policy (``bench cost``, ``bench lift``):
    :func:`add_batch_arguments` and ``--methods --dtype --seed``."""
    add_batch_arguments(parser, prompts=prompts, max_new_tokens=max_new_tokens)
    parser.add_argument("--methods", default=methods, help="comma-separated credit methods")
    parser.add_argument("--dtype", default=dtype, choices=["float32", "bfloat16"], help="policy dtype")
    parser.add_argument("--seed", type=int, default=0, help="sampling seed")


def method_list(text: str) -> list[str]:
    """Comma-separated credit method names; an unknown one fails here, listing the known ones."""
    from mrtpo.credit import get_method

    methods = [m.strip() for m in text.split(",") if m.strip()]
    for m in methods:
        get_method(m)
    return methods


@dataclass
class WeighedGroup:
    """One prompt's sampled group, replayed under every context the credit methods need."""

    completions: Any  # (G, T) ids, right-padded
    lengths: Any  # (G,) lengths counting the end-of-sequence token
    texts: list[str]  # decoded completions
    rewards: Any  # (G, K), NaN where a reward does not apply
    contexts: list[list[int]]  # the original prompt, each reward's counterfactual, the joint one
    placements: list[str]  # placement of each counterfactual
    present: list[str]  # names of the rewards with evidence, in context order
    weights: dict[str, Any]  # method -> (G, K, T) token weights (the ones training uses)
    maps: dict[str, Any]  # the replay's maps in CreditBatch fields (mrtpo.replay_plan.ReplayPlan.scatter)


def sample_and_weigh(
    model,
    tokenizer,
    example,
    verifiers,
    render,
    methods,
    group_size: int,
    max_new_tokens: int,
    config=None,
    kind: str = "js",
    decoys=None,
    temperature: float = 1.0,
    spans_of=None,
    fast: bool = False,
) -> WeighedGroup:
    """Sample ``group_size`` completions of ``example``, replay them once under every context the
    methods need (:mod:`mrtpo.replay_plan`; always each reward's counterfactual) and give every
    method's token weights. ``decoys``: each reward's decoy evidence (another example's), for the
    methods that contrast with one; ``None``: no decoy, their maps are the plain ones. ``temperature``:
    of the sampling and of the replay's distributions (training's ``temperature``). ``spans_of``: the
    task's ``checked_spans``, for the ``oracle`` on rewards that are not gym verifiers. ``fast``: sample
    through :mod:`mrtpo.fast_decode` where it supports the model (:func:`mrtpo.sampling.sample_group`)."""
    import torch

    from mrtpo.credit import CreditBatch, CreditConfig, get_method
    from mrtpo.known_positions import known_position_mask
    from mrtpo.replay import run_replay_plan
    from mrtpo.replay_plan import EACH, context_rule, example_contexts, plan_replays
    from mrtpo.sampling import sample_group

    def ids_of(text: str) -> list[int]:
        return list(tokenizer(text, add_special_tokens=False)["input_ids"])

    names = [v.name for v in verifiers]
    comps, lengths = sample_group(
        model, tokenizer, ids_of(render(example)), group_size, max_new_tokens, temperature, fast=fast
    )
    texts = [tokenizer.decode(c[:n].tolist(), skip_special_tokens=True) for c, n in zip(comps, lengths.tolist())]
    rewards = torch.tensor(
        [[float("nan") if (r := v(t, example)) is None else float(r) for v in verifiers] for t in texts]
    )
    g, t = comps.shape
    plan = plan_replays(
        [list(range(g))],
        [[v.evidence(example) for v in verifiers]],
        lengths.tolist(),
        ["per_reward", *(get_method(m).needs for m in methods)],
        decoys=None if decoys is None else [list(decoys)],
    )
    (group,) = plan.groups
    contexts = example_contexts(group, example, names, render, ids_of)
    maps = run_replay_plan(model, plan, lambda _: contexts, comps, lengths, kind=kind, temperature=temperature)
    mask = (torch.arange(t).unsqueeze(0) < lengths.view(-1, 1)).float()
    needs = [get_method(m).needs for m in methods]
    known = (
        known_position_mask(
            verifiers, [example] * g, texts, [c[:n].tolist() for c, n in zip(comps, lengths)], t, tokenizer, spans_of
        )
        if any(context_rule(kind).known for kind in needs)
        else None
    )
    batch = CreditBatch(rewards, g, mask, **maps, known_positions=known)
    weights = {m: get_method(m).weights(batch, config or CreditConfig()) for m in methods}
    present = [names[cf.rewards[0]] for cf in group.counterfactuals if cf.rule == EACH]
    return WeighedGroup(comps, lengths, texts, rewards, contexts, group.placements, present, weights, maps)


def write_record(out: Path, benchmark: str, command: str, rows: list[dict], **extra: Any) -> dict:
    """Write a benchmark's JSON record (what, when, where, the command, the rows) and say where."""
    record = {
        "benchmark": benchmark,
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "machine": machine_info(),
        "command": command,
        **extra,
        "rows": rows,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=2))
    print(f"\nwrote {out}")
    return record


def describe(module: str) -> str:
    """A benchmark's one-line description: the first paragraph of its module docstring, read from the
    source without importing it (most benchmarks import torch)."""
    import ast
    import importlib.util

    source = Path(importlib.util.find_spec(module).origin).read_text()
    first = (ast.get_docstring(ast.parse(source)) or "").split("\n\n")[0]
    return re.sub(r"^``mrtpo bench \w+``: ", "", " ".join(first.split())).replace("``", "")


def usage() -> str:
    """``mrtpo bench``'s help: each benchmark with its one-line description."""
    width = max(map(len, BENCHMARKS))
    lines = ["usage: mrtpo bench <name> [options]", "", "benchmarks:"]
    lines += [f"  {name:<{width}}  {describe(module)}" for name, module in BENCHMARKS.items()]
    lines += ["", "Run `mrtpo bench <name> --help` for a benchmark's options."]
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        return 0
    if argv[0] not in BENCHMARKS:
        print(
            f"mrtpo bench: unknown benchmark {argv[0]!r}{did_you_mean(argv[0], BENCHMARKS)}\n\n{usage()}",
            file=sys.stderr,
        )
        return 2
    return int(importlib.import_module(BENCHMARKS[argv[0]]).main(argv[1:]) or 0)
