"""``mrtpo bench step``: what a training step of the real trainer costs, phase by phase, per method,
against the arithmetic the phase cannot avoid.

Each method trains ``--steps`` steps of a preset (default: the credit gym's, ``--task gym-<family>``)
in this process, one after the other on the same machine; every step's phases come from the
trainer's own timers (``time/generation``, ``time/scoring``, ``time/replay``, ``time/update``: the rest
of the step, which includes TRL's bookkeeping and the loss's forward and backward). Reported: the
median and quartiles over the steps after the first, and for generation, the replay and the update
an **arithmetic floor**: the step's floating-point work at this core's measured matrix-multiply rate,

- per token ``f = 2 · (weights of the linear layers and the head) + 4 · layers · width · context``;
- generation: ``f ×`` (each distinct prompt's tokens once + every sampled token);
- update: ``3 f ×`` the same tokens (forward and backward);
- replay: ``f ×`` every completion token once per context it is replayed under (the original and
  each counterfactual whose map was computed).

Generation is also timed in this process's CPU time, against the same floor at the matmul rate per
CPU second: on a machine shared with other work the wall times swing with the load, the CPU times
far less.

``--profile`` then trains a few more steps per method under cProfile and ``torch.profiler`` and prints
where the time goes beyond the floor (Python frames and torch operators). Printed and written as JSON.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from mrtpo.bench import method_list, write_record

PHASES = ("generation", "scoring", "replay", "update")
TARGET_GDPO_STEP_S = 0.10
TARGET_RATIO = 1.2


def _parse(argv):
    p = argparse.ArgumentParser(
        prog="mrtpo bench step",
        description=__doc__.splitlines()[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--task", default="gym-constraints", help="task to train on")
    p.add_argument(
        "--preset", default="gym", help="bench learn preset (configs/bench-learn-<name>.yaml) or a YAML file"
    )
    p.add_argument("--methods", default="gdpo,mrtpo", help="comma-separated credit methods, timed one after the other")
    p.add_argument("--steps", type=int, default=150, help="training steps per method")
    p.add_argument("--seed", type=int, default=0, help="training seed")
    p.add_argument(
        "--profile",
        type=int,
        default=0,
        metavar="STEPS",
        help="afterwards, profile this many more steps per method (0: no profile)",
    )
    p.add_argument("--out", type=Path, default=Path("runs/bench/step.json"), help="JSON record")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="settings for every method's run")
    return p.parse_args(argv)


def matmul_gflops(
    dtype: torch.dtype = torch.float32, size: int = 512, seconds: float = 0.5, clock=time.perf_counter
) -> float:
    """This process's sustained matrix-multiply rate (GFLOP/s) on ``size``² operands in ``dtype``,
    per second of ``clock`` (wall time; ``time.process_time``: per second of this process's CPU time,
    which other work on a shared machine changes far less)."""
    a, b = torch.randn(size, size, dtype=dtype), torch.randn(size, size, dtype=dtype)
    for _ in range(3):
        a @ b
    count, start = 0, clock()
    while clock() - start < seconds:
        a @ b
        count += 1
    return 2 * size**3 * count / (clock() - start) / 1e9


def flops_per_token(model: Any, context: float) -> float:
    """Forward FLOPs of one token at ``context`` tokens of attention: ``2 ×`` the weights of the
    linear layers and the output head, plus ``4 · layers · width · context`` for the attention."""
    config = model.config
    linear = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
    head = model.get_output_embeddings()
    if head is not None and not isinstance(head, torch.nn.Linear):
        linear += head.weight.numel()
    return 2 * linear + 4 * config.num_hidden_layers * config.hidden_size * context


class _StepTokens:
    """Per generation step: distinct prompt tokens, sampled tokens and replayed tokens, read from
    what the trainer passes around (its ``_generate_and_score_completions`` output and its replay's
    maps) without changing it."""

    def __init__(self, trainer):
        self.rows: list[dict[str, float]] = []
        generate, replay, sample = trainer._generate_and_score_completions, trainer._replay, trainer._generate
        self._cpu = 0.0

        def timed_sample(prompts):  # the trainer's timed generation, also in this process's CPU time
            start = time.process_time()
            try:
                return sample(prompts)
            finally:
                self._cpu += time.process_time() - start

        def recording_replay(inputs, out, coefficients=None):
            maps = replay(inputs, out, coefficients)
            lengths = out["completion_mask"].sum(-1).float().cpu()
            computed = maps["has_evidence"].sum(1).float() if maps.get("has_evidence") is not None else None
            if computed is not None:
                replayed = computed > 0
                self._replayed = float((lengths * (1 + computed) * replayed).sum())
            else:
                self._replayed = float(lengths.sum()) * 2
            return maps

        def recording(inputs):
            self._replayed, self._cpu = 0.0, 0.0
            out = generate(inputs)
            prompts = {
                tuple(ids[mask.bool()].tolist()) for ids, mask in zip(out["prompt_ids"].cpu(), out["prompt_mask"].cpu())
            }
            self.rows.append(
                {
                    "prompt": float(sum(map(len, prompts))),
                    "sampled": float(out["completion_mask"].sum()),
                    "replayed": self._replayed,
                    "generation_cpu": self._cpu,
                    "context": float(out["prompt_mask"].sum(-1).float().mean() + out["completion_mask"].shape[1] / 2),
                }
            )
            return out

        self._replayed = 0.0
        trainer._generate = timed_sample
        trainer._replay = recording_replay
        trainer._generate_and_score_completions = recording


def _quartiles(values: list[float]) -> tuple[float, float, float]:
    if len(values) < 2:
        v = values[0] if values else float("nan")
        return v, v, v
    q = statistics.quantiles(values, n=4)
    return q[0], statistics.median(values), q[2]


def _config(args, method: str, output_dir: Path, steps: int):
    from mrtpo.bench.learn.plan import read_preset, resolve_preset
    from mrtpo.config import load_config, parse_overrides

    train, _ = read_preset(resolve_preset(args.preset), args.task)
    settings = {
        **train,
        "task": args.task,
        "method": method,
        "max_steps": steps,
        "seed": args.seed,
        "output_dir": str(output_dir),
        "logging_steps": 1,
        "save_strategy": "no",
        "report": False,
        "report_to": "none",
        "disable_tqdm": True,
        **parse_overrides(args.overrides),
    }
    return load_config(overrides=settings)


def _train(args, method: str, steps: int, folder: Path, profiler=None) -> tuple[Any, _StepTokens, list[dict]]:
    """Train ``steps`` steps of ``method`` into ``folder`` (under ``profiler``, a context manager, if
    given: only the training loop, not building the trainer); the trainer, its token counts and logs."""
    from transformers.trainer_callback import PrinterCallback, ProgressCallback

    from mrtpo.train import build_trainer

    trainer = build_trainer(_config(args, method, folder, steps))
    for callback in list(trainer.callback_handler.callbacks):  # no line per step: the summary is the output
        if isinstance(callback, (PrinterCallback, ProgressCallback)):
            trainer.remove_callback(callback)
    tokens = _StepTokens(trainer)
    if profiler is None:
        trainer.train()
    else:
        with profiler:
            trainer.train()
    logs = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return trainer, tokens, [r for r in logs if "time/update" in r]


def measure(args, method: str, rate: float, scratch: Path, cpu_rate: float | None = None) -> dict[str, Any]:
    """One method's timed run: per-phase quartiles and floors; ``generation_cpu``: generation in this
    process's CPU time against the floor at ``cpu_rate`` (the matmul rate per CPU second)."""
    trainer, tokens, logs = _train(args, method, args.steps, scratch / method)
    model = trainer.accelerator.unwrap_model(trainer.model)
    row: dict[str, Any] = {"method": method, "steps": len(logs)}
    timed = logs[1:] or logs  # the first step pays one-time costs
    for phase in (*PHASES, "step"):
        values = [
            sum(r.get(f"time/{p}", 0.0) for p in PHASES) if phase == "step" else r.get(f"time/{phase}", 0.0)
            for r in timed
        ]
        row[phase] = dict(zip(("q1", "median", "q3"), _quartiles(values)))
    counts = tokens.rows[1:] or tokens.rows
    floors = {"generation": [], "update": [], "replay": []}
    for c in counts:
        f = flops_per_token(model, c["context"])
        floors["generation"].append(f * (c["prompt"] + c["sampled"]) / rate / 1e9)
        floors["update"].append(3 * f * (c["prompt"] + c["sampled"]) / rate / 1e9)
        floors["replay"].append(f * c["replayed"] / rate / 1e9)
    for phase, values in floors.items():
        row[phase]["floor"] = statistics.median(values) if values else 0.0
    row["generation_cpu"] = dict(zip(("q1", "median", "q3"), _quartiles([c["generation_cpu"] for c in counts])))
    row["generation_cpu"]["floor"] = row["generation"]["floor"] * rate / (cpu_rate or rate)
    row["step"]["floor"] = sum(row[p]["floor"] for p in floors)
    row["tokens"] = {k: statistics.median([c[k] for c in counts]) for k in ("prompt", "sampled", "replayed")}
    row["final_reward"] = statistics.mean(r.get("reward", float("nan")) for r in logs[-10:])
    return row


