"""The ``mrtpo bench learn`` command: parse the options, plan the runs, run the ones not finished
(one after another, in this process), rebuild the comparison after each, print a summary."""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import shlex
import sys
from pathlib import Path
from typing import Any

from mrtpo.bench.learn.compare import build_comparison
from mrtpo.bench.learn.plan import (
    DEFAULT_METHODS,
    DEFAULT_SEEDS,
    BenchError,
    method_variants,
    plan_configs,
    read_preset,
    resolve_preset,
    run_dir,
    run_status,
    start_eval_file,
)
from mrtpo.bench.learn.report import fmt_mean_std
from mrtpo.bench.learn.run import run_one
from mrtpo.cli_help import HelpFormatter
from mrtpo.config import TASK_NAMES
from mrtpo.machine import machine_info
from mrtpo.tasks import task_label, task_problem

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="mrtpo bench learn",
        description="Train several credit methods side by side on one task (same seeds, data order and "
        "generation settings), evaluate each on the held-out split at fixed intervals, and write "
        "one comparison (PNG curves, Markdown + JSON table). Resumable: finished runs are skipped.",
        epilog="Any training key can follow as key=value (e.g. learning_rate=1e-5), except method/seed/task/"
        "output_dir, which the benchmark sets.",
        formatter_class=HelpFormatter,
    )
    p.add_argument(
        "--task", required=True, help=f"{', '.join(TASK_NAMES)}, a plugin's (MRTPO_PLUGINS) or a task file (.yaml)"
    )
    p.add_argument(
        "--methods",
        default=",".join(DEFAULT_METHODS),
        help="comma-separated credit methods; LABEL=METHOD adds a variant of a method under its own "
        "name, whose settings --method-setting LABEL:key=value gives (e.g. bounded=mrtpo)",
    )
    p.add_argument("--seeds", default=",".join(map(str, DEFAULT_SEEDS)), help="comma-separated seeds")
    p.add_argument(
        "--policies",
        help="gym tasks: comma-separated warm-start seeds (task_args policy.seed); every "
        "method x policy x seed is trained and the effect's interval covers both "
        "levels (default: the task's default policy only)",
    )
    p.add_argument("--preset", default="cpu", help="cpu, gpu or a preset YAML file")
    p.add_argument(
        "--config",
        action="append",
        default=[],
        metavar="YAML",
        help="extra training config applied to every run, after the preset (repeatable)",
    )
    p.add_argument("--max-steps", type=int, help="optimizer steps per run (default: the preset's)")
    p.add_argument(
        "--eval-every", type=int, help="evaluate every N steps, also at step 0 and at the end (default: the preset's)"
    )
    p.add_argument(
        "--eval-size", type=int, help="first M examples of the held-out split, 0: no evaluation (default: the preset's)"
    )
    p.add_argument(
        "--eval-batch-size", type=int, help="prompts per generate call in evaluation (default: the preset's)"
    )
    p.add_argument(
        "--eval-max-new-tokens", type=int, help="generation cap in evaluation (default: the preset's, else the task's)"
    )
    p.add_argument("--target-reward", type=float, help="target for the steps-to-target table (default: the preset's)")
    p.add_argument(
        "--target-key",
        help="metric the target applies to: reward (the total) or "
        "rewards/<name>/mean (default: the preset's, else reward)",
    )
    p.add_argument(
        "--target-window", type=int, help="trailing mean over this many steps (default: the preset's, else 1)"
    )
    p.add_argument(
        "--no-share-start-eval",
        action="store_true",
        help="evaluate step 0 in every run (default: once per benchmark, copied to the other runs, "
        "since every run starts from the same policy)",
    )
    p.add_argument(
        "--output-dir", "--out", dest="out", metavar="DIR", help="benchmark folder (default: runs/bench/learn-<task>)"
    )
    p.add_argument(
        "--method-setting",
        action="append",
        default=[],
        metavar="METHOD:key=value",
        help="a setting for one method only, e.g. mrtpo:learning_rate=3e-4 (each method at its own "
        "best learning rate); repeatable",
    )
    p.add_argument(
        "--jobs",
        type=int,
        default=1,
        help="runs trained at once, each in its own single-thread process (1: one after "
        "another in this process). Small models (the gym) are fastest with one process per core",
    )
    p.add_argument("--worker", help=argparse.SUPPRESS)  # JSON [method, policy, seed] list: the runs this worker trains
    p.add_argument("--compare-only", action="store_true", help="only rebuild the comparison from finished runs")
    p.add_argument("--dry-run", action="store_true", help="print the runs and their status, train nothing")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="training settings for every run")
    return p


def _list(text: str, kind: type, what: str) -> list:
    try:
        items = [kind(x.strip()) for x in text.split(",") if x.strip()]
    except ValueError:
        raise BenchError(f"--{what} must be a comma-separated list, got {text!r}") from None
    if not items:
        raise BenchError(f"--{what} is empty")
    if len(set(items)) != len(items):
        raise BenchError(f"--{what} lists an entry twice: {text!r}")
    return items


