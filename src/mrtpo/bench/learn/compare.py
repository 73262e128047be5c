"""The comparison of a learning benchmark: read the finished runs, summarise them per method, pair
them against a reference method seed by seed (by policy and seed with ``--policies``, plus the
two-level interval over policies), at equal steps and at equal training seconds, and write
``comparison.json`` (+ the report).

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

from mrtpo.bench.learn.plan import FINISHED, run_dir, run_label
from mrtpo.bench.learn.stats import (
    EQUAL_TIME,
    aggregate_curves,
    describe,
    finite,
    paired_comparison,
    shared_samples,
    steps_to_target,
    summarise_steps_to_target,
    tail_mean,
    training_seconds,
    two_level_interval,
    value_at_seconds,
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
    policy: int | None = None

    @property
    def unit(self) -> int | str:
        """What pairs runs: the seed, or ``policy<P>-seed<S>`` on a benchmark over policies."""
        return unit(self.seed, self.policy)

    def heldout_series(self, metric: str) -> tuple[list[int], list[float]]:
        """``(steps, values)`` of one held-out metric over this run's evaluations."""
        pairs = [
            (e["step"], float(e["metrics"][metric])) for e in self.evals if finite(e.get("metrics", {}).get(metric))
        ]
        return [p[0] for p in pairs], [p[1] for p in pairs]


def unit(seed: int, policy: int | None = None) -> int | str:
    """The key runs are paired by: the seed, or ``policy<P>-seed<S>`` with a policy."""
    return seed if policy is None else run_label(seed, policy)


def load_runs(
    out: Path, methods: Sequence[str], seeds: Sequence[int], policies: Sequence[int] | None = None
) -> tuple[list[FinishedRun], list[list]]:
    """The finished runs under ``out`` and those not finished (left out): ``[method, seed]``, or
    ``[method, policy, seed]`` over ``policies``."""
    from mrtpo.report.curves import load_metrics

    runs, missing = [], []
    for method in methods:
        for policy in [None] if policies is None else policies:
            for seed in seeds:
                folder = run_dir(out, method, seed, policy)
                if not (folder / FINISHED).is_file():
                    missing.append([method, seed] if policy is None else [method, policy, seed])
                    continue
                batches = [b for b in _read_jsonl(folder / "prompts.jsonl") if b.get("training") and "completions" in b]
                runs.append(
                    FinishedRun(
                        method,
                        seed,
                        folder,
                        json.loads((folder / FINISHED).read_text()),
                        load_metrics(folder / "metrics.jsonl"),
                        _read_jsonl(folder / "eval.jsonl"),
                        batches,
                        policy,
                    )
                )
    return runs, missing


def _run_row(
    run: FinishedRun,
    keys: Sequence[str],
    heldout: Sequence[str],
    tail: int,
    target: float | None,
    target_key: str,
    target_window: int,
) -> dict[str, Any]:
    """One run's line of the table: final training values, held-out start/end, steps to target."""
    from mrtpo.report.curves import series

    row = {
        "method": run.method,
        "seed": run.seed,
        **({} if run.policy is None else {"policy": run.policy}),
        "folder": str(run.folder),
        "steps": run.info["steps"],
        "wall_s": run.info.get("wall_s"),
        "train_s": run.info.get("train_s"),
        "eval_s": run.info.get("eval_s"),
        "final": {k: tail_mean(series(run.records, k)[1], tail) for k in keys},
        "heldout": {},
    }
    for m in heldout:
        steps, values = run.heldout_series(m)
        if values:
            row["heldout"][m] = {"start": values[0], "start_step": steps[0], "end": values[-1], "end_step": steps[-1]}
    if target is not None:
        row["steps_to_target"] = steps_to_target(run.records, target, target_key, target_window)
    return row


def _per_seed(rows: Sequence[Mapping[str, Any]], method: str, value) -> dict[Any, Any]:
    """``{unit: value(row)}`` over one method's rows."""
    return {unit(r["seed"], r.get("policy")): value(r) for r in rows if r["method"] == method}


def _one_policy(rows: Sequence[Mapping[str, Any]], method: str, value, policy: int) -> dict[int, Any]:
    """``{seed: value(row)}`` over one method's rows on one policy."""
    return {r["seed"]: value(r) for r in rows if r["method"] == method and r.get("policy") == policy}


