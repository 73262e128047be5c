"""``mrtpo bench learn``: credit methods trained side by side on one task, several seeds each.

    mrtpo bench learn --task sql                                   # CPU preset, 5 methods x 3 seeds
    mrtpo bench learn --task sql --methods gdpo,mrtpo --seeds 0,1 --max-steps 4 --eval-size 8
    mrtpo bench learn --task toolcall --preset gpu --out runs/bench/learn-toolcall-gpu
    mrtpo bench learn --task sql --compare-only                    # rebuild the comparison only

Every run gets the *same* settings: one base config (the preset, then each ``--config``, then the
flags and ``key=value`` overrides) in which only ``method`` differs between methods and only
``seed`` between seed indices. A seed is shared by all methods, so for a given seed every method
starts from the same weights (and LoRA initialisation), sees the same prompts in the same order
(TRL's sampler is seeded with it) and samples its first batch from the same RNG state; the runs
diverge only through their updates. Each run records the prompts it trained on and a digest of
every completion it sampled (``prompts.jsonl``) so that can be checked, and the comparison says
which share of each method's completions were the same as the first method's: until an update
changes a sampled token, two methods see the same samples and rewards.

Each run is evaluated on the first ``--eval-size`` examples of the task's held-out split before
training, every ``--eval-every`` steps and at the end, with the current policy in eval mode,
greedy decoding (:func:`mrtpo.evaluate.evaluate_model`, deterministic), inside a forked RNG so
evaluating does not change the training run. Every run starts from the same policy (the same
base weights; a fresh LoRA adapter adds exactly zero), so the step-0 evaluation is made once per
benchmark (``start_eval.json``) and copied into the other runs (``--no-share-start-eval``: every
run evaluates step 0 itself; the tests check both give the same outputs). The benchmark folder (``--out``, default
``runs/bench/learn-<task>``) holds::

    bench.json                 what was asked: task, methods, seeds, layers, command, machine
    <method>-seed<s>/          one run: config.yaml, metrics.jsonl, credit_samples.jsonl, eval.jsonl,
                               eval_outputs.jsonl, prompts.jsonl, report.*, finished.json
    comparison.json / .md      the table: per reward, total and completion length (mean over the
                               last steps of each run, mean +- std over seeds), held-out metric at
                               the start and the end, steps to reach the target reward, completions
                               shared with the first method, wall times
    rewards.png                one panel per reward and the total: mean over seeds per method, band =
                               range over seeds (min-max), thin lines = single seeds
    length.png, heldout.png    completion length and the held-out metrics vs step, same style

Resumable at the run level: a run whose folder has ``finished.json`` is skipped (if its settings
equal the current ones; otherwise the command stops and names the differing keys), an unfinished
one is started again from scratch. The comparison is rewritten after every run, from the
finished runs only. The benchmark runs in one process (no ``torchrun``/``accelerate launch``).

Presets: ``--preset cpu`` (configs/bench-learn-cpu.yaml: qwen2.5-coder-0.5b, LoRA r=16 on bf16
weights, 2 prompts x 4 completions of <= 64 tokens per step, 8 steps, held-out eval on 8 items
every 4 steps). Measured on the 2-core CPU here (sql, 1 prompt x 4 completions of <= 48 tokens):
~45 s per step and ~80 s per 8-item evaluation when the machine was quiet, 160-370 s per step
and 135-400 s per evaluation when other jobs shared the cores. A cpu-preset step (twice the
completions) is about twice that, so a run takes roughly 15-20 minutes on a quiet machine and an
hour or more on a shared one; 5 methods x 3 seeds is an overnight job. ``--preset gpu`` (configs/bench-learn-gpu.yaml: full
fine-tuning, bf16 mixed precision, 4 prompts x 8 completions of <= 256 tokens, 200 steps, eval on
128 items every 25 steps) is sized for one GPU of 24 GB or more; it has not been timed here.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import gc
import hashlib
import json
import math
import os
import shlex
import shutil
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

import yaml

from mrtpo.bench import machine_info

METHODS = ("grpo", "gdpo", "mrtpo", "contrast", "entropy")
DEFAULT_SEEDS = (0, 1, 2)
CONFIGS_DIR = Path(__file__).resolve().parents[3] / "configs"
FINISHED = "finished.json"

#: Held-out metrics plotted per task (top-level keys of ``task.evaluate()``); the first is the
#: headline metric of the tables.
HELDOUT_METRICS: dict[str, tuple[str, ...]] = {
    "sql": ("execution_accuracy", "executable_rate", "format_rate"),
    "toolcall": ("accuracy", "accuracy_macro", "format_rate"),
    "instructions": ("prompt_level_strict", "instruction_level_strict", "prompt_level_loose"),
}

#: Keys the benchmark sets per run; a config or override may not set them.
_CONTROLLED = ("method", "seed", "output_dir", "task")
#: Keys that may differ between the runs of one benchmark (everything else must be identical).
_PER_RUN = ("method", "seed", "output_dir")
#: Evaluation settings a finished run must share with the current invocation to be kept.
_EVAL_KEYS = ("eval_every", "eval_size", "eval_batch_size", "eval_max_new_tokens")
#: Keys of a preset's ``bench:`` section.
_BENCH_KEYS = ("eval_every", "eval_size", "eval_batch_size", "eval_max_new_tokens", "target_reward",
               "target_key", "target_window", "tail")

__all__ = [
    "HELDOUT_METRICS",
    "METHODS",
    "BenchError",
    "EvalCallback",
    "aggregate_curves",
    "build_comparison",
    "completion_digests",
    "main",
    "read_preset",
    "shared_samples",
    "steps_to_target",
    "summarise_steps_to_target",
]


class BenchError(ValueError):
    """A mistake in the benchmark's inputs; the message says what to change."""