def _bench_settings(ns, bench: dict[str, Any], task: str) -> dict[str, Any]:
    from mrtpo.evaluate import DEFAULT_MAX_NEW_TOKENS

    def pick(flag, key, default):
        value = getattr(ns, flag)
        return value if value is not None else (bench.get(key) if bench.get(key) is not None else default)

    s = {
        "eval_every": int(pick("eval_every", "eval_every", 0)),
        "eval_size": int(pick("eval_size", "eval_size", 0)),
        "eval_batch_size": int(pick("eval_batch_size", "eval_batch_size", 8)),
        "eval_max_new_tokens": pick("eval_max_new_tokens", "eval_max_new_tokens", DEFAULT_MAX_NEW_TOKENS.get(task)),
        "target_reward": pick("target_reward", "target_reward", None),
        "target_key": pick("target_key", "target_key", "reward"),
        "target_window": int(pick("target_window", "target_window", 1)),
        "tail": int(bench.get("tail") or 3),
        "share_start_eval": not ns.no_share_start_eval,
    }
    for key in ("eval_every", "eval_size"):
        if s[key] < 0:
            raise BenchError(f"{key.replace('_', '-')} must be >= 0, got {s[key]}")
    if s["eval_batch_size"] < 1 or s["target_window"] < 1 or s["tail"] < 1:
        raise BenchError("eval-batch-size, target-window and tail must be >= 1")
    if s["target_reward"] is not None:
        s["target_reward"] = float(s["target_reward"])
    return s


def main(argv: list[str] | None = None) -> int:
    ns = _parser().parse_args(argv)
    try:
        return _main(ns, list(sys.argv[1:] if argv is None else argv))
    except BenchError as exc:
        print(f"mrtpo bench learn: {exc}", file=sys.stderr)
        return 2


def _where(seed: int, policy: int | None) -> str:
    """``seed 3`` or ``policy 1 seed 3``: a run's place in the printed plan and progress."""
    return f"seed {seed}" if policy is None else f"policy {policy} seed {seed}"


def _header(argv: list[str], preset: Path, config, settings: dict[str, Any]) -> dict[str, str]:
    """What the comparison's header says: the command, when, where, the model and the settings."""
    run, args = config.run, config.args
    prompts = args.generation_batch_size // args.num_generations
    return {
        "command": shlex.join(["mrtpo", "bench", "learn", *argv]),
        "date": _dt.datetime.now(_dt.UTC).astimezone().isoformat(timespec="seconds"),
        "machine": machine_info()["summary"],
        "model": f"{run.model} ({f'LoRA r={run.lora_r}' if run.lora_r else 'full fine-tuning'}, {run.dtype})",
        "preset": str(preset),
        "settings": (
            f"{args.max_steps} steps × {prompts} prompt{'s' * (prompts != 1)} × {args.num_generations} "
            f"completions, max {args.max_completion_length} tokens, T={args.temperature}, "
            f"lr {args.learning_rate:g}; eval on {settings['eval_size']} held-out items every "
            f"{settings['eval_every']} steps"
        ),
    }


def _print_summary(result: dict[str, Any], settings: dict[str, Any]) -> None:
    for method in result["methods"]:
        s = result["summary"].get(method)
        if not s or not s["seeds"]:
            continue
        parts = [
            f"reward {fmt_mean_std(s['final']['reward'])}",
            f"length {fmt_mean_std(s['final']['completions/mean_length'], '{:.1f}')}",
        ]
        if result["heldout_metrics"]:
            m = result["heldout_metrics"][0]
            parts.append(
                f"held-out {m} {fmt_mean_std(s['heldout'][m]['start'])} -> {fmt_mean_std(s['heldout'][m]['end'])}"
            )
        if "steps_to_target" in s:
            parts.append(
                f"steps to {settings['target_key']}>={settings['target_reward']:g}: {s['steps_to_target']['text']}"
            )
        print(f"  {method:<9} " + " | ".join(parts))


def _run_workers(argv: list[str], todo: list[tuple], jobs: int) -> None:
    """Train the runs ``todo`` in ``jobs`` worker processes of one thread each.

    The parent deals the runs out (round robin) and names each worker's runs on its command line: a
    worker that computed its share from the runs still unfinished when it started would skip a run
    that another, faster worker had already moved out of its list."""
    import os
    import subprocess

    rest, skip = [], False
    for a in argv:  # the same command without --jobs
        if skip:
            skip = False
        elif a == "--jobs":
            skip = True
        elif not a.startswith("--jobs="):
            rest.append(a)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    print(f"training in {jobs} worker processes (one thread each)", flush=True)
    workers = [
        subprocess.Popen(
            [sys.executable, "-m", "mrtpo.cli", "bench", "learn", *rest, "--worker", json.dumps(todo[k::jobs])], env=env
        )
        for k in range(jobs)
    ]
    failed = [k for k, w in enumerate(workers) if w.wait() != 0]
    if failed:
        raise BenchError(
            f"worker(s) {failed} failed (their output is above); finished runs are kept, "
            "run the same command again to train the rest"
        )


