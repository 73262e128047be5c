#!/usr/bin/env python
"""The real-model verdict's runs, one after another, each run's digest committed as it lands so the
rest can continue on another machine (docs/results/2026-12-07-real-verdict-plan.md).

    python scripts/real_verdict.py plan [--machine cpu]            # every run and its status
    python scripts/real_verdict.py run [--machine cpu] [--limit N] [--commit] [--dry-run]
    python scripts/real_verdict.py compare [--machine cpu]         # the plan's measures on the digests so far
    python scripts/real_verdict.py base-rates --model smollm2-135m [--classes local] [--prompts 16]

The design (methods, seeds, learning-rate grid) is configs/real-verdict.yaml; the shape of a run is
the machine's ``mrtpo bench learn`` preset. ``run`` trains, in the plan's order, every run whose
digest ``docs/results/real-verdict/<machine>/<run>.json`` does not exist yet (digests arrive from
other machines through git), each as its own ``mrtpo bench learn`` process into
``runs/real-verdict/<machine>/<run>``, then writes its digest: the training curve (every logged
step's rewards and phase times), the held-out satisfaction per class at each evaluation, its area
under the curve, and the CPU/GPU it ran on. A verdict run needs its method's learning rate: the one
of the grid with the best mean held-out AUC over the tuning seeds (ties: the smaller), once every
tuning run of that method has its digest, or ``--lr METHOD=VALUE``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
DESIGN = ROOT / "configs" / "real-verdict.yaml"
DIGESTS = ROOT / "docs" / "results" / "real-verdict"
RUNS = ROOT / "runs" / "real-verdict"


def read_design(path: Path = DESIGN) -> dict[str, Any]:
    """The design file as a mapping (presets resolved against the repository root)."""
    design = yaml.safe_load(Path(path).read_text())
    design["presets"] = {k: str(ROOT / v) for k, v in design["presets"].items()}
    return design


def lr_text(lr: float) -> str:
    return f"{lr:.0e}".replace("e-0", "e-")


def expand(design: dict[str, Any]) -> list[dict[str, Any]]:
    """Every run of the design, in the order they train: the tuning grid (baseline then treatment,
    each learning rate on each tuning seed), then the verdict seed by seed (baseline, treatment,
    and on their seeds the control and the oracle), so a partial verdict is paired."""
    runs = []
    for role in ("baseline", "treatment"):
        for lr in design["learning_rates"]:
            for seed in design["tuning_seeds"]:
                method = design[role]
                runs.append(
                    {
                        "name": f"tune-{method}-lr{lr_text(lr)}-seed{seed}",
                        "phase": "tune",
                        "role": role,
                        "method": method,
                        "seed": seed,
                        "learning_rate": float(lr),
                    }
                )
    for seed in design["seeds"]:
        for role, seeds in (
            ("baseline", design["seeds"]),
            ("treatment", design["seeds"]),
            ("control", design["control_seeds"]),
            ("oracle", design["oracle_seeds"]),
        ):
            if seed in seeds:
                method = design[role]
                runs.append(
                    {
                        "name": f"verdict-{method}-seed{seed}",
                        "phase": "verdict",
                        "role": role,
                        "method": method,
                        "seed": seed,
                        "learning_rate": None,
                    }
                )
    return runs


def auc(points: list[tuple[int, float]]) -> float:
    """Trapezoid area under ``(step, value)`` points divided by the steps spanned: the curve's mean
    height (a run that holds 0.4 throughout scores 0.4)."""
    points = sorted(points)
    if len(points) < 2:
        return points[0][1] if points else float("nan")
    area = sum((s1 - s0) * (v0 + v1) / 2 for (s0, v0), (s1, v1) in zip(points, points[1:]))
    return area / (points[-1][0] - points[0][0])


def chosen_lr(design: dict[str, Any], role: str, digests: dict[str, dict]) -> float | None:
    """The tuning grid's learning rate for ``role``'s method with the best mean held-out AUC over the
    tuning seeds (ties: the smaller rate); ``None`` until every tuning run of that method has a digest.
    The control and the oracle take the treatment's."""
    role = "treatment" if role in ("control", "oracle") else role
    method, scores = design[role], {}
    for lr in design["learning_rates"]:
        found = [digests.get(f"tune-{method}-lr{lr_text(lr)}-seed{s}") for s in design["tuning_seeds"]]
        if any(d is None for d in found):
            return None
        scores[float(lr)] = sum(d["held_out_auc"] for d in found) / len(found)
    best = max(scores.values())
    return min(lr for lr, v in scores.items() if v == best)


def read_digests(folder: Path) -> dict[str, dict]:
    return {p.stem: json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))} if folder.is_dir() else {}


def method_registered(method: str) -> bool:
    from mrtpo.credit.methods import get_method

    try:
        get_method(method)
    except (KeyError, ValueError):
        return False
    return True