def _measures(rows: Sequence[Mapping[str, Any]], headline: str | None, with_target: bool) -> dict[str, Any]:
    """The paired measures: final total reward, the total at equal training seconds (when the runs
    logged their step times), the headline held-out metric at the end and the steps to the target."""
    measures = {TOTAL: lambda r: r["final"].get(TOTAL)}
    if any(r.get("equal_time") for r in rows):
        measures[EQUAL_TIME] = lambda r: (r.get("equal_time") or {}).get("value")
    if headline:
        measures[f"heldout/{headline}"] = lambda r: r["heldout"].get(headline, {}).get("end")
    if with_target:
        measures["steps_to_target"] = lambda r: r.get("steps_to_target")
    return measures


def _paired(
    rows: Sequence[Mapping[str, Any]], methods: Sequence[str], reference: str, measures: Mapping[str, Any]
) -> dict[str, Any]:
    """Each method against ``reference``, seed by seed (policy and seed over policies), per measure;
    steps to the target over the seeds where both reached it."""
    return {
        method: {
            name: paired_comparison(_per_seed(rows, method, get), _per_seed(rows, reference, get))
            for name, get in measures.items()
        }
        for method in methods
        if method != reference
    }


def _two_level(
    rows: Sequence[Mapping[str, Any]],
    methods: Sequence[str],
    reference: str,
    policies: Sequence[int],
    measures: Mapping[str, Any],
) -> dict[str, Any]:
    """Each method against ``reference`` over policies and seeds: per policy the seed-paired
    comparison (``per_policy``), over all of them :func:`~.stats.two_level_interval`."""
    out = {}
    for method in methods:
        if method == reference:
            continue
        out[method] = {}
        for name, get in measures.items():
            pairs = {p: (_one_policy(rows, method, get, p), _one_policy(rows, reference, get, p)) for p in policies}
            diffs = {
                p: [float(a[s]) - float(b[s]) for s in a if s in b and finite(a[s]) and finite(b[s])]
                for p, (a, b) in pairs.items()
            }
            out[method][name] = {
                **two_level_interval(diffs),
                "per_policy": {str(p): paired_comparison(a, b) for p, (a, b) in pairs.items()},
            }
    return out


def _equal_time(runs: Sequence[FinishedRun], rows: list[dict[str, Any]], reference: str, tail: int) -> None:
    """Add to each row ``equal_time``: its total reward after as many training seconds as the
    reference method's whole run with the same policy and seed (:func:`~.stats.value_at_seconds`)."""
    budgets = {}
    for run in runs:
        timed = training_seconds(run.records) if run.method == reference else None
        if timed:
            budgets[run.unit] = timed[1][-1]
    for run, row in zip(runs, rows):
        if run.unit in budgets:
            at = value_at_seconds(run.records, TOTAL, budgets[run.unit], tail)
            if at is not None:
                row["equal_time"] = {"budget_s": budgets[run.unit], **at}


def _shared_with_first(methods: Sequence[str], runs: Sequence[FinishedRun]) -> dict[str, Any]:
    """Per method after the first, the share of its training completions identical to the first
    method's with the same seed (:func:`~.stats.shared_samples`)."""
    reference = methods[0]
    batches = {(r.method, r.unit): r.batches for r in runs}
    out = {}
    for method in methods[1:]:
        per_seed = {}
        for run in runs:
            ref = batches.get((reference, run.unit))
            if run.method != method or not run.batches or not ref:
                continue
            got = shared_samples([b["completions"] for b in ref], [b["completions"] for b in run.batches])
            i = got["first_different"]
            per_seed[str(run.unit)] = {
                "share": got["share"],
                "compared": got["compared"],
                "first_different_step": None if i is None else ref[i]["step"] + 1,
            }
        if per_seed:
            out[method] = {
                "reference": reference,
                "share": describe([v["share"] for v in per_seed.values()]),
                "per_seed": per_seed,
            }
    return out


