"""``mrtpo bench gpu``: what a training step costs on a GPU, per method, with no model weights.

A GPU machine here has no hub and too little transfer room for real weights, and a step's cost
depends on the model's shape, not on its weights. So this check builds random-initialised Qwen2
models of the presets' shapes (``q05``: the default model's; ``q15``: Qwen2.5-1.5B's) with the
real tokenizer, and per shape first measures the replay against a plain forward over the same
tokens (``mrtpo bench replay`` with a CUDA profile, training's batch shape and replay passes), then
runs ``mrtpo train`` for a few steps per method (each in its own process, so peak memory is per
run). It prints per phase the median over steps ≥ 2 (step 1 warms up kernels and allocators), the
peak memory, the mrtpo / gdpo step ratio and the replay / plain-forward ratio against the targets
(:data:`TARGETS`); written as JSON too. Runs that would not fit the ``--deadline`` are skipped and
say so.
``scripts/gpu_check.sh`` sets the offline environment and runs it; ``--shapes tiny`` is a CPU dry
run of the same path. With random weights every completion runs to ``max_completion_length`` and
every reward is 0, so a run would skip every replay and update row: the runs set
``skip_zero_advantage=false`` (:data:`WHOLE_STEP`) and time a step's whole work, what a step where
every group has spread costs (a real run skips groups without spread, and costs at most that).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from mrtpo.bench import write_record
from mrtpo.cli_help import HelpFormatter

#: Qwen2 shapes: hidden, layers, attention heads, key/value heads, MLP width, tied embeddings.
SHAPES: dict[str, dict[str, Any]] = {
    "q05": dict(
        hidden_size=896,
        num_hidden_layers=24,
        num_attention_heads=14,
        num_key_value_heads=2,
        intermediate_size=4864,
        tie_word_embeddings=True,
    ),
    "q15": dict(
        hidden_size=1536,
        num_hidden_layers=28,
        num_attention_heads=12,
        num_key_value_heads=2,
        intermediate_size=8960,
        tie_word_embeddings=True,
    ),
    "tiny": dict(
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=128,
        tie_word_embeddings=True,
    ),
}
#: Per-step metrics summarised (median over steps ≥ 2), as the trainer logs them.
PHASES = {"step": "step_time", "generation": "time/generation", "replay": "time/replay", "update": "time/update"}
#: Set for every run before the user's overrides: do the work that zero rewards would let a step skip.
WHOLE_STEP = "skip_zero_advantage=false"
#: The GPU targets: mrtpo / gdpo step time, and the replay against a plain forward over its tokens.
TARGETS = {"step_ratio": 1.10, "replay_ratio": 1.2}


def _parse(argv):
    p = argparse.ArgumentParser(
        prog="mrtpo bench gpu", description=__doc__.splitlines()[0], formatter_class=HelpFormatter
    )
    p.add_argument("--shapes", default="q05,q15", help=f"comma-separated model shapes: {', '.join(SHAPES)}")
    p.add_argument("--methods", default="gdpo,mrtpo", help="comma-separated credit methods")
    p.add_argument(
        "--tokenizer",
        type=Path,
        help="folder with the real tokenizer files (default: the default "
        "model's cache folder, or a tokenizer folder given by $MRTPO_TOKENIZER)",
    )
    p.add_argument("--config", type=Path, default=Path("configs/gpu.yaml"), help="training config the runs start from")
    p.add_argument("--steps", type=int, default=4, help="optimizer steps per run (medians use steps >= 2)")
    p.add_argument("--prompts", type=int, default=4, help="prompts per step")
    p.add_argument("--group-size", type=int, default=8, help="completions per prompt")
    p.add_argument("--max-new-tokens", type=int, default=128, help="completion length (random weights run to it)")
    p.add_argument("--deadline", type=float, default=450.0, help="seconds the whole check may take")
    p.add_argument(
        "--replay-timeout",
        type=float,
        default=120.0,
        help="seconds the replay measurement may take per shape (0: skip it)",
    )
    p.add_argument(
        "--output-dir",
        "--out",
        dest="out",
        type=Path,
        default=Path("runs/bench/gpu"),
        metavar="DIR",
        help="folder for runs, logs and gpu.json",
    )
    p.add_argument("--models", type=Path, help="folder for the built models (default: DIR/models; 1-3 GB each)")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="extra settings for every run")
    return p.parse_args(argv)


def _tokenizer_dir(given: Path | None) -> Path:
    """The real tokenizer's folder: ``given``, ``$MRTPO_TOKENIZER``, else the default model's cache."""
    import os

    from mrtpo.models import preset_cache_dir

    candidates = [given] if given else [Path(p) for p in [os.environ.get("MRTPO_TOKENIZER")] if p]
    candidates = candidates or [preset_cache_dir("qwen2.5-coder-0.5b")]
    for folder in candidates:
        if (folder / "tokenizer.json").is_file() or (folder / "tokenizer_config.json").is_file():
            return folder
    raise FileNotFoundError(
        f"no tokenizer files in {', '.join(map(str, candidates))}: pass --tokenizer DIR with the real tokenizer "
        "(tokenizer.json, tokenizer_config.json, chat_template.jinja; on a machine with the model cached they are "
        "in ~/.cache/mrtpo/models/qwen2.5-coder-0.5b-*)"
    )


def build_model(shape: str, tokenizer_dir: Path, out: Path, dtype: str = "bfloat16") -> Path:
    """A random-initialised Qwen2 of ``shape`` (:data:`SHAPES`) with the tokenizer of ``tokenizer_dir``,
    saved to ``out/<shape>`` for ``mrtpo train model=...``; its vocabulary covers every token id."""
    import torch
    from transformers import AutoTokenizer, GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    folder = out / shape
    vocab = max(len(tok), getattr(tok, "vocab_size", 0))
    config = Qwen2Config(
        vocab_size=vocab,
        max_position_embeddings=32768,
        rope_theta=1e6,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        **SHAPES[shape],
    )
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
        model = Qwen2ForCausalLM(config).to(getattr(torch, dtype))
    model.generation_config = GenerationConfig(eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    params = sum(p.numel() for p in model.parameters())
    del model
    print(f"built {shape}: {params / 1e6:.0f} M parameters, vocabulary {vocab}, in {folder}", flush=True)
    return folder


def summarise_run(metrics: Path) -> dict[str, Any]:
    """Medians over steps ≥ 2 of each phase (:data:`PHASES`), the peak memory, the steps logged."""
    lines = [json.loads(x) for x in metrics.read_text().splitlines() if x.strip()] if metrics.exists() else []
    steps = {int(x["step"]): x for x in lines if "step_time" in x}
    row: dict[str, Any] = {"steps": len(steps)}
    later = [x for s, x in sorted(steps.items()) if s >= 2] or list(steps.values())
    for name, key in PHASES.items():
        values = [x[key] for x in later if key in x]
        row[name] = statistics.median(values) if values else 0.0
    peaks = [x["memory/peak_gib"] for x in steps.values() if "memory/peak_gib" in x]
    row["peak_gib"] = max(peaks) if peaks else None
    return row


def _run_logged(command: list[str], timeout: float, log: Path) -> tuple[int | str, str]:
    """Run ``command`` (echoed), its whole output (partial on a timeout) written to ``log``:
    ``(exit status or "timeout", output)``."""
    print("$ " + " ".join(command), flush=True)
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
        rc, text = done.returncode, done.stdout + done.stderr
    except subprocess.TimeoutExpired as stopped:  # its partial output comes as bytes
        partial = b"".join(x for x in (stopped.stdout, stopped.stderr) if x).decode(errors="replace")
        rc, text = "timeout", f"{partial}\nstopped after {timeout:.0f} s"
    log.parent.mkdir(parents=True, exist_ok=True)  # a run that fails at once never made its folder
    log.write_text(text)
    return rc, text


def _train(model_dir: Path, method: str, run_dir: Path, args, timeout: float) -> dict[str, Any]:
    batch = args.prompts * args.group_size
    command = [
        sys.executable,
        "-m",
        "mrtpo.cli",
        "train",
        "--config",
        str(args.config),
        "--task",
        "sql",
        "--overwrite",
        f"model={model_dir}",
        f"method={method}",
        f"max_steps={args.steps}",
        f"output_dir={run_dir}",
        f"per_device_train_batch_size={batch}",
        f"num_generations={args.group_size}",
        f"max_completion_length={args.max_new_tokens}",
        "report_to=none",
        "save_strategy=no",
        "report=false",
        WHOLE_STEP,
        *args.overrides,
    ]
    start = time.perf_counter()
    rc, text = _run_logged(command, timeout, run_dir.parent / f"{run_dir.name}.log")
    row = {"rc": rc, "process_s": time.perf_counter() - start, **summarise_run(run_dir / "metrics.jsonl")}
    if rc != 0:
        print(f"{text[-3000:]}\n(whole output: {run_dir.parent / f'{run_dir.name}.log'})", file=sys.stderr)
    return row


def _config_groups_per_pass(config: Path, overrides: list[str]) -> int | None:
    """``replay_groups_per_pass`` as the training runs will have it: the last override, else the config's."""
    import yaml

    value = (yaml.safe_load(config.read_text()) or {}).get("replay_groups_per_pass", 1)
    for item in overrides:
        key, _, text = item.partition("=")
        if key.strip() == "replay_groups_per_pass":
            value = yaml.safe_load(text)
    return value