def _main(ns, argv: list[str]) -> int:
    from mrtpo.config import ConfigError, parse_overrides
    from mrtpo.credit import available_methods
    from mrtpo.models import ModelLoadError

    if (problem := task_problem(ns.task)) is not None:  # the live registry: plugin tasks count
        raise BenchError(problem)
    methods, bases = method_variants(_list(ns.methods, str, "methods"))
    unknown = sorted({bases.get(m, m) for m in methods} - set(available_methods()))
    if unknown:
        raise BenchError(f"unknown method(s) {', '.join(unknown)}; choose from {', '.join(available_methods())}")
    seeds = _list(ns.seeds, int, "seeds")
    policies = None if ns.policies is None else _list(ns.policies, int, "policies")
    preset = resolve_preset(ns.preset)
    preset_train, bench = read_preset(preset, ns.task)
    settings = _bench_settings(ns, bench, ns.task)
    try:
        overrides = parse_overrides(ns.overrides)
    except ConfigError as exc:
        raise BenchError(str(exc)) from None
    if ns.max_steps is not None:
        overrides["max_steps"] = ns.max_steps
    out = Path(ns.out or Path("runs") / "bench" / f"learn-{task_label(ns.task)}")
    method_settings: dict[str, dict[str, Any]] = {}
    for item in ns.method_setting:
        method, sep, setting = item.partition(":")
        if not sep or "=" not in setting:
            raise BenchError(f"--method-setting takes METHOD:key=value, got {item!r}")
        try:
            method_settings.setdefault(method.strip(), {}).update(parse_overrides([setting]))
        except ConfigError as exc:
            raise BenchError(str(exc)) from None
    plans = plan_configs(
        ns.task, methods, seeds, preset_train, str(preset), ns.config, overrides, out, method_settings, policies, bases
    )
    header = _header(argv, preset, next(iter(plans.values())), settings)
    if method_settings:
        header["settings"] += "; per method: " + "; ".join(
            f"{m} " + ", ".join(f"{k}={v}" for k, v in s.items()) for m, s in method_settings.items()
        )
    if ns.compare_only and (out / "bench.json").is_file():  # keep the command that trained the runs
        saved = json.loads((out / "bench.json").read_text())
        header.update({k: saved[k] for k in header if k in saved})

    def compare() -> dict[str, Any]:
        return build_comparison(
            out,
            ns.task,
            methods,
            seeds,
            target=settings["target_reward"],
            target_key=settings["target_key"],
            target_window=settings["target_window"],
            tail=settings["tail"],
            header=header,
            policies=policies,
        )

    status = run_status(plans, out, settings)
    print(f"mrtpo bench learn · task {ns.task} · {header['model']} · {header['settings']} · output {out}", flush=True)
    for (method, policy, seed), st in status.items():
        print(f"  {method:<9} {_where(seed, policy)}: {st}")
    if ns.dry_run:
        return 0
    out.mkdir(parents=True, exist_ok=True)
    if not ns.compare_only:
        if not ns.worker:  # the parent's command is the one to keep
            request = {
                **header,
                "task": ns.task,
                "methods": methods,
                "seeds": seeds,
                **({"policies": policies} if policies is not None else {}),
                "configs": ns.config,
                "overrides": overrides,
                "bench": settings,
            }
            (out / "bench.json").write_text(json.dumps(request, indent=1, default=str) + "\n")
        todo = [key for key, st in status.items() if st != "finished"]
        if ns.jobs > 1 and len(todo) > 1:
            _run_workers(argv, todo, min(ns.jobs, len(todo)))
            unfinished = [key for key, st in run_status(plans, out, settings).items() if st != "finished"]
            if unfinished:
                raise BenchError(
                    f"the workers left {len(unfinished)} run(s) unfinished: "
                    + ", ".join(f"{m} {_where(s, p)}" for m, p, s in unfinished)
                )
            todo = []
        elif ns.worker:
            mine = {tuple(key) for key in json.loads(ns.worker)}
            todo = [key for key in todo if key in mine]
        for i, (method, policy, seed) in enumerate(todo, 1):
            name = f"{method} {_where(seed, policy)}"
            print(f"[{i}/{len(todo)}] {name} -> {run_dir(out, method, seed, policy)}", flush=True)
            try:
                info = run_one(plans[(method, policy, seed)], settings, start_eval=start_eval_file(policy))
            except (ConfigError, ModelLoadError) as exc:
                raise BenchError(str(exc)) from None
            print(
                f"[{i}/{len(todo)}] {name}: {info['steps']} steps, train {info['train_s']:.0f} s, "
                f"eval {info['eval_s']:.0f} s",
                flush=True,
            )
            if not ns.worker:  # workers leave the comparison to their parent
                compare()
    if ns.worker:
        return 0
    _print_summary(compare(), settings)
    print(f"comparison: {out / 'comparison.md'}, {out / 'comparison.json'}, rewards.png, length.png, heldout.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