# --------------------------------------------------------------------------------------------
# Pure helpers (unit-tested on hand-made records).
# --------------------------------------------------------------------------------------------
def _finite(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def steps_to_target(records: Sequence[Mapping[str, Any]], target: float, key: str = "reward",
                    window: int = 1) -> int | None:
    """The first logged step at which ``key`` reaches ``target``; None if it never does.

    ``records`` are metrics.jsonl lines; only per-step training lines count (the end-of-training
    summary and eval lines are ignored, a step logged twice keeps its last line). With
    ``window > 1`` the value compared is the mean of the last ``window`` logged values up to and
    including that step (fewer at the start), which damps single lucky batches.
    """
    from mrtpo.report.curves import series

    if window < 1:
        raise ValueError(f"window must be >= 1, got {window}")
    steps, values = series(records, key)
    for i, step in enumerate(steps):
        recent = values[max(0, i - window + 1): i + 1]
        if sum(recent) / len(recent) >= target:
            return step
    return None


def summarise_steps_to_target(per_seed: Mapping[int, int | None], max_steps: int | None = None) -> dict[str, Any]:
    """Per method: how many seeds reached the target, and the mean steps over those that did.

    A seed that never reached it is not averaged in (its step count is unknown, only "more than
    the run's length"); ``text`` says so, e.g. ``"3.5 (2/3 seeds; 1 not reached within 8 steps)"``.
    """
    reached = [s for s in per_seed.values() if s is not None]
    n, k = len(per_seed), len(reached)
    mean = sum(reached) / k if k else None
    within = f" within {max_steps} steps" if max_steps else ""
    if not n:
        text = "no runs"
    elif k == 0:
        text = f"not reached (0/{n} seeds{within})"
    elif k == n:
        text = f"{mean:.1f} ({k}/{n} seeds)"
    else:
        text = f"{mean:.1f} ({k}/{n} seeds; {n - k} not reached{within})"
    return {"per_seed": {str(s): v for s, v in per_seed.items()}, "reached": k, "of": n, "mean": mean, "text": text}


def _stats(values: Sequence[float]) -> dict[str, Any]:
    """mean, sample std (None for one value), min, max and n of finite values."""
    vals = [float(v) for v in values if _finite(v)]
    if not vals:
        return {"mean": None, "std": None, "min": None, "max": None, "n": 0}
    mean = sum(vals) / len(vals)
    std = math.sqrt(sum((v - mean) ** 2 for v in vals) / (len(vals) - 1)) if len(vals) > 1 else None
    return {"mean": mean, "std": std, "min": min(vals), "max": max(vals), "n": len(vals)}


def aggregate_curves(per_seed: Mapping[Any, tuple[Sequence[int], Sequence[float]]]) -> dict[str, list]:
    """Mean / min / max over seeds at every step any seed logged (``n`` seeds at that step)."""
    by_step: dict[int, list[float]] = {}
    for steps, values in per_seed.values():
        for s, v in zip(steps, values):
            if _finite(v):
                by_step.setdefault(int(s), []).append(float(v))
    out: dict[str, list] = {"steps": [], "mean": [], "min": [], "max": [], "n": []}
    for s in sorted(by_step):
        vals = by_step[s]
        out["steps"].append(s)
        out["mean"].append(sum(vals) / len(vals))
        out["min"].append(min(vals))
        out["max"].append(max(vals))
        out["n"].append(len(vals))
    return out


def _tail_mean(values: Sequence[float], tail: int) -> float | None:
    vals = [v for v in values if _finite(v)][-tail:]
    return sum(vals) / len(vals) if vals else None


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


# --------------------------------------------------------------------------------------------
# Presets and per-run configs.
# --------------------------------------------------------------------------------------------
def _resolve_preset(preset: str) -> Path:
    path = Path(preset)
    if path.suffix in (".yaml", ".yml") or path.is_file():
        if not path.is_file():
            raise BenchError(f"preset file {path} does not exist")
        return path
    named = CONFIGS_DIR / f"bench-learn-{preset}.yaml"
    if not named.is_file():
        raise BenchError(f"unknown preset {preset!r}: there is no {named}. Use cpu, gpu or a YAML file path.")
    return named


def read_preset(path: str | os.PathLike, task: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(training settings, bench settings)`` of a preset file for ``task``.

    A preset is a ``mrtpo train`` config plus two reserved sections: ``per_task: {<task>: {...}}``
    (training settings merged over the common ones for that task) and ``bench: {...}``
    (:data:`_BENCH_KEYS`; a mapping value such as ``target_reward: {sql: 2.5}`` is per task).
    """
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise BenchError(f"preset {path} is not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise BenchError(f"preset {path} must be a mapping of key: value lines")
    per_task = data.pop("per_task", None) or {}
    bench = data.pop("bench", None) or {}
    if not isinstance(per_task, dict) or not isinstance(bench, dict):
        raise BenchError(f"preset {path}: per_task and bench must be mappings")
    unknown = sorted(set(bench) - set(_BENCH_KEYS))
    if unknown:
        raise BenchError(f"preset {path}: unknown bench key(s) {', '.join(unknown)}; valid: {', '.join(_BENCH_KEYS)}")
    train = dict(data)
    train.update(per_task.get(task) or {})
    bench = {k: (v.get(task) if isinstance(v, dict) else v) for k, v in bench.items()}
    return train, bench


def _run_dir(out: Path, method: str, seed: int) -> Path:
    return out / f"{method}-seed{seed}"


def _stable_settings(config) -> dict[str, Any]:
    """The run's flat settings as JSON values, without the keys that differ per run."""
    flat = {k: v for k, v in config.to_flat().items() if k not in _PER_RUN}
    return json.loads(json.dumps(flat, default=str))


def _diff(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[str]:
    """Keys both mappings have with different values (a key only one side has, e.g. a setting added
    to the trainer after a run finished, is not a difference: it kept its default)."""
    return [f"{k}: {a[k]!r} vs {b[k]!r}" for k in sorted(set(a) & set(b)) if a[k] != b[k]]


def plan_configs(task: str, methods: Sequence[str], seeds: Sequence[int], preset_train: dict[str, Any],
                 preset_source: str, configs: Sequence[str], overrides: dict[str, Any], out: Path):
    """``{(method, seed): RunConfig}``, built from one base; checks that only method/seed/folder differ."""
    from mrtpo.train import ConfigError, load_config

    for key in _CONTROLLED:
        if key in overrides:
            raise BenchError(f"{key} is set by the benchmark (use --task/--methods/--seeds/--out), not as {key}=...")
    for path in configs:
        if not Path(path).is_file():
            raise BenchError(f"config file {path} does not exist")
        given = yaml.safe_load(Path(path).read_text()) or {}
        bad = [k for k in _CONTROLLED if k in given]
        if bad:
            raise BenchError(f"config {path} sets {', '.join(bad)}, which the benchmark controls per run; remove it "
                             "(use --task/--methods/--seeds/--out)")
    base = {**preset_train, "task": task}
    plans = {}
    for seed in seeds:
        for method in methods:
            per_run = {**overrides, "method": method, "seed": seed, "output_dir": str(_run_dir(out, method, seed))}
            try:
                plans[(method, seed)] = load_config(list(configs), per_run, base=base, base_source=preset_source)
            except ConfigError as exc:
                raise BenchError(str(exc)) from None
    first = None
    for key, config in plans.items():
        settings = _stable_settings(config)
        if first is None:
            first = (key, settings)
        elif settings != first[1] or _diff(first[1], settings):  # pragma: no cover  (load_config is deterministic; a guard)
            raise BenchError(f"runs {first[0]} and {key} would differ in more than method/seed: {_diff(first[1], settings)}")
    return plans


# --------------------------------------------------------------------------------------------
# Held-out evaluation during training.
# --------------------------------------------------------------------------------------------
def _eval_callback_class():
    from transformers import TrainerCallback

    class _EvalCallback(TrainerCallback):
        """Held-out evaluation of the current policy at step 0, every ``every`` steps and at the end.

        Greedy, deterministic (:func:`mrtpo.evaluate.evaluate_model`) on ``examples``; the policy is
        put in eval mode under ``torch.no_grad`` and its train mode restored, inside a forked RNG so
        the training run is the same with or without evaluation. Appends one line per evaluation to
        ``eval.jsonl`` (step, the task's scalar metrics, mean new tokens, seconds) and the outputs to
        ``eval_outputs.jsonl``.

        ``start_cache`` (a JSON file) shares the step-0 evaluation between the runs of one benchmark:
        every run starts from the same policy (the same base weights; a fresh LoRA adapter adds
        exactly zero), so its greedy step-0 outputs are the same. The first run writes the file with
        ``signature`` (the settings the runs share); a later run with the same signature copies it,
        marked ``"shared_from"``, instead of generating again.
        """

        def __init__(self, trainer, task, examples, every: int, folder: Path, batch_size: int = 8,
                     max_new_tokens: int | None = None, at_start: bool = True,
                     start_cache: Path | None = None, signature: str = ""):
            self.trainer, self.task, self.examples = trainer, task, list(examples)
            self.every, self.folder = int(every), Path(folder)
            self.batch_size, self.max_new_tokens, self.at_start = batch_size, max_new_tokens, at_start
            self.start_cache, self.signature = (Path(start_cache) if start_cache else None), signature
            self.last_step: int | None = None
            self.seconds = 0.0

        def _write(self, record: dict[str, Any], outputs: list[dict[str, Any]]) -> None:
            self.folder.mkdir(parents=True, exist_ok=True)
            with (self.folder / "eval.jsonl").open("a") as f:
                f.write(json.dumps(record) + "\n")
            with (self.folder / "eval_outputs.jsonl").open("a") as f:
                for o in outputs:
                    f.write(json.dumps(o, ensure_ascii=False) + "\n")
            self.last_step = record["step"]

        def _shared_start(self) -> bool:
            """Copy the cached step-0 evaluation if it was made under the same settings."""
            if self.start_cache is None or not self.start_cache.is_file():
                return False
            cached = json.loads(self.start_cache.read_text())
            if cached.get("signature") != self.signature:
                return False
            self._write({**cached["record"], "shared_from": cached["run"]}, cached["outputs"])
            return True

        def evaluate(self, step: int) -> dict[str, Any]:
            import torch

            from mrtpo.evaluate import evaluate_model

            model = self.trainer.accelerator.unwrap_model(self.trainer.model)
            was_training = model.training
            devices = [torch.cuda.current_device()] if torch.cuda.is_available() else []
            start = time.perf_counter()
            with torch.random.fork_rng(devices=devices):
                model.eval()
                try:
                    with torch.no_grad():
                        metrics, gens = evaluate_model(model, self.trainer.processing_class, self.task, self.examples,
                                                       batch_size=self.batch_size, max_new_tokens=self.max_new_tokens,
                                                       progress=False)
                finally:
                    model.train(was_training)
            seconds = time.perf_counter() - start
            self.seconds += seconds
            record = {
                "step": step,
                "metrics": {k: v for k, v in metrics.items() if _finite(v)},
                "n": len(gens),
                "mean_new_tokens": sum(g.new_tokens for g in gens) / max(len(gens), 1),
                "truncated": sum(not g.stopped for g in gens),
                "seconds": round(seconds, 3),
            }
            outputs = [{"step": step, **{k: v for k, v in g.record().items() if k != "prompt"}} for g in gens]
            self._write(record, outputs)
            if step == 0 and self.start_cache is not None:
                self.start_cache.write_text(json.dumps({"signature": self.signature, "run": self.folder.name,
                                                        "record": record, "outputs": outputs}) + "\n")
            return record

        def on_train_begin(self, args, state, control, **kwargs):
            if self.at_start and state.global_step == 0 and not self._shared_start():
                self.evaluate(0)

        def on_step_end(self, args, state, control, **kwargs):
            if self.every > 0 and state.global_step % self.every == 0 and state.global_step != self.last_step:
                self.evaluate(state.global_step)

        def on_train_end(self, args, state, control, **kwargs):
            if state.global_step != self.last_step:
                self.evaluate(state.global_step)

    return _EvalCallback


def EvalCallback(*args, **kwargs):  # a factory that reads like the class it returns
    """Build the held-out evaluation callback (see ``_EvalCallback``; transformers imported lazily)."""
    return _eval_callback_class()(*args, **kwargs)


def completion_digests(completion_ids, completion_mask) -> list[str]:
    """A 16-hex-digit hash of each completion's tokens: ``(B, T)`` ids and mask -> B strings.

    Padding (mask 0) is left out, so two completions hash alike iff their tokens are the same.
    """
    digests = []
    for ids, mask in zip(completion_ids.tolist(), completion_mask.tolist()):
        tokens = [t for t, m in zip(ids, mask) if m]
        digests.append(hashlib.sha1(json.dumps(tokens).encode()).hexdigest()[:16])
    return digests


def _record_batches(trainer, path: Path) -> None:
    """Log every generation batch (in order) to ``prompts.jsonl``: the step, its example ids and a
    digest of each sampled completion (:func:`completion_digests`).

    Observes the trainer without changing it: the batch passed to TRL's
    ``_generate_and_score_completions`` and the completions it returns are recorded, the
    returned dict handed on untouched.
    """
    inner = trainer._generate_and_score_completions

    def recording(inputs):
        record = {"step": trainer.state.global_step, "training": bool(trainer.model.training),
                  "example_ids": [str(row.get("example_id", "")) for row in inputs]}
        out = inner(inputs)
        record["completions"] = completion_digests(out["completion_ids"].cpu(), out["completion_mask"].cpu())
        with path.open("a") as f:
            f.write(json.dumps(record) + "\n")
        return out

    trainer._generate_and_score_completions = recording


def shared_samples(reference: Sequence[Sequence[str]], other: Sequence[Sequence[str]]) -> dict[str, Any]:
    """How many of ``other``'s sampled completions are identical to ``reference``'s.

    Both are per generation batch, in order, lists of completion digests of two runs with the same
    seed (so the same prompts and sampling RNG). Until the updates move either policy enough to
    change one sampled token, the two runs sample the same completions and their rewards cannot
    differ. Returns ``share`` (identical / compared, over the batches both have), ``compared``,
    ``per_batch`` shares and ``first_different`` (index of the first batch with a difference, or
    None when every compared completion is identical).
    """
    per_batch, same, total = [], 0, 0
    for ref, oth in zip(reference, other):
        hits = sum(a == b for a, b in zip(ref, oth))
        n = max(len(ref), len(oth))
        per_batch.append(hits / n if n else 1.0)
        same, total = same + hits, total + n
    first = next((i for i, share in enumerate(per_batch) if share < 1.0), None)
    return {"share": same / total if total else None, "compared": total, "per_batch": per_batch,
            "first_different": first}


# --------------------------------------------------------------------------------------------
# One run.
# --------------------------------------------------------------------------------------------
def _looks_like_run_folder(folder: Path) -> bool:
    names = {p.name for p in folder.iterdir()}
    return not names or bool(names & {"config.yaml", "metrics.jsonl", "eval.jsonl", "prompts.jsonl"})


def run_one(config, eval_settings: dict[str, Any], log=print) -> dict[str, Any]:
    """Train one (method, seed) run with held-out evaluation; write ``finished.json`` at the end."""
    import torch

    from mrtpo.train import build_trainer, write_config

    folder = Path(config.args.output_dir)
    if folder.exists():
        if not _looks_like_run_folder(folder):
            raise BenchError(f"{folder} exists and is not a run folder of this benchmark; move it or choose another --out")
        log(f"  {folder.name}: unfinished run found, starting it again from scratch")
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    write_config(config, folder / "config.yaml")
    t0 = time.perf_counter()
    trainer = build_trainer(config)
    if trainer.accelerator.num_processes != 1:
        raise BenchError("mrtpo bench learn runs in one process; start it with plain `mrtpo bench learn`, "
                         "not torchrun / accelerate launch")
    task = trainer.mrtpo_task
    examples = task.load("eval", eval_settings["eval_size"]) if eval_settings["eval_size"] else []
    callback = None
    if examples:
        share = eval_settings.get("share_start_eval", True)
        signature = json.dumps({"settings": _stable_settings(config),
                                "eval": {k: eval_settings[k] for k in _EVAL_KEYS if k != "eval_every"}},
                               sort_keys=True)
        callback = EvalCallback(trainer, task, examples, eval_settings["eval_every"], folder,
                                batch_size=eval_settings["eval_batch_size"],
                                max_new_tokens=eval_settings["eval_max_new_tokens"],
                                start_cache=folder.parent / "start_eval.json" if share else None,
                                signature=signature)
        trainer.add_callback(callback)
    _record_batches(trainer, folder / "prompts.jsonl")
    ready = time.perf_counter()
    trainer.train()
    trained = time.perf_counter()
    if config.run.report:
        from mrtpo.report.build import make_report

        make_report(folder, samples=config.run.report_samples)
    eval_s = callback.seconds if callback else 0.0
    info = {
        "method": config.args.method,
        "seed": config.args.seed,
        "steps": trainer.state.global_step,
        "wall_s": round(time.perf_counter() - t0, 1),
        "setup_s": round(ready - t0, 1),
        "train_s": round(trained - ready - eval_s, 1),
        "eval_s": round(eval_s, 1),
        "date": _dt.datetime.now(_dt.UTC).astimezone().isoformat(timespec="seconds"),
        "settings": _stable_settings(config),
        "eval": {k: eval_settings[k] for k in _EVAL_KEYS},
    }
    (folder / FINISHED).write_text(json.dumps(info, indent=1) + "\n")
    del trainer, callback
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return info


# --------------------------------------------------------------------------------------------
# The comparison.
# --------------------------------------------------------------------------------------------
def _fmt(stats: Mapping[str, Any] | None, spec: str = "{:.3f}") -> str:
    if not stats or stats.get("mean") is None:
        return "n/a"
    text = spec.format(stats["mean"])
    if stats.get("std") is not None:
        text += " ± " + spec.format(stats["std"])
    return text


def build_comparison(out: str | os.PathLike, task: str, methods: Sequence[str], seeds: Sequence[int],
                     target: float | None = None, target_key: str = "reward", target_window: int = 1,
                     tail: int = 3, heldout: Sequence[str] | None = None, header: Mapping[str, Any] | None = None,
                     plots: bool = True) -> dict[str, Any]:
    """Read the finished runs under ``out`` and write comparison.json/.md and the PNGs; return the JSON.

    Final values are the mean of each run's last ``tail`` logged steps, then mean ± sample std over
    seeds; held-out metrics are taken at the first and the last evaluation of each run.
    """
    from mrtpo.report.curves import load_metrics, reward_names, series

    out = Path(out)
    heldout = list(heldout or HELDOUT_METRICS.get(task, ()))
    runs, missing, records_of, evals_of, batches_of = [], [], {}, {}, {}
    names: list[str] = []
    for method in methods:
        for seed in seeds:
            folder = _run_dir(out, method, seed)
            done = folder / FINISHED
            if not done.is_file():
                missing.append([method, seed])
                continue
            info = json.loads(done.read_text())
            records = load_metrics(folder / "metrics.jsonl")
            evals = _read_jsonl(folder / "eval.jsonl")
            records_of[(method, seed)], evals_of[(method, seed)] = records, evals
            batches_of[(method, seed)] = [b for b in _read_jsonl(folder / "prompts.jsonl")
                                          if b.get("training") and "completions" in b]
            names += [n for n in reward_names(records) if n not in names]
            runs.append((method, seed, folder, info))
    keys = [*(f"rewards/{n}/mean" for n in names), "reward", "completions/mean_length"]
    labels = {**{f"rewards/{n}/mean": n for n in names}, "reward": "total reward",
              "completions/mean_length": "completion length"}
    max_steps = max((info["steps"] for *_, info in runs), default=None)

    run_rows, summary, curves = [], {}, {}
    for method in methods:
        mine = [(s, f, i) for m, s, f, i in runs if m == method]
        finals: dict[str, list[float]] = {k: [] for k in keys}
        held: dict[str, dict[str, list[float]]] = {m: {"start": [], "end": []} for m in heldout}
        stt: dict[int, int | None] = {}
        for seed, folder, info in mine:
            records, evals = records_of[(method, seed)], evals_of[(method, seed)]
            row = {"method": method, "seed": seed, "folder": str(folder), "steps": info["steps"],
                   "wall_s": info.get("wall_s"), "train_s": info.get("train_s"), "eval_s": info.get("eval_s"),
                   "final": {}, "heldout": {}}
            for k in keys:
                value = _tail_mean(series(records, k)[1], tail)
                row["final"][k] = value
                if value is not None:
                    finals[k].append(value)
            for m in heldout:
                vals = [(e["step"], e["metrics"][m]) for e in evals if _finite(e.get("metrics", {}).get(m))]
                if vals:
                    row["heldout"][m] = {"start": vals[0][1], "start_step": vals[0][0],
                                         "end": vals[-1][1], "end_step": vals[-1][0]}
                    held[m]["start"].append(vals[0][1])
                    held[m]["end"].append(vals[-1][1])
            if target is not None:
                stt[seed] = steps_to_target(records, target, target_key, target_window)
                row["steps_to_target"] = stt[seed]
            run_rows.append(row)
        summary[method] = {
            "seeds": [s for s, _, _ in mine],
            "final": {k: _stats(v) for k, v in finals.items()},
            "heldout": {m: {"start": _stats(v["start"]), "end": _stats(v["end"])} for m, v in held.items()},
            "wall_s": _stats([i.get("wall_s") for _, _, i in mine]),
        }
        if target is not None:
            summary[method]["steps_to_target"] = summarise_steps_to_target(stt, max_steps)
        curves[method] = {k: aggregate_curves({s: series(records_of[(method, s)], k) for s, _, _ in mine})
                          for k in keys}
        for m in heldout:
            curves[method][f"heldout/{m}"] = aggregate_curves({
                s: ([e["step"] for e in evals_of[(method, s)] if _finite(e.get("metrics", {}).get(m))],
                    [e["metrics"][m] for e in evals_of[(method, s)] if _finite(e.get("metrics", {}).get(m))])
                for s, _, _ in mine})

    _add_shared_samples(summary, methods, batches_of)

    result = {
        "task": task, "methods": list(methods), "seeds": list(seeds), "header": dict(header or {}),
        "rewards": names, "tail": tail, "heldout_metrics": heldout,
        "target": {"key": target_key, "value": target, "window": target_window},
        "runs": run_rows, "missing": missing, "summary": summary, "curves": curves,
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "comparison.json").write_text(json.dumps(result, indent=1) + "\n")
    pngs = {}
    if plots and runs:
        per_seed = {(m, s): records_of[(m, s)] for m, s, _, _ in runs}
        pngs["rewards"] = _plot(out / "rewards.png", methods, curves, per_seed, series,
                                [(k, labels[k]) for k in keys if k != "completions/mean_length"],
                                f"{task}: training rewards (mean over seeds; band = min-max over seeds)",
                                hlines={target_key: (target, f"target {target:g}")} if target is not None else None)
        pngs["length"] = _plot(out / "length.png", methods, curves, per_seed, series,
                               [("completions/mean_length", "completion length (tokens)")],
                               f"{task}: completion length")
        evals_series = {(m, s): evals_of[(m, s)] for m, s, _, _ in runs}
        pngs["heldout"] = _plot(out / "heldout.png", methods, curves, evals_series, _eval_series,
                                [(f"heldout/{m}", f"held-out {m}") for m in heldout],
                                f"{task}: held-out metrics (greedy; mean over seeds, band = min-max)",
                                ylim=(-0.03, 1.03))  # rates: a full axis, so small changes look small
    (out / "comparison.md").write_text(_markdown(result, labels, keys, pngs))
    return result


def _add_shared_samples(summary: dict[str, Any], methods: Sequence[str],
                        batches_of: Mapping[tuple[str, int], list[dict[str, Any]]]) -> None:
    """Per method after the first, the share of its training completions identical to the first
    method's with the same seed (:func:`shared_samples`), into ``summary[method]["shared_samples"]``."""
    reference = methods[0]
    for method in methods[1:]:
        per_seed = {}
        for (m, seed), batches in batches_of.items():
            ref = batches_of.get((reference, seed))
            if m != method or not batches or not ref:
                continue
            got = shared_samples([b["completions"] for b in ref], [b["completions"] for b in batches])
            i = got["first_different"]
            per_seed[str(seed)] = {"share": got["share"], "compared": got["compared"],
                                   "first_different_step": None if i is None else ref[i]["step"] + 1}
        if per_seed and method in summary:
            summary[method]["shared_samples"] = {
                "reference": reference, "share": _stats([v["share"] for v in per_seed.values()]),
                "per_seed": per_seed}


def _eval_series(evals: Sequence[Mapping[str, Any]], key: str) -> tuple[list[int], list[float]]:
    metric = key.split("/", 1)[1]
    pairs = [(e["step"], e["metrics"][metric]) for e in evals if _finite(e.get("metrics", {}).get(metric))]
    return [p[0] for p in pairs], [float(p[1]) for p in pairs]


def _plot(path: Path, methods, curves, per_seed, series_fn, panels, title, hlines=None, ylim=None) -> Path:
    """One PNG: a panel per (key, title); per method its seed-mean line, min-max band, seed lines;
    ``hlines``: key -> (value, label) drawn as a dashed line (the target)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    cols = min(3, max(1, len(panels)))
    rows = math.ceil(max(1, len(panels)) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.8 * cols, 3.4 * rows), squeeze=False)
    fig.suptitle(title, fontsize=11)
    flat = [ax for row in axes for ax in row]
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax in flat[len(panels):]:
        ax.axis("off")
    for ax, (key, name) in zip(flat, panels):
        ax.set_title(name, fontsize=10)
        ax.set_xlabel("step")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        drawn = False
        for i, method in enumerate(methods):
            agg = curves.get(method, {}).get(key)
            if not agg or not agg["steps"]:
                continue
            colour = colours[i % len(colours)]
            for (m, _seed), source in per_seed.items():
                if m == method:
                    s, v = series_fn(source, key)
                    ax.plot(s, v, color=colour, alpha=0.3, lw=0.8)
            ax.plot(agg["steps"], agg["mean"], color=colour, lw=2, marker="o" if len(agg["steps"]) < 30 else None,
                    ms=3, label=f"{method} (n={max(agg['n'])})")
            ax.fill_between(agg["steps"], agg["min"], agg["max"], color=colour, alpha=0.15)
            drawn = True
        if drawn and key in (hlines or {}):
            value, label = hlines[key]
            ax.axhline(value, color="#555", ls="--", lw=1, label=label)
        if drawn:
            ax.legend(fontsize=7)
        else:
            ax.text(0.5, 0.5, "not logged", ha="center", va="center", transform=ax.transAxes, color="#888")
        if ylim is not None:
            ax.set_ylim(*ylim)
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _markdown(result: Mapping[str, Any], labels: Mapping[str, str], keys: Sequence[str], pngs: Mapping[str, Path]) -> str:
    h = result["header"]
    methods, summary = result["methods"], result["summary"]
    n_done = len(result["runs"])
    md = [f"# mrtpo bench learn: {result['task']}", ""]
    for k in ("command", "date", "machine", "model", "preset", "settings"):
        if h.get(k):
            md.append(f"- **{k}**: {'`' + h[k] + '`' if k == 'command' else h[k]}")
    md.append(f"- **runs**: {n_done} finished of {len(methods) * len(result['seeds'])} "
              f"({', '.join(methods)} × seeds {', '.join(map(str, result['seeds']))})")
    if result["missing"]:
        md.append("- **not finished (left out)**: " + ", ".join(f"{m} seed {s}" for m, s in result["missing"]))
    steps = max((r["steps"] for r in result["runs"]), default=0)
    seeds = min((len(s["seeds"]) for s in summary.values()), default=0)
    note = (f"Values are mean ± sample std over seeds; a run's training value is the mean of its last "
            f"{result['tail']} logged steps.")
    if steps < 50 or seeds < 3:
        note += (f" Small scale ({steps} steps, {seeds} seed(s) per method): differences within the spread "
                 "are noise; read these numbers as a check of the pipeline, not as a ranking of the methods.")
    md += ["", note, ""]

    md += ["## Training rewards and completion length", "",
           "| method | seeds | " + " | ".join(labels[k] for k in keys) + " |",
           "|---|---:|" + "---:|" * len(keys)]
    for m in methods:
        s = summary.get(m)
        if s:
            md.append(f"| {m} | {len(s['seeds'])} | " + " | ".join(_fmt(s['final'][k]) for k in keys) + " |")

    if result["heldout_metrics"]:
        md += ["", "## Held-out metrics (greedy, first and last evaluation)", "",
               "| method | " + " | ".join(f"{x} start | {x} end" for x in result["heldout_metrics"]) + " |",
               "|---|" + "---:|---:|" * len(result["heldout_metrics"])]
        for m in methods:
            s = summary.get(m)
            if s:
                cells = []
                for x in result["heldout_metrics"]:
                    cells += [_fmt(s["heldout"][x]["start"]), _fmt(s["heldout"][x]["end"])]
                md.append(f"| {m} | " + " | ".join(cells) + " |")

    t = result["target"]
    md += ["", "## Steps to reach the target reward", ""]
    if t["value"] is None:
        md.append("No target given (`--target-reward R`, optionally `--target-key rewards/<name>/mean`).")
    else:
        window = f", trailing mean over {t['window']} steps" if t["window"] > 1 else ""
        md += [(f"First step at which `{t['key']}` ≥ {t['value']:g}{window}; the mean is over the seeds that "
                "reached it."), "", "| method | steps to target | per seed |", "|---|---|---|"]
        for m in methods:
            s = summary.get(m)
            if s:
                st = s["steps_to_target"]
                per = ", ".join(f"{seed}: {'not reached' if v is None else v}" for seed, v in st["per_seed"].items())
                md.append(f"| {m} | {st['text']} | {per} |")

    shared = {m: summary[m]["shared_samples"] for m in methods if "shared_samples" in summary.get(m, {})}
    if shared:
        reference = next(iter(shared.values()))["reference"]
        md += ["", f"## Sampled completions shared with {reference}", "",
               (f"Share of each run's training completions that are token for token the same as {reference}'s "
                "with the same seed (same prompts, same sampling RNG). The methods' updates differ from the "
                "first step, but until they change a sampled token the runs see the same completions and "
                "rewards: a share near 1 means this comparison had little room to separate the methods."),
               "", "| method | shared | per seed: share (first step with a different completion) |", "|---|---:|---|"]
        for m, sh in shared.items():
            per = ", ".join(f"{seed}: {v['share']:.2f} ({'none' if v['first_different_step'] is None else v['first_different_step']})"
                            for seed, v in sh["per_seed"].items())
            md.append(f"| {m} | {_fmt(sh['share'], '{:.2f}')} | {per} |")

    md += ["", "## Runs", "", "| method | seed | steps | total reward (last) | length (last) | "
           + (f"held-out {result['heldout_metrics'][0]} (end) | " if result["heldout_metrics"] else "")
           + "train s | eval s |", "|---|---:|---:|---:|---:|" + ("---:|" if result["heldout_metrics"] else "") + "---:|---:|"]
    for r in result["runs"]:
        def num(v):
            return f"{v:.3f}" if _finite(v) else "n/a"
        held = ""
        if result["heldout_metrics"]:
            held = num(r["heldout"].get(result["heldout_metrics"][0], {}).get("end")) + " | "
        md.append(f"| {r['method']} | {r['seed']} | {r['steps']} | {num(r['final'].get('reward'))} | "
                  f"{num(r['final'].get('completions/mean_length'))} | {held}{r.get('train_s')} | {r.get('eval_s')} |")
    if pngs:
        md += ["", "## Curves", ""]
        md += [f"![{name}]({p.name})" for name, p in pngs.items()]
    md.append("")
    return "\n".join(md)


# --------------------------------------------------------------------------------------------
# The command.
# --------------------------------------------------------------------------------------------
def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="mrtpo bench learn",
        description="Train several credit methods side by side on one task (same seeds, data order and "
                    "generation settings), evaluate each on the held-out split at fixed intervals, and write "
                    "one comparison (PNG curves, Markdown + JSON table). Resumable: finished runs are skipped.",
        epilog="Any training key can follow as key=value (e.g. learning_rate=1e-5), except method/seed/task/"
               "output_dir, which the benchmark sets.",
    )
    p.add_argument("--task", required=True, choices=("toolcall", "instructions", "sql"))
    p.add_argument("--methods", default=",".join(METHODS), help=f"comma-separated (default {','.join(METHODS)})")
    p.add_argument("--seeds", default=",".join(map(str, DEFAULT_SEEDS)), help="comma-separated seeds (default 0,1,2)")
    p.add_argument("--preset", default="cpu", help="cpu, gpu or a preset YAML file (default cpu)")
    p.add_argument("--config", action="append", default=[], metavar="YAML",
                   help="extra training config applied to every run, after the preset (repeatable)")
    p.add_argument("--max-steps", type=int, help="optimizer steps per run (overrides the preset)")
    p.add_argument("--eval-every", type=int, help="evaluate every N steps (also at step 0 and at the end)")
    p.add_argument("--eval-size", type=int, help="first M examples of the held-out split (0: no evaluation)")
    p.add_argument("--eval-batch-size", type=int, help="prompts per generate call in evaluation")
    p.add_argument("--eval-max-new-tokens", type=int, help="generation cap in evaluation (default: the task's)")
    p.add_argument("--target-reward", type=float, help="target for the steps-to-target table")
    p.add_argument("--target-key", help="metric the target applies to (default reward: the total; or "
                                        "rewards/<name>/mean)")
    p.add_argument("--target-window", type=int, help="trailing mean over this many steps (default 1)")
    p.add_argument("--no-share-start-eval", action="store_true",
                   help="evaluate step 0 in every run (default: once per benchmark, copied to the other runs, "
                        "since every run starts from the same policy)")
    p.add_argument("--out", help="benchmark folder (default runs/bench/learn-<task>)")
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


def _main(ns, argv: list[str]) -> int:
    from mrtpo.credit import available_methods
    from mrtpo.train import ConfigError, parse_overrides

    methods = _list(ns.methods, str, "methods")
    unknown = [m for m in methods if m not in available_methods()]
    if unknown:
        raise BenchError(f"unknown method(s) {', '.join(unknown)}; choose from {', '.join(available_methods())}")
    seeds = _list(ns.seeds, int, "seeds")
    preset = _resolve_preset(ns.preset)
    preset_train, bench = read_preset(preset, ns.task)
    settings = _bench_settings(ns, bench, ns.task)
    try:
        overrides = parse_overrides(ns.overrides)
    except ConfigError as exc:
        raise BenchError(str(exc)) from None
    if ns.max_steps is not None:
        overrides["max_steps"] = ns.max_steps
    out = Path(ns.out or Path("runs") / "bench" / f"learn-{ns.task}")
    plans = plan_configs(ns.task, methods, seeds, preset_train, str(preset), ns.config, overrides, out)
    any_config = next(iter(plans.values()))
    run, args = any_config.run, any_config.args
    prompts = args.generation_batch_size // args.num_generations
    header = {
        "command": shlex.join(["mrtpo", "bench", "learn", *argv]),
        "date": _dt.datetime.now(_dt.UTC).astimezone().isoformat(timespec="seconds"),
        "machine": machine_info()["summary"],
        "model": f"{run.model} ({f'LoRA r={run.lora_r}' if run.lora_r else 'full fine-tuning'}, {run.dtype})",
        "preset": str(preset),
        "settings": (f"{args.max_steps} steps × {prompts} prompt{'s' * (prompts != 1)} × {args.num_generations} "
                     f"completions, max "
                     f"{args.max_completion_length} tokens, T={args.temperature}, lr {args.learning_rate:g}; eval on "
                     f"{settings['eval_size']} held-out items every {settings['eval_every']} steps"),
    }
    stable = _stable_settings(any_config)
    if ns.compare_only and (out / "bench.json").is_file():  # keep the command that trained the runs
        saved = json.loads((out / "bench.json").read_text())
        header.update({k: saved[k] for k in header if k in saved})

    def compare() -> dict[str, Any]:
        return build_comparison(out, ns.task, methods, seeds, target=settings["target_reward"],
                                target_key=settings["target_key"], target_window=settings["target_window"],
                                tail=settings["tail"], header=header)

    # Finished runs must have used the settings we would use now.
    status = {}
    for method, seed in plans:
        done = _run_dir(out, method, seed) / FINISHED
        if done.is_file():
            saved = json.loads(done.read_text())
            differs = _diff(saved.get("settings", {}), stable)
            differs += _diff(saved.get("eval", {}), {k: settings[k] for k in _EVAL_KEYS})
            if differs:
                raise BenchError(f"{done.parent} finished with other settings ({'; '.join(differs[:6])}). "
                                 "Use another --out, or delete that run folder to redo it.")
            status[(method, seed)] = "finished"
        else:
            status[(method, seed)] = "partial" if done.parent.exists() else "to do"
    print(f"mrtpo bench learn · task {ns.task} · {header['model']} · {header['settings']} · output {out}", flush=True)
    for (method, seed), st in status.items():
        print(f"  {method:<9} seed {seed}: {st}")
    if ns.dry_run:
        return 0
    out.mkdir(parents=True, exist_ok=True)
    if not ns.compare_only:
        (out / "bench.json").write_text(json.dumps({**header, "task": ns.task, "methods": methods, "seeds": seeds,
                                                    "configs": ns.config, "overrides": overrides, "bench": settings},
                                                   indent=1, default=str) + "\n")
        todo = [key for key, st in status.items() if st != "finished"]
        from mrtpo.models import ModelLoadError

        for i, (method, seed) in enumerate(todo, 1):
            print(f"[{i}/{len(todo)}] {method} seed {seed} -> {_run_dir(out, method, seed)}", flush=True)
            try:
                info = run_one(plans[(method, seed)], settings)
            except (ConfigError, ModelLoadError) as exc:
                raise BenchError(str(exc)) from None
            print(f"[{i}/{len(todo)}] {method} seed {seed}: {info['steps']} steps, train {info['train_s']:.0f} s, "
                  f"eval {info['eval_s']:.0f} s", flush=True)
            compare()
    result = compare()
    for method in methods:
        s = result["summary"].get(method)
        if not s:
            continue
        parts = [f"reward {_fmt(s['final']['reward'])}", f"length {_fmt(s['final']['completions/mean_length'], '{:.1f}')}"]
        if result["heldout_metrics"]:
            m = result["heldout_metrics"][0]
            parts.append(f"held-out {m} {_fmt(s['heldout'][m]['start'])} -> {_fmt(s['heldout'][m]['end'])}")
        if "steps_to_target" in s:
            parts.append(f"steps to {settings['target_key']}>={settings['target_reward']:g}: {s['steps_to_target']['text']}")
        print(f"  {method:<9} " + " | ".join(parts))
    print(f"comparison: {out / 'comparison.md'}, {out / 'comparison.json'}, rewards.png, length.png, heldout.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
