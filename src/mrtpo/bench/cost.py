"""``mrtpo bench cost``: what one training step costs per credit method, on the same batch.

One batch is generated once (sampling, fixed seed) and scored once; then, for every method, the
replays it needs run on that same batch, followed by one policy-gradient update (token-level
surrogate at ratio 1, forward + backward + optimizer step, on a fresh copy of the weights so
every method starts from the same policy; LoRA on the attention projections by default, as the
demo config trains). Reported per method: generation / scoring / replay / update seconds, the
replay's forward calls and tokens, and two floors for the replay:

- ``naive floor``: one plain no-grad forward over every (context, completion) sequence, i.e.
  what a replay without prefix sharing must at least spend;
- ``unique-token floor``: plain forwards over only the tokens the prefix-sharing replay feeds
  the model (the original prompt once, each other context from where it departs from it, each
  completion once per context), each piece run on its own (so attention to the cached prompt is
  not counted: a lower bound).

Then each phase against its floor (:mod:`mrtpo.bench.floors`): generation against the decode
floor; the update, run the three ways the trainer can run it (TRL's rows under activation
checkpointing, TRL's rows, each distinct prompt once), against the forward + backward floor over
its unique tokens. ``--profile`` adds torch.profiler's top ops of the trainer's update (``shared``; profiling
the ``rows`` modes of the default model too ran a 24 GB machine out of memory).

Printed and written as JSON (``runs/bench/cost.json``).
"""

from __future__ import annotations

import argparse
import copy
import sys
import time
from pathlib import Path

import torch

from mrtpo.bench import add_sampling_arguments, write_record
from mrtpo.bench.floors import (
    UPDATE_MODES,
    UpdateBatch,
    decode_floor_seconds,
    profile_update,
    update_floor_seconds,
    update_seconds,
)
from mrtpo.cli_help import HelpFormatter
from mrtpo.counterfactual import prompt_renderer
from mrtpo.credit import CreditBatch, CreditConfig, get_method
from mrtpo.model_calls import ForwardCounter
from mrtpo.replay import run_replay_plan
from mrtpo.replay_passes import shared_lengths
from mrtpo.replay_plan import example_contexts, plan_replays
from mrtpo.sampling import sample_group


def _parse(argv):
    p = argparse.ArgumentParser(
        prog="mrtpo bench cost", description=__doc__.splitlines()[0], formatter_class=HelpFormatter
    )
    p.add_argument("--task", default="sql", help="task whose train prompts make the batch")
    add_sampling_arguments(p, prompts=2, max_new_tokens=64, methods="grpo,gdpo,mrtpo,contrast,entropy", dtype="float32")
    p.add_argument("--top-k", type=int, help="top-k approximation of the JS sum in the replays (default: exact)")
    p.add_argument(
        "--groups-per-pass",
        type=int,
        default=1,
        help="prompt groups replayed in one pass of three forward calls (0: all), as replay_groups_per_pass",
    )
    p.add_argument("--lora-r", type=int, default=16, help="LoRA rank on q/k/v/o for the update (0: full fine-tuning)")
    p.add_argument(
        "--profile",
        action="store_true",
        help="print torch.profiler's top ops of the trainer's update (the shared mode)",
    )
    p.add_argument(
        "--update-modes",
        default=",".join(UPDATE_MODES),
        help="comma-separated update modes timed against the floor (rows without checkpointing holds "
        "every position's full-vocabulary logits: ~21 GB on the default model)",
    )
    p.add_argument("--out", type=Path, default=Path("runs/bench/cost.json"), metavar="FILE", help="JSON record")
    args = p.parse_args(argv)
    unknown = set(args.update_modes.split(",")) - set(UPDATE_MODES)
    if unknown:
        p.error(f"unknown update mode(s) {', '.join(sorted(unknown))}; choose from {', '.join(UPDATE_MODES)}")
    return args


def _timed(fn):
    start = time.perf_counter()
    value = fn()
    return value, time.perf_counter() - start


@torch.no_grad()
def _plain_forward_seconds(model, sequences: list[tuple[list[int], int]]) -> tuple[float, int]:
    """Seconds for a plain no-grad forward of each ``(sequence, logits_to_keep)`` (batch 1)."""
    start = time.perf_counter()
    tokens = 0
    for seq, keep in sequences:
        model(input_ids=torch.tensor([seq]), logits_to_keep=keep, use_cache=False)
        tokens += len(seq)
    return time.perf_counter() - start, tokens


