"""The comparison of a learning benchmark: read the finished runs, summarise them per method, pair
them against a reference method seed by seed, and write ``comparison.json`` (+ the report).

Works on any task: the held-out metrics come from the task (:func:`heldout_metrics`), the rewards
from the runs' own ``metrics.jsonl``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mrtpo.bench.learn.plan import FINISHED, run_dir
from mrtpo.bench.learn.stats import (
    aggregate_curves,
    describe,
    finite,
    paired_comparison,
    shared_samples,
    steps_to_target,
    summarise_steps_to_target,
    tail_mean,
)

#: Held-out metrics plotted per task (top-level keys of ``task.evaluate()``); the first is the
#: headline metric of the tables. A task object may declare its own as ``heldout_metrics``.
HELDOUT_METRICS: dict[str, tuple[str, ...]] = {
    "sql": ("execution_accuracy", "executable_rate", "format_rate"),
    "toolcall": ("accuracy", "accuracy_macro", "format_rate"),
    "instructions": ("prompt_level_strict", "instruction_level_strict", "prompt_level_loose"),
}
#: The method every other one is paired against, when it is part of the benchmark.
REFERENCE_METHOD = "gdpo"
TOTAL, LENGTH = "reward", "completions/mean_length"

__all__ = ["HELDOUT_METRICS", "REFERENCE_METHOD", "FinishedRun", "build_comparison", "heldout_metrics", "load_runs"]


def heldout_metrics(task: Any) -> tuple[str, ...]:
    """The held-out metrics of ``task`` (a task object or a registered name), headline first: the
    task's own ``heldout_metrics`` attribute if it declares one, else :data:`HELDOUT_METRICS`."""
    name = task
    if isinstance(task, str):
        from mrtpo.tasks import get_task

        try:
            task = get_task(task)
        except KeyError:
            return HELDOUT_METRICS.get(name, ())
    else:
        name = getattr(task, "name", "")
    declared = getattr(task, "heldout_metrics", None)
    return tuple(declared) if declared else HELDOUT_METRICS.get(name, ())


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@dataclass
class FinishedRun:
    """One finished run's files: ``finished.json``, metrics, evaluations and training batches."""

    method: str
    seed: int
    folder: Path
    info: dict[str, Any]
    records: list[dict[str, Any]]
    evals: list[dict[str, Any]]
    batches: list[dict[str, Any]]

    def heldout_series(self, metric: str) -> tuple[list[int], list[float]]:
        """``(steps, values)`` of one held-out metric over this run's evaluations."""
        pairs = [(e["step"], float(e["metrics"][metric])) for e in self.evals
                 if finite(e.get("metrics", {}).get(metric))]
        return [p[0] for p in pairs], [p[1] for p in pairs]


def load_runs(out: Path, methods: Sequence[str], seeds: Sequence[int]) -> tuple[list[FinishedRun], list[list]]:
    """The finished runs under ``out`` and the ``[method, seed]`` pairs not finished (left out)."""
    from mrtpo.report.curves import load_metrics

    runs, missing = [], []
    for method in methods:
        for seed in seeds:
            folder = run_dir(out, method, seed)
            if not (folder / FINISHED).is_file():
                missing.append([method, seed])
                continue
            batches = [b for b in _read_jsonl(folder / "prompts.jsonl") if b.get("training") and "completions" in b]
            runs.append(FinishedRun(method, seed, folder, json.loads((folder / FINISHED).read_text()),
                                    load_metrics(folder / "metrics.jsonl"), _read_jsonl(folder / "eval.jsonl"),
                                    batches))
    return runs, missing


def _run_row(run: FinishedRun, keys: Sequence[str], heldout: Sequence[str], tail: int,
             target: float | None, target_key: str, target_window: int) -> dict[str, Any]:
    """One run's line of the table: final training values, held-out start/end, steps to target."""
    from mrtpo.report.curves import series

    row = {"method": run.method, "seed": run.seed, "folder": str(run.folder), "steps": run.info["steps"],
           "wall_s": run.info.get("wall_s"), "train_s": run.info.get("train_s"), "eval_s": run.info.get("eval_s"),
           "final": {k: tail_mean(series(run.records, k)[1], tail) for k in keys}, "heldout": {}}
    for m in heldout:
        steps, values = run.heldout_series(m)
        if values:
            row["heldout"][m] = {"start": values[0], "start_step": steps[0], "end": values[-1], "end_step": steps[-1]}
    if target is not None:
        row["steps_to_target"] = steps_to_target(run.records, target, target_key, target_window)
    return row


def _per_seed(rows: Sequence[Mapping[str, Any]], method: str, value) -> dict[int, Any]:
    return {r["seed"]: value(r) for r in rows if r["method"] == method}