def status(design: dict[str, Any], machine: str, lr_override: dict[str, float], digests_dir: Path = DIGESTS):
    """Each run with ``state`` (done / pending / blocked) and, where it can run, its learning rate."""
    digests = read_digests(digests_dir / machine)
    out = []
    for run in expand(design):
        run = dict(run)
        if run["name"] in digests:
            run["state"], run["learning_rate"] = "done", digests[run["name"]]["learning_rate"]
        elif not method_registered(run["method"]):
            run["state"], run["why"] = "blocked", f"method {run['method']!r} is not registered in this checkout"
        elif run["phase"] == "verdict":
            lr = lr_override.get(run["method"]) or chosen_lr(design, run["role"], digests)
            run["learning_rate"] = lr
            run["state"] = "pending" if lr is not None else "blocked"
            if lr is None:
                run["why"] = "its method's tuning runs are not all done (or pass --lr METHOD=VALUE)"
        else:
            run["state"] = "pending"
        out.append(run)
    return out


def bench_command(design: dict[str, Any], machine: str, run: dict[str, Any], runs_dir: Path = RUNS) -> list[str]:
    """The ``mrtpo bench learn`` command line that trains ``run`` alone into its own folder."""
    return [
        sys.executable,
        "-m",
        "mrtpo.cli",
        "bench",
        "learn",
        "--task",
        design["task"],
        "--preset",
        design["presets"][machine],
        "--methods",
        run["method"],
        "--seeds",
        str(run["seed"]),
        "--output-dir",
        str(runs_dir / machine / run["name"]),
        "--no-share-start-eval",
        f"learning_rate={run['learning_rate']}",
    ]


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def held_out_rows(outputs: list[dict], examples: dict[str, Any]) -> list[dict[str, Any]]:
    """Per evaluation step: the mean satisfaction over every (prompt, constraint) of the held-out
    prompts, the share of prompts with all constraints met, and each class's satisfaction, scored
    again from the greedy outputs (``eval_outputs.jsonl`` rows: step, id, output)."""
    from mrtpo.tasks.instructions.evaluate import score_response

    by_step: dict[int, list[dict]] = {}
    for row in outputs:
        by_step.setdefault(int(row["step"]), []).append(row)
    rows = []
    for step, group in sorted(by_step.items()):
        met, per_class, prompts_all = [], {}, []
        for row in group:
            scored = score_response(examples[row["id"]], row["output"])
            for iid, ok in zip(scored["instructions"], scored["strict"]):
                met.append(ok)
                per_class.setdefault(iid.split("/", 1)[1], []).append(ok)
            prompts_all.append(all(scored["strict"]))
        rows.append(
            {
                "step": step,
                "n_prompts": len(group),
                "satisfaction": sum(met) / len(met),
                "prompt_all": sum(prompts_all) / len(prompts_all),
                "per_class": {k: sum(v) / len(v) for k, v in sorted(per_class.items())},
            }
        )
    return rows


def digest(run: dict[str, Any], folder: Path, examples: dict[str, Any], machine: dict[str, Any]) -> dict[str, Any]:
    """The committed summary of one finished run folder (``<method>-seed<S>`` inside ``folder``)."""
    inner = folder / f"{run['method']}-seed{run['seed']}"
    finished = json.loads((inner / "finished.json").read_text())
    steps = [r for r in _jsonl(inner / "metrics.jsonl") if "time/update" in r]
    keys = sorted({k for r in steps for k in r if k == "reward" or k.startswith(("rewards/", "time/"))})
    held = held_out_rows(_jsonl(inner / "eval_outputs.jsonl"), examples)
    return {
        **{k: run[k] for k in ("name", "phase", "role", "method", "seed", "learning_rate")},
        "machine": {k: machine.get(k) for k in ("summary", "cpu", "gpu", "cpus", "threads", "torch")},
        "cpu_flags": machine.get("cpu_flags"),
        "steps": finished["steps"],
        "wall_s": finished["wall_s"],
        "train_s": finished["train_s"],
        "eval_s": finished["eval_s"],
        "date": finished["date"],
        "settings": finished["settings"],
        "train": {"step": [r.get("step") for r in steps], **{k: [r.get(k) for r in steps] for k in keys}},
        "held_out": held,
        "held_out_auc": auc([(r["step"], r["satisfaction"]) for r in held]),
    }


def held_out_examples(design: dict[str, Any], machine: str) -> dict[str, Any]:
    """The held-out prompts of the machine's preset, by id (the task the runs build)."""
    from mrtpo.bench.learn.plan import read_preset
    from mrtpo.tasks import get_task

    train, bench = read_preset(design["presets"][machine], design["task"])
    task = get_task(design["task"], **(train.get("task_args") or {}))
    return {e.id: e for e in task.load("eval", bench.get("eval_size"))}