def _with_update_head(model, lora_r: int):
    """The policy as the trainer updates it: TRL's fused LM head, LoRA (rank ``lora_r``, q/k/v/o) unless 0."""
    from trl.trainer.utils import add_fused_lm_head

    from mrtpo.trl_compat import ensure_fused_head_runs

    ensure_fused_head_runs()
    add_fused_lm_head(model, temperature=1.0, outputs=("log_probs", "entropy"))
    if lora_r <= 0:
        return model
    from peft import LoraConfig, get_peft_model

    return get_peft_model(
        model,
        LoraConfig(
            r=lora_r, lora_alpha=2 * lora_r, lora_dropout=0.0, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"]
        ),
    )


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    from mrtpo.hub import prepare_hub

    prepare_hub()  # offline only where the user or the machine says so
    from mrtpo.models import load_policy
    from mrtpo.tasks import get_task

    torch.manual_seed(args.seed)
    dtype = getattr(torch, args.dtype)
    model, tok = load_policy(args.model, dtype=dtype)
    model = _with_update_head(model, args.lora_r)
    model.eval()
    task = get_task(args.task)
    verifiers = task.verifiers()
    names = [v.name for v in verifiers]
    render = prompt_renderer(task, tok)
    examples = task.load("train", limit=args.prompts)

    def tokenize(text):
        return list(tok(text, add_special_tokens=False)["input_ids"])

    # 1. generation (once) and scoring (once)
    gen_start = time.perf_counter()
    batch = []
    for ex in examples:
        p_ids = tokenize(render(ex))
        comps, lengths = sample_group(model, tok, p_ids, args.group_size, args.max_new_tokens)
        batch.append((ex, p_ids, comps, lengths))
    generation_s = time.perf_counter() - gen_start
    texts = [
        [tok.decode(c[:n], skip_special_tokens=True) for c, n in zip(comps, lengths.tolist())]
        for _, _, comps, lengths in batch
    ]
    rewards, scoring_s = _timed(
        lambda: torch.tensor(
            [
                [float("nan") if (r := v(t, ex)) is None else float(r) for v in verifiers]
                for (ex, *_), ts in zip(batch, texts)
                for t in ts
            ]
        )
    )
    t_max = max(int(lengths.max()) for *_, lengths in batch)
    n_rows = args.prompts * args.group_size
    mask = torch.zeros(n_rows, t_max)
    completions = torch.full((n_rows, t_max), tok.pad_token_id, dtype=torch.long)
    prompt_ids = []
    for g, (_, p_ids, comps, lengths) in enumerate(batch):
        for i in range(args.group_size):
            j = g * args.group_size + i
            n = min(comps.shape[1], t_max)
            completions[j, :n] = comps[i, :n]
            mask[j, : int(lengths[i])] = 1
            prompt_ids.append(p_ids)
    initial_state = copy.deepcopy(model.state_dict())

    def update_batch(advantages):
        return UpdateBatch.from_groups(prompt_ids, completions, mask, advantages, tok.pad_token_id)

    rows = []
    for method_name in args.methods.split(","):
        method = get_method(method_name)
        model.load_state_dict(initial_state)
        counter = ForwardCounter()
        naive, unique = [], []
        replay_start = time.perf_counter()
        plan = plan_replays(
            [list(range(g * args.group_size, (g + 1) * args.group_size)) for g in range(len(batch))],
            [[v.evidence(ex) for v in verifiers] for ex, *_ in batch],
            [int(n) for *_, lengths in batch for n in lengths],
            method.needs,
        )
        all_lengths = torch.cat([lengths for *_, lengths in batch])

        def contexts_of(group):
            ex = batch[group.rows[0] // args.group_size][0]
            return example_contexts(group, ex, names, render, tokenize)

        for group, (ex, _, comps, lengths) in zip(plan.groups, batch):
            if not group.replayed:
                continue
            contexts = contexts_of(group)
            comp_lists = [comps[i, : int(lengths[i])].tolist() for i in range(args.group_size)]
            naive += [(list(ctx) + c, len(c) + 1) for ctx in contexts for c in comp_lists]
            distinct = [list(ctx) for ctx in dict.fromkeys(tuple(ctx) for ctx in contexts)]
            unique.append((distinct[0], 1))  # the original once, each context from where it departs
            unique += [(ctx[s:], 1) for ctx, s in zip(distinct[1:], shared_lengths(distinct)[1:])]
            unique += [(c, len(c)) for _ in distinct for c in comp_lists]  # every completion per context
        maps = run_replay_plan(
            model,
            plan,
            contexts_of,
            completions,
            all_lengths,
            temperature=1.0,
            top_k=args.top_k,
            counter=counter,
            groups_per_pass=args.groups_per_pass or None,
        )
        replay_s = time.perf_counter() - replay_start
        credit = CreditBatch(rewards, args.group_size, mask, **maps)
        advantages = method(credit, CreditConfig())
        update_s = update_seconds(model, update_batch(advantages), "shared")
        row = {
            "method": method_name,
            "needs": method.needs,
            "generation_s": generation_s,
            "scoring_s": scoring_s,
            "replay_s": replay_s,
            "replay_kernel_s": counter.kernel_s,
            "update_s": update_s,
            "replay_forward_calls": counter.calls,
        }
        if naive:
            naive_s, naive_tokens = _plain_forward_seconds(model, naive)
            unique_s, unique_tokens = _plain_forward_seconds(model, [u for u in unique if u[0]])
            row.update(
                {
                    "naive_floor_s": naive_s,
                    "naive_tokens": naive_tokens,
                    "unique_floor_s": unique_s,
                    "unique_tokens": unique_tokens,
                    "replay_tokens_per_s": naive_tokens / replay_s,
                    "naive_floor_tokens_per_s": naive_tokens / naive_s,
                }
            )
        rows.append(row)
        print(f"[{method_name}] replay {replay_s:.2f}s update {update_s:.2f}s", file=sys.stderr, flush=True)

    floors = _floors(model, initial_state, update_batch(advantages), batch, args, generation_s)

    header = (
        f"{'method':>9} {'gen s':>7} {'score s':>8} {'replay s':>9} {'of it kernel s':>15} {'update s':>9} "
        f"{'calls':>6} {'naive floor s':>14} {'unique floor s':>15}"
    )
    print(header)
    print("-" * len(header))
    for r in rows:
        print(
            f"{r['method']:>9} {r['generation_s']:>7.1f} {r['scoring_s']:>8.2f} {r['replay_s']:>9.2f} "
            f"{r['replay_kernel_s']:>15.2f} {r['update_s']:>9.2f} "
            f"{r['replay_forward_calls']:>6} {r.get('naive_floor_s', float('nan')):>14.2f} "
            f"{r.get('unique_floor_s', float('nan')):>15.2f}"
        )
    print()
    print(f"{'phase':>26} {'s':>8} {'floor s':>8} {'ratio':>6}")
    for name, (seconds, floor) in floors["phases"].items():
        print(f"{name:>26} {seconds:>8.2f} {floor:>8.2f} {seconds / floor:>6.2f}")
    print(
        f"update tokens: {floors['tokens']}; forward+backward floor {floors['floor_tokens_per_s']:.0f} tokens/s, "
        f"decode floor {floors['decode_tokens_per_s']:.1f} tokens/s"
    )
    for mode, table in floors.get("profile", {}).items():
        print(f"\nprofile of the update ({mode}):\n{table}")
    write_record(
        args.out,
        "cost of one training step per method (same batch)",
        "mrtpo bench cost " + " ".join(argv or []),
        rows,
        settings={k: str(v) for k, v in vars(args).items()},
        floors=floors,
    )
    return 0


def _floors(model, initial_state, batch: UpdateBatch, groups, args, generation_s: float) -> dict:
    """Each phase's seconds next to its floor: generation against the decode floor, the update in each
    of :data:`UPDATE_MODES` against the forward + backward floor over its unique tokens."""
    decode_s = sum(
        decode_floor_seconds(model, p_ids, args.group_size, int(lengths.max())) for _, p_ids, _, lengths in groups
    )
    new_tokens = args.group_size * sum(int(lengths.max()) for *_, lengths in groups)
    phases = {"generation": (generation_s, decode_s)}
    floor_s = update_floor_seconds(model, batch)
    for mode in args.update_modes.split(","):
        model.load_state_dict(initial_state)
        phases[f"update ({mode})"] = (update_seconds(model, batch, mode), floor_s)
    tokens = batch.unique_tokens()
    record = {
        "phases": phases,
        "tokens": tokens,
        "decode_tokens_per_s": new_tokens / decode_s,
        "floor_tokens_per_s": (tokens["prompt"] + tokens["completion"]) / floor_s,
    }
    if args.profile:
        record["profile"] = {"shared": profile_update(model, batch, "shared")}
    model.load_state_dict(initial_state)
    return record


if __name__ == "__main__":
    sys.exit(main())