def _replay(model_dir: Path, shape: str, args, timeout: float) -> dict[str, Any]:
    """``mrtpo bench replay`` on the shape's model with the runs' batch shape and replay passes, in
    its own process: its row (replay and plain-forward seconds, ratio, calls, host syncs) and profile counts."""
    out = args.out / f"replay-{shape}.json"
    per_pass = _config_groups_per_pass(args.config, args.overrides)
    command = [
        sys.executable,
        "-m",
        "mrtpo.cli",
        "bench",
        "replay",
        "--model",
        str(model_dir),
        "--task",
        "sql",
        "--prompts",
        str(args.prompts),
        "--group-size",
        str(args.group_size),
        "--max-new-tokens",
        str(args.max_new_tokens),
        "--groups-per-pass",
        str(per_pass or 0),
        "--profile",
        "--out",
        str(out),
    ]
    rc, text = _run_logged(command, timeout, args.out / f"replay-{shape}.log")
    print(text[-6000:], flush=True)
    if rc != 0 or not out.exists():
        return {"rc": rc}
    record = json.loads(out.read_text())
    profile = record.get("profile", {})
    return {
        "rc": rc,
        **{k: v for k, v in record["rows"][0].items() if not k.endswith("_all_s")},
        **{k: profile[k] for k in ("kernel_launches", "synchronizations", "memcpy") if k in profile},
    }


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    import torch
    import transformers
    import trl

    shapes = [s.strip() for s in args.shapes.split(",") if s.strip()]
    unknown = [s for s in shapes if s not in SHAPES]
    if unknown:
        raise SystemExit(f"unknown shape(s) {unknown}; choose from {', '.join(SHAPES)}")
    if not torch.cuda.is_available() and shapes != ["tiny"]:
        raise SystemExit(
            "no CUDA device: this check measures a GPU. For a CPU dry run of the same path: "
            "--shapes tiny use_cpu=true bf16=false"
        )
    start = time.perf_counter()
    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
    print(
        f"{device}; torch {torch.__version__}, transformers {transformers.__version__}, trl {trl.__version__}",
        flush=True,
    )
    tokenizer = _tokenizer_dir(args.tokenizer)
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    args.out.mkdir(parents=True, exist_ok=True)
    rows, replays = [], {}
    for shape in shapes:
        model_dir = build_model(shape, tokenizer, args.models or args.out / "models")
        left = args.deadline - (time.perf_counter() - start)
        if args.replay_timeout > 0 and left > 60:
            replays[shape] = _replay(model_dir, shape, args, min(args.replay_timeout, left / 3))
        for index, method in enumerate(methods):
            left = args.deadline - (time.perf_counter() - start)
            budget = left / (len(methods) - index)  # an even share of what is left for this shape's runs
            if budget < 30:
                print(f"skip {shape} {method}: {left:.0f} s of the deadline left", flush=True)
                rows.append({"shape": shape, "method": method, "rc": "skipped"})
                continue
            row = _train(model_dir, method, args.out / "runs" / f"{shape}-{method}", args, budget)
            rows.append({"shape": shape, "method": method, **row})
    ratios = {}
    for shape in shapes:
        by_method = {r["method"]: r for r in rows if r["shape"] == shape and r.get("rc") == 0}
        if "gdpo" in by_method and "mrtpo" in by_method and by_method["gdpo"]["step"] > 0:
            ratios[shape] = by_method["mrtpo"]["step"] / by_method["gdpo"]["step"]
    print(
        f"\n{'shape':>6} {'method':>7} {'rc':>8} {'steps':>5} {'step s':>7} {'gen s':>7} {'replay s':>8} "
        f"{'update s':>8} {'peak GiB':>8}"
    )
    for r in rows:
        if r.get("rc") == "skipped":
            print(f"{r['shape']:>6} {r['method']:>7} {'skipped':>8}")
            continue
        peak = "-" if r["peak_gib"] is None else f"{r['peak_gib']:.1f}"
        print(
            f"{r['shape']:>6} {r['method']:>7} {str(r['rc']):>8} {r['steps']:>5} {r['step']:>7.2f} "
            f"{r['generation']:>7.2f} {r['replay']:>8.2f} {r['update']:>8.2f} {peak:>8}"
        )
    for shape, ratio in ratios.items():
        replayed = any(r["replay"] > 0 for r in rows if r["shape"] == shape and r["method"] == "mrtpo")
        verdict = (
            ("met" if ratio <= TARGETS["step_ratio"] else "NOT met") if replayed else "not measured: no replay ran"
        )
        print(f"mrtpo / gdpo step, {shape}: {ratio:.2f}x (target <= {TARGETS['step_ratio']:.2f}x: {verdict})")
    for shape, r in replays.items():
        if r.get("rc") != 0:
            print(f"replay / plain forward, {shape}: failed ({r.get('rc')}; see {args.out}/replay-{shape}.log)")
            continue
        verdict = "met" if r["ratio"] <= TARGETS["replay_ratio"] else "NOT met"
        print(
            f"replay / plain forward, {shape}: {r['replay_s']:.3f} s / {r['floor_s']:.3f} s = {r['ratio']:.2f}x "
            f"(target <= {TARGETS['replay_ratio']:.1f}x: {verdict}); {r['replay_forward_calls']} forward calls, "
            f"{r['host_traffic']['syncs']} host syncs, {r.get('kernel_launches', '-')} kernel launches"
        )
    write_record(
        args.out / "gpu.json",
        "GPU step cost per method, random-initialised models of the presets' shapes",
        "mrtpo bench gpu " + " ".join(argv or []),
        rows,
        device=device,
        ratios=ratios,
        replays=replays,
        targets=TARGETS,
        seconds=time.perf_counter() - start,
    )
    ok = all(r.get("rc") in (0, "skipped") for r in rows) and all(r.get("rc") == 0 for r in replays.values())
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