def build_comparison(
    out: str | os.PathLike,
    task: Any,
    methods: Sequence[str],
    seeds: Sequence[int],
    target: float | None = None,
    target_key: str = TOTAL,
    target_window: int = 1,
    tail: int = 3,
    heldout: Sequence[str] | None = None,
    header: Mapping[str, Any] | None = None,
    plots: bool = True,
    reference: str = REFERENCE_METHOD,
    policies: Sequence[int] | None = None,
) -> dict[str, Any]:
    """Read the finished runs under ``out``, write comparison.json/.md and the PNGs; return the JSON.

    ``task`` is a task object or name (for its held-out metrics; ``heldout`` overrides them).
    Final values are the mean of each run's last ``tail`` logged steps, then, over seeds, mean ±
    sample std with a Student-t 95% CI; held-out metrics are taken at the first and the last
    evaluation of each run. With two or more seeds every method is paired against ``reference``
    (else the first method) seed by seed (:func:`~.stats.paired_comparison`), also at equal
    training seconds (:data:`EQUAL_TIME`). With ``policies`` (warm-start seeds, runs
    ``<method>-policy<P>-seed<S>``) the runs pair by (policy, seed), and ``two_level`` adds per
    method the interval over policies and seeds and each policy's own seed-paired comparison.
    """
    from mrtpo.bench.learn.report import training_panels, write_report
    from mrtpo.report.curves import reward_names, series

    out = Path(out)
    task_name = task if isinstance(task, str) else getattr(task, "name", str(task))
    heldout = list(heldout if heldout is not None else heldout_metrics(task))
    runs, missing = load_runs(out, methods, seeds, policies)
    names: list[str] = []
    for run in runs:
        names += [n for n in reward_names(run.records) if n not in names]
    keys = [key for key, _ in training_panels(names, with_length=True)]
    max_steps = max((r.info["steps"] for r in runs), default=None)
    rows = [_run_row(r, keys, heldout, tail, target, target_key, target_window) for r in runs]
    ref = reference if reference in methods else methods[0]
    _equal_time(runs, rows, ref, tail)

    summary, curves = {}, {}
    shared = _shared_with_first(methods, runs)
    for method in methods:
        mine = [r for r in runs if r.method == method]
        my_rows = [r for r in rows if r["method"] == method]
        summary[method] = {
            "seeds": [r.unit for r in mine],
            "final": {k: describe([r["final"][k] for r in my_rows]) for k in keys},
            "heldout": {
                m: {
                    edge: describe([r["heldout"][m][edge] for r in my_rows if m in r["heldout"]])
                    for edge in ("start", "end")
                }
                for m in heldout
            },
            "wall_s": describe([r.info.get("wall_s") for r in mine]),
        }
        if target is not None:
            summary[method]["steps_to_target"] = summarise_steps_to_target(
                {unit(r["seed"], r.get("policy")): r["steps_to_target"] for r in my_rows}, max_steps
            )
        if method in shared:
            summary[method]["shared_samples"] = shared[method]
        curves[method] = {k: aggregate_curves({r.unit: series(r.records, k) for r in mine}) for k in keys}
        for m in heldout:
            curves[method][f"heldout/{m}"] = aggregate_curves({r.unit: r.heldout_series(m) for r in mine})

    paired, extra = None, {}
    measures = _measures(rows, heldout[0] if heldout else None, target is not None)
    if len(seeds) * len(policies or [None]) >= 2 and len(methods) >= 2:
        paired = {"reference": ref, "by_method": _paired(rows, methods, ref, measures)}
    if policies is not None:
        extra["policies"] = list(policies)
        if len(methods) >= 2:
            extra["two_level"] = {"reference": ref, "by_method": _two_level(rows, methods, ref, policies, measures)}
    result = {
        "task": task_name,
        "methods": list(methods),
        "seeds": list(seeds),
        **extra,
        "header": dict(header or {}),
        "rewards": names,
        "tail": tail,
        "heldout_metrics": heldout,
        "target": {"key": target_key, "value": target, "window": target_window},
        "runs": rows,
        "missing": missing,
        "summary": summary,
        "paired": paired,
        "curves": curves,
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "comparison.json").write_text(json.dumps(result, indent=1) + "\n")
    write_report(out, result, runs, plots=plots)
    return result