def _paired(rows: Sequence[Mapping[str, Any]], methods: Sequence[str], reference: str,
            headline: str | None, with_target: bool) -> dict[str, Any]:
    """Each method against ``reference``, seed by seed: final total reward, the headline held-out
    metric at the end and (over the seeds where both reached it) the steps to the target."""
    measures = {TOTAL: lambda r: r["final"].get(TOTAL)}
    if headline:
        measures[f"heldout/{headline}"] = lambda r: r["heldout"].get(headline, {}).get("end")
    if with_target:
        measures["steps_to_target"] = lambda r: r.get("steps_to_target")
    return {method: {name: paired_comparison(_per_seed(rows, method, get), _per_seed(rows, reference, get))
                     for name, get in measures.items()}
            for method in methods if method != reference}


def _shared_with_first(methods: Sequence[str], runs: Sequence[FinishedRun]) -> dict[str, Any]:
    """Per method after the first, the share of its training completions identical to the first
    method's with the same seed (:func:`~.stats.shared_samples`)."""
    reference = methods[0]
    batches = {(r.method, r.seed): r.batches for r in runs}
    out = {}
    for method in methods[1:]:
        per_seed = {}
        for run in runs:
            ref = batches.get((reference, run.seed))
            if run.method != method or not run.batches or not ref:
                continue
            got = shared_samples([b["completions"] for b in ref], [b["completions"] for b in run.batches])
            i = got["first_different"]
            per_seed[str(run.seed)] = {"share": got["share"], "compared": got["compared"],
                                       "first_different_step": None if i is None else ref[i]["step"] + 1}
        if per_seed:
            out[method] = {"reference": reference, "share": describe([v["share"] for v in per_seed.values()]),
                           "per_seed": per_seed}
    return out


def build_comparison(out: str | os.PathLike, task: Any, methods: Sequence[str], seeds: Sequence[int],
                     target: float | None = None, target_key: str = TOTAL, target_window: int = 1,
                     tail: int = 3, heldout: Sequence[str] | None = None, header: Mapping[str, Any] | None = None,
                     plots: bool = True, reference: str = REFERENCE_METHOD) -> dict[str, Any]:
    """Read the finished runs under ``out``, write comparison.json/.md and the PNGs; return the JSON.

    ``task`` is a task object or name (for its held-out metrics; ``heldout`` overrides them).
    Final values are the mean of each run's last ``tail`` logged steps, then, over seeds, mean ±
    sample std with a Student-t 95% CI; held-out metrics are taken at the first and the last
    evaluation of each run. With two or more seeds every method is paired against ``reference``
    (else the first method) seed by seed (:func:`~.stats.paired_comparison`).
    """
    from mrtpo.bench.learn.report import training_panels, write_report
    from mrtpo.report.curves import reward_names, series

    out = Path(out)
    task_name = task if isinstance(task, str) else getattr(task, "name", str(task))
    heldout = list(heldout if heldout is not None else heldout_metrics(task))
    runs, missing = load_runs(out, methods, seeds)
    names: list[str] = []
    for run in runs:
        names += [n for n in reward_names(run.records) if n not in names]
    keys = [key for key, _ in training_panels(names, with_length=True)]
    max_steps = max((r.info["steps"] for r in runs), default=None)
    rows = [_run_row(r, keys, heldout, tail, target, target_key, target_window) for r in runs]

    summary, curves = {}, {}
    shared = _shared_with_first(methods, runs)
    for method in methods:
        mine = [r for r in runs if r.method == method]
        my_rows = [r for r in rows if r["method"] == method]
        summary[method] = {
            "seeds": [r.seed for r in mine],
            "final": {k: describe([r["final"][k] for r in my_rows]) for k in keys},
            "heldout": {m: {edge: describe([r["heldout"][m][edge] for r in my_rows if m in r["heldout"]])
                            for edge in ("start", "end")} for m in heldout},
            "wall_s": describe([r.info.get("wall_s") for r in mine]),
        }
        if target is not None:
            summary[method]["steps_to_target"] = summarise_steps_to_target(
                {r["seed"]: r["steps_to_target"] for r in my_rows}, max_steps)
        if method in shared:
            summary[method]["shared_samples"] = shared[method]
        curves[method] = {k: aggregate_curves({r.seed: series(r.records, k) for r in mine}) for k in keys}
        for m in heldout:
            curves[method][f"heldout/{m}"] = aggregate_curves({r.seed: r.heldout_series(m) for r in mine})

    paired = None
    if len(seeds) >= 2 and len(methods) >= 2:
        ref = reference if reference in methods else methods[0]
        paired = {"reference": ref, "by_method": _paired(rows, methods, ref, heldout[0] if heldout else None,
                                                         target is not None)}
    result = {
        "task": task_name, "methods": list(methods), "seeds": list(seeds), "header": dict(header or {}),
        "rewards": names, "tail": tail, "heldout_metrics": heldout,
        "target": {"key": target_key, "value": target, "window": target_window},
        "runs": rows, "missing": missing, "summary": summary, "paired": paired, "curves": curves,
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "comparison.json").write_text(json.dumps(result, indent=1) + "\n")
    write_report(out, result, runs, plots=plots)
    return result