def profile(args, method: str, scratch: Path) -> dict[str, str]:
    """Top Python frames (cProfile, by own time) and torch operators of ``--profile`` more steps."""
    from torch.profiler import ProfilerActivity, profile as torch_profile

    frames = cProfile.Profile()
    _train(args, method, args.profile, scratch / f"{method}-cprofile", profiler=frames)
    text = io.StringIO()
    pstats.Stats(frames, stream=text).sort_stats("tottime").print_stats(15)
    ops = torch_profile(activities=[ProfilerActivity.CPU])
    _train(args, method, args.profile, scratch / f"{method}-torch", profiler=ops)
    table = ops.key_averages().table(sort_by="self_cpu_time_total", row_limit=15)
    return {"python": text.getvalue(), "torch": table}


def _line(name: str, cell: dict[str, float], floor: bool) -> str:
    text = f"{name} {cell['median'] * 1000:7.1f} ms [{cell['q1'] * 1000:.1f}, {cell['q3'] * 1000:.1f}]"
    if floor and cell.get("floor"):
        text += f", floor {cell['floor'] * 1000:.1f} ms ({cell['median'] / cell['floor']:.1f}x)"
    return text


def main(argv: list[str]) -> int:
    from mrtpo.machine import cpu_flags

    args = _parse(argv)
    methods = method_list(args.methods)
    torch.set_num_threads(1)
    rate, cpu_rate = matmul_gflops(), matmul_gflops(clock=time.process_time)
    flags = sorted(cpu_flags() & {"avx2", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16"})
    print(
        f"mrtpo bench step: {args.task}, preset {args.preset}, {args.steps} steps per method, 1 thread; "
        f"{rate:.0f} GFLOP/s fp32 matmul ({cpu_rate:.0f} per CPU second); CPU flags {' '.join(flags) or '-'}"
    )
    scratch = Path(tempfile.mkdtemp(prefix="mrtpo-bench-step-"))
    rows, profiles = [], {}
    try:
        for method in methods:
            row = measure(args, method, rate, scratch, cpu_rate)
            rows.append(row)
            print(f"\n{method}: medians over steps 2..{row['steps']} [quartiles]")
            for phase in (*PHASES, "step"):
                print("  " + _line(f"{phase:<10}", row[phase], phase != "scoring"))
            print("  " + _line("generation, CPU time", row["generation_cpu"], True))
        by_method = {r["method"]: r for r in rows}
        verdicts = {}
        if "gdpo" in by_method:
            gdpo = by_method["gdpo"]["step"]["median"]
            verdicts["gdpo_step_s"] = gdpo
            print(
                f"\ngdpo step {gdpo:.3f} s (target <= {TARGET_GDPO_STEP_S:.2f} s: "
                f"{'met' if gdpo <= TARGET_GDPO_STEP_S else 'not met'})"
            )
            if "mrtpo" in by_method:
                ratio = by_method["mrtpo"]["step"]["median"] / gdpo
                verdicts["mrtpo_over_gdpo"] = ratio
                print(
                    f"mrtpo / gdpo step {ratio:.2f}x (target <= {TARGET_RATIO:.1f}x: "
                    f"{'met' if ratio <= TARGET_RATIO else 'not met'})"
                )
        if args.profile:
            for method in methods:
                profiles[method] = profile(args, method, scratch)
                print(
                    f"\n--- {method}: Python frames by own time ({args.profile} steps) ---\n"
                    f"{profiles[method]['python']}"
                )
                print(f"--- {method}: torch operators ---\n{profiles[method]['torch']}")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    write_record(
        args.out,
        "step",
        "mrtpo bench step " + " ".join(argv),
        rows,
        matmul_gflops=rate,
        matmul_gflops_cpu_time=cpu_rate,
        cpu_flags=flags,
        verdicts=verdicts,
        profiles=profiles,
    )
    return 0
