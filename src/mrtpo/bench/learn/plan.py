"""Planning a learning benchmark: presets, one config per (method, policy, seed) from one base, and
which runs are finished, partial or still to do.

Every run gets the *same* settings: the preset, then each ``--config``, then the flags and
``key=value`` overrides; only ``method`` differs between methods, only ``seed`` between seed
indices and, with ``--policies`` on a gym task, only ``task_args.policy.seed`` (the warm-started
policy) between policies (:func:`plan_configs` checks it). A run is keyed ``(method, policy,
seed)``; ``policy`` is None without ``--policies`` (the task's default policy, today's folders).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

#: The methods compared when ``--methods`` is not given (any registered method may be named).
DEFAULT_METHODS = ("grpo", "gdpo", "mrtpo", "contrast", "entropy")
DEFAULT_SEEDS = (0, 1, 2)
CONFIGS_DIR = Path(__file__).resolve().parents[4] / "configs"
FINISHED = "finished.json"

#: Keys the benchmark sets per run; a config or override may not set them.
CONTROLLED_KEYS = ("method", "seed", "output_dir", "task")
#: Keys that may differ between the runs of one benchmark (everything else must be identical).
PER_RUN_KEYS = ("method", "seed", "output_dir")
#: Settings only a method that replays reads (the weight shape, the relevance): a finished run of a
#: method with ``needs="none"`` (gdpo, grpo) stays valid when they change, e.g. with the default shape.
REPLAY_ONLY_KEYS = (
    "lam",
    "reward_lam",
    "w_max",
    "relevance",
    "relevance_chunk_size",
    "relevance_top_k",
    "privileged_header",
    "replay_micro_batch",
    "replay_groups_per_pass",
    "weighting",
    "rank_power",
    "weight_mean",
)
#: Evaluation settings a finished run must share with the current invocation to be kept.
EVAL_KEYS = ("eval_every", "eval_size", "eval_batch_size", "eval_max_new_tokens")
#: Keys of a preset's ``bench:`` section.
BENCH_KEYS = (
    "eval_every",
    "eval_size",
    "eval_batch_size",
    "eval_max_new_tokens",
    "target_reward",
    "target_key",
    "target_window",
    "tail",
)

__all__ = [
    "BENCH_KEYS",
    "CONFIGS_DIR",
    "DEFAULT_SEEDS",
    "EVAL_KEYS",
    "FINISHED",
    "DEFAULT_METHODS",
    "BenchError",
    "plan_configs",
    "read_preset",
    "resolve_preset",
    "run_dir",
    "run_label",
    "start_eval_file",
    "run_status",
    "settings_diff",
    "stable_settings",
]


class BenchError(ValueError):
    """A mistake in the benchmark's inputs; the message says what to change."""


def resolve_preset(preset: str) -> Path:
    """A preset name (``configs/bench-learn-<name>.yaml``) or a YAML file path -> the file."""
    path = Path(preset)
    if path.suffix in (".yaml", ".yml") or path.is_file():
        if not path.is_file():
            raise BenchError(f"preset file {path} does not exist")
        return path
    named = CONFIGS_DIR / f"bench-learn-{preset}.yaml"
    if not named.is_file():
        known = sorted(p.stem.removeprefix("bench-learn-") for p in CONFIGS_DIR.glob("bench-learn-*.yaml"))
        raise BenchError(f"unknown preset {preset!r}: there is no {named}. Use {', '.join(known)} or a YAML file path.")
    return named