def _machine() -> dict[str, Any]:
    from mrtpo.machine import cpu_flags, machine_info

    info = machine_info()
    info["cpu_flags"] = sorted(cpu_flags() & {"avx2", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16"})
    return info


def cmd_plan(args, design) -> int:
    rows = status(design, args.machine, args.lr, args.digests)
    for run in rows:
        lr = "-" if run["learning_rate"] is None else f"{run['learning_rate']:g}"
        print(f"{run['state']:<8} {run['name']:<40} lr {lr:<6} {run.get('why', '')}")
    counts = {s: sum(r["state"] == s for r in rows) for s in ("done", "pending", "blocked")}
    print(f"{len(rows)} runs: {counts['done']} done, {counts['pending']} pending, {counts['blocked']} blocked")
    return 0


def cmd_run(args, design) -> int:
    todo = [r for r in status(design, args.machine, args.lr, args.digests) if r["state"] == "pending"]
    todo = todo[: args.limit] if args.limit else todo
    examples = None
    for run in todo:
        command = bench_command(design, args.machine, run, args.runs)
        print(f"[{time.strftime('%H:%M:%S')}] {run['name']}: {' '.join(command[1:])}", flush=True)
        if args.dry_run:
            continue
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
        if subprocess.run(command, cwd=ROOT, env=env).returncode != 0:
            print(f"{run['name']} failed; its folder stays for a look, nothing is recorded", file=sys.stderr)
            return 1
        examples = examples or held_out_examples(design, args.machine)
        out = args.digests / args.machine / f"{run['name']}.json"
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(
            json.dumps(digest(run, args.runs / args.machine / run["name"], examples, _machine()), indent=1) + "\n"
        )
        print(f"wrote {out}", flush=True)
        if args.commit:
            subprocess.run(["git", "add", str(out)], cwd=ROOT, check=True)
            subprocess.run(
                ["git", "commit", "-q", "-m", f"real verdict: {run['name']} on {args.machine}"], cwd=ROOT, check=True
            )
        if run["phase"] == "tune":  # a finished tuning set can unblock verdict runs
            return cmd_run(args, design) if not args.limit else 0
    return 0


def compare(design: dict[str, Any], digests: dict[str, dict]) -> dict[str, Any]:
    """The plan's measures over the verdict digests so far: per role against its reference (treatment
    and GDPO; treatment and the control; the oracle and the treatment), the per-seed differences of
    held-out AUC and of final held-out satisfaction, paired over the seeds both have
    (``paired_comparison``: mean, 95 % t interval, sign-flip p), and the plan's verdict on the
    primary measure (provisional below the design's number of seeds)."""
    from mrtpo.bench.learn.stats import paired_comparison

    by_role: dict[str, dict[int, dict]] = {}
    for d in digests.values():
        if d.get("phase") == "verdict":
            by_role.setdefault(d["role"], {})[d["seed"]] = d
    out: dict[str, Any] = {}
    for name, role, reference in (
        ("treatment-gdpo", "treatment", "baseline"),
        ("treatment-control", "treatment", "control"),
        ("oracle-treatment", "oracle", "treatment"),
    ):
        a, b = by_role.get(role, {}), by_role.get(reference, {})
        out[name] = {
            "auc": paired_comparison(
                {s: d["held_out_auc"] for s, d in a.items()}, {s: d["held_out_auc"] for s, d in b.items()}
            ),
            "final": paired_comparison(
                {s: d["held_out"][-1]["satisfaction"] for s, d in a.items() if d["held_out"]},
                {s: d["held_out"][-1]["satisfaction"] for s, d in b.items() if d["held_out"]},
            ),
        }
    primary = out["treatment-gdpo"]["auc"]
    low, high = primary["ci95"] if primary["ci95"] else (None, None)
    if low is None:
        verdict = "no verdict: fewer than two pairs"
    elif low > 0:
        verdict = "token credit wins"
    elif high < 0:
        verdict = "GDPO wins"
    else:
        verdict = f"tie: the gains the seeds do not rule out lie in [{low:+.3f}, {high:+.3f}]"
    if primary["n"] < len(design["seeds"]):
        verdict += f" (provisional: {primary['n']} of {len(design['seeds'])} pairs)"
    out["verdict"] = verdict
    return out


def cmd_compare(args, design) -> int:
    result = compare(design, read_digests(args.digests / args.machine))
    for name in ("treatment-gdpo", "treatment-control", "oracle-treatment"):
        for measure in ("auc", "final"):
            c = result[name][measure]
            ci = "-" if not c["ci95"] else f"[{c['ci95'][0]:+.3f}, {c['ci95'][1]:+.3f}]"
            mean = "-" if c["mean_difference"] is None else f"{c['mean_difference']:+.3f}"
            print(f"{name:<18} held-out {measure:<5} n {c['n']}: {mean} {ci}")
    print(result["verdict"])
    return 0


def cmd_base_rates(args) -> int:
    """How often the starting model meets each class, sampled as training samples (temperature 1)."""
    import torch
    from transformers import GenerationConfig

    from mrtpo.fast_decode import sample
    from mrtpo.machine import choose_cpu_dtype, cpu_flags
    from mrtpo.models import load_policy
    from mrtpo.tasks.instructions import checkers
    from mrtpo.tasks.instructions.generate import GeneratorConfig, generate

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    dtype, why = choose_cpu_dtype(cpu_flags(), lora=True)
    model, tok = load_policy(args.model, dtype=getattr(torch, dtype))
    cfg = GeneratorConfig(
        seed=args.seed,
        min_constraints=args.constraints,
        max_constraints=args.constraints,
        classes=tuple(args.classes.split(",")),
    )
    gen = GenerationConfig(
        do_sample=True,
        temperature=1.0,
        top_k=0,
        top_p=1.0,
        max_new_tokens=args.max_new_tokens,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    met: dict[str, list[bool]] = {}
    start = time.perf_counter()
    for example in generate(args.prompts, cfg, start=args.start):
        text = tok.apply_chat_template(example.messages, tokenize=False, add_generation_prompt=True)
        ids = tok([text] * args.samples, return_tensors="pt", add_special_tokens=False)
        out = sample(model, ids["input_ids"], ids["attention_mask"], gen)[:, ids["input_ids"].shape[1] :]
        for row in out.tolist():
            cut = row.index(tok.eos_token_id) if tok.eos_token_id in row else len(row)
            response = tok.decode(row[:cut], skip_special_tokens=True)
            for c in example.gold["constraints"]:
                ok = checkers.check_strict(c["benchmark"], c["id"], c["kwargs"], response, example.gold["prompt"])
                met.setdefault(c["id"], []).append(ok)
    result = {
        "model": args.model,
        "dtype": dtype,
        "dtype_why": why,
        "max_new_tokens": args.max_new_tokens,
        "prompts": args.prompts,
        "samples_per_prompt": args.samples,
        "seconds": round(time.perf_counter() - start),
        "machine": {k: v for k, v in _machine().items() if k in ("summary", "cpu", "cpu_flags", "load_average")},
        "rates": {k: {"n": len(v), "met": sum(v), "rate": sum(v) / len(v)} for k, v in sorted(met.items())},
    }
    for k, v in result["rates"].items():
        print(f"{k:<40} {v['met']:>4}/{v['n']:<4} {v['rate']:.2f}")
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    return 0


def _lr_overrides(values: list[str]) -> dict[str, float]:
    out = {}
    for item in values:
        method, _, value = item.partition("=")
        out[method] = float(value)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    for name in ("plan", "run", "compare"):
        s = sub.add_parser(name)
        s.add_argument("--machine", default="cpu", help="a preset named in the design's presets (cpu, gpu)")
        s.add_argument("--design", type=Path, default=DESIGN)
        s.add_argument("--digests", type=Path, default=DIGESTS, help="where digests are read and written")
        s.add_argument("--runs", type=Path, default=RUNS, help="where run folders are written")
        s.add_argument(
            "--lr",
            action="append",
            default=[],
            metavar="METHOD=VALUE",
            help="a verdict learning rate instead of the tuning's choice",
        )
        if name == "run":
            s.add_argument("--limit", type=int, default=0, help="train at most this many runs (0: all)")
            s.add_argument("--commit", action="store_true", help="git-commit each digest as it lands")
            s.add_argument("--dry-run", action="store_true", help="print each command, train nothing")
    b = sub.add_parser("base-rates")
    b.add_argument("--model", default="smollm2-135m")
    b.add_argument("--classes", default="local", help="comma-separated instruction ids, or local")
    b.add_argument("--constraints", type=int, default=3, help="constraints per prompt")
    b.add_argument("--prompts", type=int, default=16)
    b.add_argument("--samples", type=int, default=8, help="completions per prompt")
    b.add_argument("--max-new-tokens", type=int, default=64)
    b.add_argument("--seed", type=int, default=0)
    b.add_argument("--start", type=int, default=500_000, help="first prompt index (away from training's)")
    b.add_argument("--threads", type=int, default=1)
    b.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    if args.command == "base-rates":
        return cmd_base_rates(args)
    args.lr = _lr_overrides(args.lr)
    design = read_design(args.design)
    if args.machine not in design["presets"]:
        p.error(f"--machine must be one of {sorted(design['presets'])}")
    return {"plan": cmd_plan, "run": cmd_run, "compare": cmd_compare}[args.command](args, design)


if __name__ == "__main__":
    sys.exit(main())
