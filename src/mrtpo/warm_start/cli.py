"""``mrtpo sft``: a supervised warm start from the command line (:func:`mrtpo.warm_start.build_warm_start`)."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

from mrtpo.warm_start import (
    TASK_DEFAULTS,
    WarmStartError,
    WarmStartSettings,
    build_warm_start,
    load_warm_start,
)


def _parser():
    import argparse

    from mrtpo.cli_help import HelpFormatter

    p = argparse.ArgumentParser(
        prog="mrtpo sft",
        formatter_class=HelpFormatter,
        description="Supervised warm start (LoRA, TRL SFTTrainer) on a task's training pairs or your own JSONL "
        "file; saves a merged model folder that mrtpo train/eval load with --model. Unset options "
        "take the task's default warm start (toolcall: the one mrtpo train uses), else the plain defaults.",
        epilog='JSONL lines: {"messages": [..., {"role": "assistant", ...}]}, {"prompt": [messages], '
        '"completion": ...} or {"prompt": "<rendered>", "completion": "<answer>"}.',
    )
    p.add_argument("--task", help="take the task's own training pairs (toolcall); or give --data")
    p.add_argument("--data", help="JSONL file of your own pairs")
    plain = WarmStartSettings()

    def default(key: str) -> str:
        """The plain default of a setting and, where a task's warm start differs, that task's."""

        def show(v):
            return (" ".join(v) or "none") if isinstance(v, tuple) else v

        tasks = [
            f"; {t}: {show(getattr(w, key))}"
            for t, w in TASK_DEFAULTS.items()
            if getattr(w, key) != getattr(plain, key)
        ]
        return f"(default: {show(getattr(plain, key))}{''.join(tasks)})"

    p.add_argument("--model", default=None, help="base model (default: qwen2.5-coder-0.5b)")
    p.add_argument(
        "--output-dir",
        metavar="DIR",
        help="where to save the merged model (default: the warm start cache, where mrtpo train looks)",
    )
    p.add_argument("--steps", type=int, help=f"optimizer steps {default('steps')}")
    p.add_argument("--learning-rate", type=float, help=f"constant learning rate {default('learning_rate')}")
    p.add_argument("--batch-size", type=int, help=f"pairs per optimizer step {default('batch_size')}")
    p.add_argument("--lora-r", type=int, help=f"LoRA rank {default('lora_r')}")
    p.add_argument("--lora-alpha", type=float, help="LoRA scaling alpha (default: 2 x --lora-r)")
    p.add_argument("--max-length", type=int, help=f"longer pairs are left out {default('max_length')}")
    p.add_argument("--limit", type=int, default=None, help="use the first N pairs only (default: all)")
    p.add_argument("--seed", type=int, help=f"seed of the data order and the adapters {default('seed')}")
    p.add_argument(
        "--text-tags", nargs="*", metavar="TAG", help=f"strings taught as ordinary text tokens {default('text_tags')}"
    )
    return p


def main(argv: list[str] | None = None) -> int:
    from mrtpo.hub import prepare_hub

    prepare_hub()  # offline only where the user or the machine says so
    ns = _parser().parse_args(argv)
    from mrtpo.models import DEFAULT_MODEL, ModelLoadError

    model = ns.model or DEFAULT_MODEL
    try:
        if not ns.task and not ns.data:
            raise WarmStartError("give --task (its own training pairs) or --data <file.jsonl>")
        task = None
        if ns.task:
            from mrtpo.tasks import get_task

            try:
                task = get_task(ns.task)
            except (KeyError, ValueError) as exc:
                raise WarmStartError(str(exc)) from None
        base = TASK_DEFAULTS.get(ns.task, WarmStartSettings()) if ns.task and not ns.data else WarmStartSettings()
        given = {
            "steps": ns.steps,
            "learning_rate": ns.learning_rate,
            "batch_size": ns.batch_size,
            "lora_r": ns.lora_r,
            "max_length": ns.max_length,
            "seed": ns.seed,
            "limit": ns.limit,
            "text_tags": tuple(ns.text_tags) if ns.text_tags is not None else None,
            "data": str(Path(ns.data).resolve()) if ns.data else None,
        }
        if ns.lora_alpha is not None or ns.lora_r is not None:
            given["lora_alpha"] = ns.lora_alpha if ns.lora_alpha is not None else 2.0 * ns.lora_r
        settings = dataclasses.replace(base, **{k: v for k, v in given.items() if v is not None})
        if ns.output_dir:
            out = build_warm_start(model, settings, task, ns.output_dir)
        else:
            _, _, out = load_warm_start(model, settings, task)
    except (WarmStartError, ModelLoadError) as exc:
        print(f"mrtpo sft: {exc}", file=sys.stderr)
        return 2
    print(
        f"warm-started model: {out}\nuse it with: mrtpo train --model {out} warm_start=none   or   "
        f"mrtpo eval --model {out}"
    )
    return 0
