"""``mrtpo bench replay``: the evidence replay's time against a plain forward over the same tokens.

The replay (:func:`mrtpo.replay.batch_relevance`) scores every completion under each of its
group's contexts. Its floor here is what any replay must at least pay for those tokens without
its tricks: one plain no-grad forward per pass over every (distinct context, completion) row,
left-padded into one batch, keeping the logits of the completion positions only. The replay
shares each prompt's cache instead of re-reading it, so it can run *under* this floor; above it,
the excess is its own overhead (extra calls, host syncs, copies, the relevance kernel).

The batch is the training batch's shape with the task's real prompts and contexts (mrtpo's per
reward counterfactuals) and random completion tokens of ``--max-new-tokens`` each: a replay's cost
depends on its token counts, not on what the tokens say, and a random-initialised model (as
``mrtpo bench gpu`` builds) runs every completion to its cap anyway. Times are medians of
``--repeats`` after one warm-up, with the device synchronised around each. ``--profile`` adds
torch.profiler's top ops of one replay (CUDA kernels too on a GPU) and the counts of kernel
launches, synchronisations and copies it saw; :class:`~mrtpo.bench.traffic.HostTraffic` counts
the host syncs outside the model on any device, and on CUDA the allocator's statistics give the
allocations of one replay.

Printed and written as JSON (``runs/bench/replay.json``).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from mrtpo.bench import add_batch_arguments, write_record
from mrtpo.cli_help import HelpFormatter
from mrtpo.model_calls import ForwardCounter, underlying_model
from mrtpo.replay import ReplayGroup, batch_relevance
from mrtpo.replay_passes import plan_passes


def _parse(argv):
    p = argparse.ArgumentParser(
        prog="mrtpo bench replay", description=__doc__.splitlines()[0], formatter_class=HelpFormatter
    )
    add_batch_arguments(p, prompts=4, group_size=8, max_new_tokens=128)  # completions: random tokens of that length
    p.add_argument("--task", default="sql", help="task whose train prompts and evidence make the contexts")
    p.add_argument("--groups-per-pass", type=int, default=0, help="prompt groups per replay pass (0: all)")
    p.add_argument(
        "--dtype", choices=["float32", "bfloat16"], help="model dtype (default: bfloat16 on CUDA, float32 on a CPU)"
    )
    p.add_argument("--device", default="auto", help="cpu, cuda, cuda:N or auto (cuda when available)")
    p.add_argument("--repeats", type=int, default=3, help="timed repeats after one warm-up (the median is reported)")
    p.add_argument("--profile", action="store_true", help="torch.profiler's top ops of one replay")
    p.add_argument("--seed", type=int, default=0, help="seed of the random completion tokens")
    p.add_argument("--out", type=Path, default=Path("runs/bench/replay.json"), metavar="FILE", help="JSON record")
    return p.parse_args(argv)


def replay_batch(
    task: Any, tokenizer: Any, prompts: int, group_size: int, new_tokens: int, seed: int = 0
) -> list[ReplayGroup]:
    """The first ``prompts`` train examples of ``task`` as mrtpo replays them: per group the original
    prompt and each reward's counterfactual, with ``group_size`` random completions ``(G, T)`` of
    ``new_tokens`` ordinary tokens each (on the host, as the trainer hands them over)."""
    from mrtpo.counterfactual import prompt_renderer
    from mrtpo.replay_plan import example_contexts, plan_group

    render = prompt_renderer(task, tokenizer)
    verifiers = task.verifiers()
    names = [v.name for v in verifiers]
    generator = torch.Generator().manual_seed(seed)

    def tokenize(text: str) -> list[int]:
        return list(tokenizer(text, add_special_tokens=False)["input_ids"])

    groups = []
    for example in task.load("train", limit=prompts):
        group = plan_group(
            list(range(group_size)),
            [v.evidence(example) for v in verifiers],
            [True] * len(verifiers),
            "per_reward",
            new_tokens,
        )
        completions = torch.randint(0, tokenizer.vocab_size, (group_size, new_tokens), generator=generator)
        groups.append(
            ReplayGroup(
                example_contexts(group, example, names, render, tokenize),
                group.placements,
                completions,
                torch.full((group_size,), new_tokens),
            )
        )
    return groups


def _positions(mask: torch.Tensor) -> torch.Tensor:
    return (mask.cumsum(1) - 1).clamp(min=0)


@torch.no_grad()
def plain_forward(model: Any, groups: list[ReplayGroup], groups_per_pass: int | None) -> tuple[int, int]:
    """The floor: per replay pass, one plain forward over each of its rows ``[context,
    completion[:-1]]`` for every distinct context of its group, left-padded, keeping the ``T``
    logits that predict the completion. Returns ``(forward calls, tokens)``."""
    device = next(underlying_model(model).parameters()).device
    calls = tokens = 0
    for members in plan_passes([g.completions.shape[0] for g in groups], None, groups_per_pass):
        t = max(groups[index].completions.shape[1] for index, _ in members)
        rows = []
        for index, rows_slice in members:
            group = groups[index]
            completions = torch.nn.functional.pad(group.completions[rows_slice], (0, t - group.completions.shape[1]))
            for context in dict.fromkeys(tuple(int(x) for x in c) for c in group.contexts):
                rows += [list(context) + completion[:-1] for completion in completions.tolist()]
        width = max(map(len, rows))
        ids = torch.tensor([[0] * (width - len(r)) + r for r in rows])
        mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
        model(
            input_ids=ids.to(device),
            attention_mask=mask.to(device),
            position_ids=_positions(mask).to(device),
            logits_to_keep=t,
            use_cache=False,
        )
        calls += 1
        tokens += int(mask.sum())
    return calls, tokens


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn: Callable[[], Any], device: torch.device, repeats: int) -> list[float]:
    """Seconds of ``repeats`` calls of ``fn`` after one untimed warm-up, the device synchronised
    before and after each."""
    fn()
    seconds = []
    for _ in range(repeats):
        _synchronize(device)
        start = time.perf_counter()
        fn()
        _synchronize(device)
        seconds.append(time.perf_counter() - start)
    return seconds


def profile_replay(fn: Callable[[], Any], device: torch.device, rows: int = 15) -> dict[str, Any]:
    """torch.profiler over one call of ``fn``: its top ops by self device time (CUDA) or self CPU
    time, and how many kernel launches, synchronisations and memory copies the profile saw."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        fn()
        _synchronize(device)
    events = prof.key_averages()

    def count(*needles: str) -> int:
        return sum(e.count for e in events if any(n in e.key for n in needles))

    sort_by = "self_device_time_total" if device.type == "cuda" else "self_cpu_time_total"
    return {
        "table": events.table(sort_by=sort_by, row_limit=rows),
        "sort_by": sort_by,
        "kernel_launches": count("LaunchKernel", "cuLaunch"),
        "synchronizations": count("Synchronize"),
        "memcpy": count("Memcpy"),
        "ops": sum(e.count for e in events if e.key.startswith("aten::")),
    }


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    from mrtpo.hub import prepare_hub

    prepare_hub()  # offline only where the user or the machine says so
    from mrtpo.bench.traffic import HostTraffic
    from mrtpo.models import load_policy
    from mrtpo.tasks import get_task

    device = torch.device(
        "cuda"
        if args.device == "auto" and torch.cuda.is_available()
        else "cpu"
        if args.device == "auto"
        else args.device
    )
    dtype = getattr(torch, args.dtype or ("bfloat16" if device.type == "cuda" else "float32"))
    model, tok = load_policy(args.model, dtype=dtype)
    model.to(device).eval()
    groups = replay_batch(get_task(args.task), tok, args.prompts, args.group_size, args.max_new_tokens, args.seed)
    per_pass = args.groups_per_pass or None
    counter = ForwardCounter()

    def replay() -> None:
        batch_relevance(model, groups, groups_per_pass=per_pass, counter=counter)

    replay_s = timed(replay, device, args.repeats)
    replay_calls = counter.calls // (args.repeats + 1)
    floor_calls, floor_tokens = plain_forward(model, groups, per_pass)
    floor_s = timed(lambda: plain_forward(model, groups, per_pass), device, args.repeats)
    before = torch.cuda.memory_stats(device) if device.type == "cuda" else {}
    with HostTraffic(model) as traffic:
        replay()
        _synchronize(device)
    after = torch.cuda.memory_stats(device) if device.type == "cuda" else {}
    # allocation requests served by the caching allocator, and the device allocations behind them
    allocations = (
        {key: after.get(key, 0) - before.get(key, 0) for key in ("allocation.all.allocated", "num_device_alloc")}
        if after
        else None
    )
    row = {
        "replay_s": statistics.median(replay_s),
        "floor_s": statistics.median(floor_s),
        "replay_all_s": replay_s,
        "floor_all_s": floor_s,
        "replay_forward_calls": replay_calls,
        "floor_forward_calls": floor_calls,
        "floor_tokens": floor_tokens,
        "host_traffic": traffic.summary(),
        "allocations": allocations,
        "contexts": [len(g.contexts) for g in groups],
        "prompt_tokens": [len(g.contexts[0]) for g in groups],
    }
    row["ratio"] = row["replay_s"] / row["floor_s"]
    if device.type == "cuda":
        row["peak_gib"] = torch.cuda.max_memory_allocated(device) / 2**30
    print(
        f"{args.prompts} groups x {args.group_size} completions x {args.max_new_tokens} tokens, contexts per group "
        f"{row['contexts']}, {args.groups_per_pass or 'all'} group(s) per pass, {dtype} on {device}"
    )
    print(
        f"replay            {row['replay_s']:8.3f} s  ({replay_calls} forward calls; host syncs "
        f"{traffic.syncs}, copies to the device {traffic.to_device}, torch calls outside the model {traffic.calls})"
    )
    if allocations is not None:
        print(
            f"                  {allocations['allocation.all.allocated']} allocations from the caching allocator, "
            f"{allocations['num_device_alloc']} device allocations"
        )
    print(f"plain forward     {row['floor_s']:8.3f} s  ({floor_calls} forward calls over {floor_tokens} tokens)")
    print(f"replay / floor    {row['ratio']:8.2f}")
    extra: dict[str, Any] = {}
    if args.profile:
        try:
            extra["profile"] = profile_replay(replay, device)
            p = extra["profile"]
            print(
                f"\nprofile of one replay: {p['kernel_launches']} kernel launches, {p['synchronizations']} "
                f"synchronisations, {p['memcpy']} memory copies, {p['ops']} aten ops\n{p['table']}"
            )
        except Exception as exc:  # the timings above stand without it
            extra["profile_error"] = repr(exc)
            print(f"profile failed: {exc!r}", file=sys.stderr)
    write_record(
        args.out,
        "evidence replay against a plain forward over the same tokens",
        "mrtpo bench replay " + " ".join(argv or []),
        [row],
        device=str(device),
        dtype=str(dtype),
        settings={k: str(v) for k, v in vars(args).items()},
        **extra,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
