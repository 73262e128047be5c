"""``mrtpo bench learn``: credit methods trained side by side on one task, several seeds each.

    mrtpo bench learn --task sql                                   # CPU preset, 5 methods x 3 seeds
    mrtpo bench learn --task sql --methods gdpo,mrtpo --seeds 0,1 --max-steps 4 --eval-size 8
    mrtpo bench learn --task toolcall --preset gpu --output-dir runs/bench/learn-toolcall-gpu
    mrtpo bench learn --task sql --compare-only                    # rebuild the comparison only
    mrtpo bench learn --task gym-call --preset gym --policies 0,1,2 --seeds 0,1,2,3,4   # policies x seeds

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
run evaluates step 0 itself; the tests check both give the same outputs). The benchmark folder
(``--output-dir``, default ``runs/bench/learn-<task>``) holds::

    bench.json                 what was asked: task, methods, seeds, layers, command, machine
    <method>-seed<s>/          one run: config.yaml, metrics.jsonl, credit_samples.jsonl, eval.jsonl,
                               eval_outputs.jsonl, prompts.jsonl, report.*, finished.json
                               (``<method>-policy<p>-seed<s>/`` with ``--policies``: gym tasks, each
                               run on warm-started policy p, paired by (policy, seed), the effect's
                               interval over both levels)
    comparison.json / .md      the table: per reward, total and completion length (mean over the
                               last steps of each run, mean +- std over seeds), held-out metric at
                               the start and the end, steps to reach the target reward, 95% CIs
                               of the means, each method paired against gdpo seed by seed (t-test
                               and sign-flip p-values), completions shared with the first method,
                               wall times
    rewards.png                one panel per reward and the total: mean over seeds per method, band =
                               range over seeds (min-max), thin lines = single seeds
    length.png, heldout.png    completion length and the held-out metrics vs step, same style

Resumable at the run level: a run whose folder has ``finished.json`` is skipped (if its settings
equal the current ones; otherwise the command stops and names the differing keys), an unfinished
one is started again from scratch. The comparison is rewritten after every run, from the
finished runs only. The benchmark runs in one process (no ``torchrun``/``accelerate launch``).

The package, one job per module: :mod:`.stats` (steps to target, curves over seeds, 95% CIs,
paired tests), :mod:`.plan` (presets, one config per run, run status), :mod:`.run` (one run with
held-out evaluation), :mod:`.compare` (the comparison of finished runs), :mod:`.report` (its
figures and Markdown) and :mod:`.cli` (the command).

Presets: ``--preset cpu`` (configs/bench-learn-cpu.yaml: qwen2.5-coder-0.5b, LoRA r=16 on bf16
weights, 2 prompts x 4 completions of <= 64 tokens per step, 8 steps, held-out eval on 8 items
every 4 steps); its timings on a 2-core CPU are in docs/benchmarks.md (the presets table).
``--preset gpu`` (configs/bench-learn-gpu.yaml: full fine-tuning, bf16 mixed precision, 4 prompts x
8 completions of <= 256 tokens, 200 steps, eval on 128 items every 25 steps) is sized for one GPU
of 24 GB or more; it has not been timed here.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

from mrtpo.bench.learn.cli import main  # noqa: E402
from mrtpo.bench.learn.compare import HELDOUT_METRICS, build_comparison, heldout_metrics, load_runs  # noqa: E402
from mrtpo.bench.learn.plan import (  # noqa: E402
    CONFIGS_DIR,
    DEFAULT_METHODS,
    BenchError,
    plan_configs,
    read_preset,
    run_status,
)
from mrtpo.bench.learn.run import EvalCallback, completion_digests, run_one  # noqa: E402
from mrtpo.bench.learn.stats import (  # noqa: E402
    aggregate_curves,
    describe,
    paired_comparison,
    shared_samples,
    sign_flip_p_value,
    steps_to_target,
    summarise_steps_to_target,
    two_level_interval,
    value_at_seconds,
)

__all__ = [
    "CONFIGS_DIR",
    "HELDOUT_METRICS",
    "DEFAULT_METHODS",
    "BenchError",
    "EvalCallback",
    "aggregate_curves",
    "build_comparison",
    "completion_digests",
    "describe",
    "heldout_metrics",
    "load_runs",
    "main",
    "paired_comparison",
    "plan_configs",
    "read_preset",
    "run_one",
    "run_status",
    "shared_samples",
    "sign_flip_p_value",
    "steps_to_target",
    "summarise_steps_to_target",
    "two_level_interval",
    "value_at_seconds",
]