def read_preset(path: str | os.PathLike, task: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(training settings, bench settings)`` of a preset file for ``task``.

    A preset is a ``mrtpo train`` config plus two reserved sections: ``per_task: {<task>: {...}}``
    (training settings merged over the common ones for that task) and ``bench: {...}``
    (:data:`BENCH_KEYS`; a mapping value such as ``target_reward: {sql: 2.5}`` is per task).
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
    unknown = sorted(set(bench) - set(BENCH_KEYS))
    if unknown:
        raise BenchError(f"preset {path}: unknown bench key(s) {', '.join(unknown)}; valid: {', '.join(BENCH_KEYS)}")
    train = dict(data)
    train.update(per_task.get(task) or {})
    bench = {k: (v.get(task) if isinstance(v, dict) else v) for k, v in bench.items()}
    return train, bench


def run_label(seed: int, policy: int | None = None) -> str:
    """``seed<S>``, or ``policy<P>-seed<S>`` for a run on warm-started policy ``P``."""
    return f"seed{seed}" if policy is None else f"policy{policy}-seed{seed}"


def run_dir(out: Path, method: str, seed: int, policy: int | None = None) -> Path:
    """The folder of one run: ``<out>/<method>-seed<S>`` (``<method>-policy<P>-seed<S>`` with a policy)."""
    return Path(out) / f"{method}-{run_label(seed, policy)}"


def start_eval_file(policy: int | None = None) -> str:
    """The shared step-0 evaluation's file name: one per starting policy (runs on another policy
    start elsewhere, so they cannot share it)."""
    return "start_eval.json" if policy is None else f"start_eval-policy{policy}.json"


def _without_policy_seed(settings: Mapping[str, Any]) -> dict[str, Any]:
    """``settings`` without ``task_args.policy.seed``: the one key runs on different policies may differ in."""
    task_args = dict(settings.get("task_args") or {})
    policy = {k: v for k, v in (task_args.pop("policy", None) or {}).items() if k != "seed"}
    return {**settings, "task_args": {**task_args, **({"policy": policy} if policy else {})}}


def _policy_task_args(task: str, task_args: Mapping[str, Any], policy: int) -> dict[str, Any]:
    """``task_args`` with ``policy.seed = policy`` merged in (its other keys kept); refuses a task
    without a warm-started policy and a policy seed already set by hand."""
    from mrtpo.task_base import implements
    from mrtpo.tasks import get_task

    if not implements(get_task(task), "policy"):
        raise BenchError(
            f"--policies picks the gym's warm-started policy (task_args.policy.seed); task {task!r} "
            "has none: use a gym-* task"
        )
    given = dict(task_args.get("policy") or {})
    if "seed" in given:
        raise BenchError("task_args sets policy.seed, which --policies sets per run; remove it")
    return {**task_args, "policy": {**given, "seed": policy}}


def stable_settings(config) -> dict[str, Any]:
    """The run's flat settings as JSON values, without the keys that differ per run."""
    flat = {k: v for k, v in config.to_flat().items() if k not in PER_RUN_KEYS}
    return json.loads(json.dumps(flat, default=str))


def settings_diff(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[str]:
    """Keys both mappings have with different values (a key only one side has, e.g. a setting added
    to the trainer after a run finished, is not a difference: it kept its default)."""
    return [f"{k}: {a[k]!r} vs {b[k]!r}" for k in sorted(set(a) & set(b)) if a[k] != b[k]]


def method_variants(entries: Sequence[str]) -> tuple[list[str], dict[str, str]]:
    """``(labels, {label: method})`` from ``--methods`` entries: ``mrtpo`` or ``LABEL=METHOD``, a variant
    trained as ``METHOD`` under its own name (its folder, table rows and ``--method-setting`` key)."""
    labels, bases = [], {}
    for entry in entries:
        label, sep, base = (part.strip() for part in entry.partition("="))
        if sep:
            if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", label) or not base:
                raise BenchError(
                    f"a variant is LABEL=METHOD with a LABEL of letters, digits, '-', '_' or '.', got {entry!r}"
                )
            bases[label] = base
        if label in labels:
            raise BenchError(f"method {label!r} is listed twice in --methods")
        labels.append(label)
    return labels, bases


def plan_configs(
    task: str,
    methods: Sequence[str],
    seeds: Sequence[int],
    preset_train: dict[str, Any],
    preset_source: str,
    configs: Sequence[str],
    overrides: dict[str, Any],
    out: Path,
    method_settings: Mapping[str, dict[str, Any]] | None = None,
    policies: Sequence[int] | None = None,
    bases: Mapping[str, str] | None = None,
):
    """``{(method, policy, seed): RunConfig}``, built from one base; checks that only method, seed,
    folder and the policy seed differ.

    ``method_settings`` (``{method: {key: value}}``) gives one method its own value of a setting, e.g.
    its best learning rate from a sweep; those keys may then differ between methods, nothing else.
    ``policies`` (gym tasks only): warm-start seeds, each merged into the runs' ``task_args`` as
    ``policy.seed``; None plans every run on the task's default policy (key ``policy`` None).
    ``bases`` (``{label: method}``, :func:`method_variants`): labels trained as another method.
    """
    bases = dict(bases or {})
    method_settings = dict(method_settings or {})
    unknown = sorted(set(method_settings) - set(methods))
    if unknown:
        raise BenchError(
            f"settings given for method(s) {', '.join(unknown)} that are not benchmarked ({', '.join(methods)})"
        )
    varying = {key for settings in method_settings.values() for key in settings}
    from mrtpo.config import ConfigError, load_config

    for key in CONTROLLED_KEYS:
        if key in overrides or key in varying:
            raise BenchError(
                f"{key} is set by the benchmark (use --task/--methods/--seeds/--output-dir), not as {key}=..."
            )
    for path in configs:
        if not Path(path).is_file():
            raise BenchError(f"config file {path} does not exist")
        given = yaml.safe_load(Path(path).read_text()) or {}
        bad = [k for k in CONTROLLED_KEYS if k in given]
        if bad:
            raise BenchError(
                f"config {path} sets {', '.join(bad)}, which the benchmark controls per run; remove it "
                "(use --task/--methods/--seeds/--output-dir)"
            )
    if policies is not None and "task_args" in varying:
        raise BenchError("--method-setting may not set task_args with --policies (the policy is set per run)")
    base = {**preset_train, "task": task}
    plans = {}

    def load(per_run):
        try:
            return load_config(list(configs), per_run, base=base, base_source=preset_source)
        except ConfigError as exc:
            raise BenchError(str(exc)) from None

    task_args = None
    if policies is not None:  # the resolved task_args (preset, configs, overrides), then each policy's seed
        task_args = load(
            {**overrides, "method": bases.get(methods[0], methods[0]), "seed": seeds[0], "output_dir": str(out)}
        ).run.task_args
    for policy in [None] if policies is None else policies:
        extra = {} if policy is None else {"task_args": _policy_task_args(task, task_args, policy)}
        for seed in seeds:
            for method in methods:
                plans[(method, policy, seed)] = load(
                    {
                        **overrides,
                        **method_settings.get(method, {}),
                        **extra,
                        "method": bases.get(method, method),
                        "seed": seed,
                        "output_dir": str(run_dir(out, method, seed, policy)),
                    }
                )
    first = None
    for key, config in plans.items():
        settings = {k: v for k, v in _without_policy_seed(stable_settings(config)).items() if k not in varying}
        if first is None:
            first = (key, settings)
        elif settings != first[1]:  # pragma: no cover  (load_config is deterministic; a guard)
            raise BenchError(
                f"runs {first[0]} and {key} would differ in more than method/seed/policy: "
                f"{settings_diff(first[1], settings)}"
            )
    return plans


def run_status(plans: Mapping[tuple[str, int], Any], out: Path, eval_settings: Mapping[str, Any]) -> dict:
    """``{(method, policy, seed): "finished" | "partial" | "to do"}``.

    A finished run (its folder has :data:`FINISHED`) must have used the settings planned now and
    the same evaluation settings (the :data:`REPLAY_ONLY_KEYS` only where its method replays);
    otherwise :class:`BenchError` names the differing keys.
    """
    from mrtpo.credit import get_method

    status = {}
    for (method, policy, seed), config in plans.items():
        done = run_dir(out, method, seed, policy) / FINISHED
        if done.is_file():
            saved = json.loads(done.read_text())
            planned = stable_settings(config)
            if get_method(config.to_flat()["method"]).needs == "none":
                planned = {k: v for k, v in planned.items() if k not in REPLAY_ONLY_KEYS}
            differs = settings_diff(saved.get("settings", {}), planned)
            differs += settings_diff(saved.get("eval", {}), {k: eval_settings[k] for k in EVAL_KEYS})
            if differs:
                raise BenchError(
                    f"{done.parent} finished with other settings ({'; '.join(differs[:6])}). "
                    "Use another --output-dir, or delete that run folder to redo it."
                )
            status[(method, policy, seed)] = "finished"
        else:
            status[(method, policy, seed)] = "partial" if done.parent.exists() else "to do"
    return status
