"""``mrtpo eval``: score a model or a training checkpoint on a task's held-out split.

    mrtpo eval --task sql --model qwen2.5-coder-0.5b --limit 32
    mrtpo eval --task toolcall --model runs/train/toolcall-mrtpo/checkpoint-40

Decoding is greedy (``do_sample=False``, one beam, no repetition penalty), so a run is
deterministic: the same model, data and settings give the same outputs. Prompts are rendered
exactly as in training (:func:`mrtpo.counterfactual.prompt_renderer`), tokenized, grouped into batches
of similar length, left-padded and generated until a stop token (eos, ``<|im_end|>``,
``<|endoftext|>``, the pad token) or ``max_new_tokens``; outputs come back in example order.
The task's own ``evaluate()`` scores them.

A run writes to ``--output-dir`` (alias ``--out``; default ``runs/eval/<task>-<split>-<model>-<time>``):

- ``results.json``: ``{"run": <metadata>, "metrics": <task.evaluate() dict>}``;
- ``results.md``: the headline metrics and each per-category / per-database table;
- ``outputs.jsonl``: one line per example (id, prompt, output, new_tokens, stopped).

The trainer and the benchmarks call :func:`evaluate_model` on a model already in memory.
Loading a model or checkpoint (:func:`load_model`, :func:`resolve_checkpoint`) lives in
:mod:`mrtpo.evaluate.load` and the result files (:func:`render_markdown`) in
:mod:`mrtpo.evaluate.results`; both are importable from here.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import re
import shlex
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mrtpo.cli_help import HelpFormatter
from mrtpo.evaluate.load import EvalUserError, load_model, resolve_checkpoint
from mrtpo.evaluate.results import render_markdown, write_results
from mrtpo.machine import machine_info
from mrtpo.task_base import implements
from mrtpo.tasks import TASK_NAMES

#: Default ``max_new_tokens`` per task (long enough for the task's answers: one or a few tool
#: calls, one SQL query, an IFEval response of a few paragraphs).
DEFAULT_MAX_NEW_TOKENS: dict[str, int] = {"toolcall": 256, "sql": 256, "instructions": 512}
FALLBACK_MAX_NEW_TOKENS = 256

STOP_TOKENS = ("<|im_end|>", "<|endoftext|>")

__all__ = [
    "DEFAULT_MAX_NEW_TOKENS",
    "EvalUserError",
    "Generation",
    "default_max_new_tokens",
    "evaluate_model",
    "generate",
    "load_model",
    "main",
    "render_markdown",
    "resolve_checkpoint",
    "stop_token_ids",
    "task_splits",
]


# --------------------------------------------------------------------------------------------
# Generation.
# --------------------------------------------------------------------------------------------
@dataclass
class Generation:
    """One example's output: ``token_ids`` are the generated ids up to and including the stop
    token (``new_tokens`` of them); ``output`` is their text without special tokens;
    ``stopped`` is False when ``max_new_tokens`` cut the output short."""

    id: str
    prompt: str
    output: str
    new_tokens: int
    stopped: bool
    token_ids: list[int]

    def record(self) -> dict[str, Any]:
        """The outputs.jsonl line (everything but the token ids)."""
        return {
            "id": self.id,
            "prompt": self.prompt,
            "output": self.output,
            "new_tokens": self.new_tokens,
            "stopped": self.stopped,
        }


def stop_token_ids(model: Any, tokenizer: Any) -> list[int]:
    """Token ids that end a completion: the tokenizer's eos and pad, the model's generation eos,
    and ``<|im_end|>`` / ``<|endoftext|>`` where the vocabulary has them."""
    ids: set[int] = set()
    for tid in (tokenizer.eos_token_id, tokenizer.pad_token_id):
        if tid is not None:
            ids.add(int(tid))
    gc = getattr(model, "generation_config", None)
    eos = getattr(gc, "eos_token_id", None)
    if eos is not None:
        ids.update(int(t) for t in ([eos] if isinstance(eos, int) else eos))
    vocab = tokenizer.get_vocab()
    ids.update(int(vocab[t]) for t in STOP_TOKENS if t in vocab)
    if not ids:
        raise ValueError("the tokenizer has no eos or pad token: generation would never stop early")
    return sorted(ids)


def fast_decoding(model: Any, config: Any):
    """``model.generate`` through :func:`mrtpo.fast_decode.fast_sampling` (the same greedy tokens in
    float32, bfloat16 rounding otherwise) where it supports the model and ``config`` and no module
    carries a forward hook (the decode step does not call the modules' forward); else as is."""
    import contextlib

    from mrtpo.fast_decode import fast_sampling, fast_sampling_supported

    hooked = any(m._forward_hooks or m._forward_pre_hooks for m in model.modules())
    return fast_sampling(model) if not hooked and fast_sampling_supported(model, config) else contextlib.nullcontext()


def _greedy_config(max_new_tokens: int, stop_ids: list[int], pad_id: int):
    """A GenerationConfig for plain greedy decoding; every value that changes greedy's choice is
    set explicitly, so nothing is inherited from the model's own generation_config."""
    from transformers import GenerationConfig

    return GenerationConfig(
        do_sample=False,
        num_beams=1,
        repetition_penalty=1.0,
        no_repeat_ngram_size=0,
        min_new_tokens=0,
        max_new_tokens=int(max_new_tokens),
        eos_token_id=list(stop_ids),
        pad_token_id=int(pad_id),
        use_cache=True,
    )


def generate(
    model: Any,
    tokenizer: Any,
    prompts: list[str],
    *,
    batch_size: int = 8,
    max_new_tokens: int = FALLBACK_MAX_NEW_TOKENS,
    ids: list[str] | None = None,
    progress: bool = True,
    desc: str = "eval",
) -> list[Generation]:
    """Greedy completions of ``prompts`` (already chat-templated strings), in input order.

    Prompts are tokenized without extra special tokens, sorted by length (longest first, so an
    out-of-memory shows in the first batch), left-padded into batches of ``batch_size`` and
    generated with :func:`_greedy_config`. The tokenizer's padding side is not touched.
    """
    import torch
    from tqdm import tqdm

    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    ids = [str(i) for i in range(len(prompts))] if ids is None else list(ids)
    if len(ids) != len(prompts):
        raise ValueError(f"got {len(ids)} ids for {len(prompts)} prompts")
    stops = stop_token_ids(model, tokenizer)
    stop_set = set(stops)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    config = _greedy_config(max_new_tokens, stops, pad_id)
    encoded = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts]
    order = sorted(range(len(prompts)), key=lambda i: (-len(encoded[i]), i))
    results: list[Generation | None] = [None] * len(prompts)
    device = getattr(model, "device", torch.device("cpu"))
    was_training = bool(getattr(model, "training", False))
    model.eval()
    bar = tqdm(total=len(prompts), desc=desc, unit="ex", file=sys.stderr, disable=not progress)
    produced, t0 = 0, time.perf_counter()
    try:
        for start in range(0, len(order), batch_size):
            rows = order[start : start + batch_size]
            width = max(len(encoded[i]) for i in rows)
            input_ids = torch.full((len(rows), width), int(pad_id), dtype=torch.long)
            attention = torch.zeros((len(rows), width), dtype=torch.long)
            for r, i in enumerate(rows):
                n = len(encoded[i])
                if n:
                    input_ids[r, width - n :] = torch.tensor(encoded[i], dtype=torch.long)
                    attention[r, width - n :] = 1
            with torch.no_grad(), fast_decoding(model, config):  # mrtpo's decode step where it reproduces greedy
                out = model.generate(
                    input_ids=input_ids.to(device),
                    attention_mask=attention.to(device),
                    generation_config=config,
                )
            for r, i in enumerate(rows):
                new = out[r, width:].tolist()
                cut = next((k for k, t in enumerate(new) if t in stop_set), None)
                kept = new if cut is None else new[: cut + 1]
                text = tokenizer.decode(kept, skip_special_tokens=True)
                results[i] = Generation(ids[i], prompts[i], text, len(kept), cut is not None, kept)
                produced += len(kept)
            bar.update(len(rows))
            bar.set_postfix_str(f"{produced / max(time.perf_counter() - t0, 1e-9):.1f} tok/s")
    finally:
        bar.close()
        if was_training:
            model.train()
    return [g for g in results if g is not None]


def default_max_new_tokens(task: Any) -> int:
    """The task's own ``max_new_tokens`` if it declares one, else this module's default for its name."""
    return getattr(task, "max_new_tokens", None) or DEFAULT_MAX_NEW_TOKENS.get(
        getattr(task, "name", ""), FALLBACK_MAX_NEW_TOKENS
    )


def _evaluate_timed(model, tokenizer, task, examples, batch_size, max_new_tokens, progress):
    """:func:`evaluate_model` plus the seconds spent generating and scoring."""
    from mrtpo.counterfactual import prompt_renderer

    if max_new_tokens is None:
        max_new_tokens = default_max_new_tokens(task)
    render = prompt_renderer(task, tokenizer)
    prompts = [render(ex) for ex in examples]
    t0 = time.perf_counter()
    gens = generate(
        model,
        tokenizer,
        prompts,
        batch_size=batch_size,
        max_new_tokens=max_new_tokens,
        ids=[ex.id for ex in examples],
        progress=progress,
        desc=f"eval {getattr(task, 'name', '')}".strip(),
    )
    t1 = time.perf_counter()
    import inspect

    ids = (
        {"completion_ids": [g.token_ids for g in gens]}
        if "completion_ids" in inspect.signature(task.evaluate).parameters
        else {}
    )  # a task file's rewards get the token ids, as in training
    metrics = task.evaluate([g.output for g in gens], examples, **ids)
    return metrics, gens, t1 - t0, time.perf_counter() - t1


def evaluate_model(
    model: Any,
    tokenizer: Any,
    task: Any,
    examples: list[Any],
    batch_size: int = 8,
    max_new_tokens: int | None = None,
    progress: bool = True,
) -> tuple[dict[str, Any], list[Generation]]:
    """Score an in-memory ``model`` on ``examples`` of ``task``; nothing is reloaded.

    Returns ``(metrics, generations)``: ``metrics`` is exactly ``task.evaluate(outputs,
    examples)``; ``generations[i]`` (a :class:`Generation`: id, prompt, output, new_tokens,
    stopped) belongs to ``examples[i]``. ``max_new_tokens=None`` uses the task's default
    (:data:`DEFAULT_MAX_NEW_TOKENS`). The model is put in eval mode for the call and back in
    train mode afterwards if it was training.

        metrics, gens = evaluate_model(model, tokenizer, task, task.load("eval", 32))
    """
    metrics, gens, _, _ = _evaluate_timed(model, tokenizer, task, examples, batch_size, max_new_tokens, progress)
    return metrics, gens


# --------------------------------------------------------------------------------------------
# Tasks and splits.
# --------------------------------------------------------------------------------------------
def task_splits(task: Any) -> list[str] | None:
    """The split names a task declares (``task.splits`` or its module's ``SPLITS``), or None."""
    found = getattr(task, "splits", None)
    if found is None:
        module = sys.modules.get(type(task).__module__)
        found = getattr(module, "SPLITS", None)
    if found is None:
        return None
    return list(found.keys() if isinstance(found, dict) else found)


def _get_task(name: str):
    from mrtpo.tasks import get_task

    try:
        return get_task(name)
    except KeyError as err:
        raise EvalUserError(f"{err.args[0]}. Pass one of them with --task.") from None


def _load_examples(task: Any, name: str, split: str, limit: int | None):
    splits = task_splits(task)
    if splits is not None and split not in splits:
        raise EvalUserError(
            f"task {name!r} has no split {split!r}; its splits are {', '.join(splits)} "
            f"(held-out: {', '.join(s for s in splits if s != 'train')}). Pass one with --split."
        )
    try:
        return task.load(split, limit)
    except ValueError as err:
        if "split" in str(err):
            raise EvalUserError(f"task {name!r}: {err}. Pass a valid --split.") from None
        raise
    except RuntimeError as err:  # missing benchmark data (e.g. SpiderDataError): a setup problem
        if type(err).__name__.endswith("DataError"):
            raise EvalUserError(f"task {name!r} cannot load its data: {err}") from None
        raise


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text.strip("/")).strip("_")[-60:] or "model"


# --------------------------------------------------------------------------------------------
# Command line.
# --------------------------------------------------------------------------------------------
def _split_help() -> str:
    parts = []
    for name in TASK_NAMES:
        try:
            splits = task_splits(_get_task(name))
        except Exception:  # noqa: BLE001 - a task whose assets are missing still gets a usable --help
            splits = None
        parts.append(f"{name}: {', '.join(splits) if splits else '?'}")
    return "; ".join(parts)


def _parser() -> argparse.ArgumentParser:
    defaults = ", ".join(f"{k} {v}" for k, v in DEFAULT_MAX_NEW_TOKENS.items())
    p = argparse.ArgumentParser(
        prog="mrtpo eval",
        description="Score a model or checkpoint on a task's held-out split (greedy decoding, "
        "deterministic). Writes results.json, results.md and outputs.jsonl.",
        formatter_class=HelpFormatter,
    )
    p.add_argument(
        "--task",
        required=True,
        help=f"one of {', '.join(TASK_NAMES)}, a task a plugin registers (MRTPO_PLUGINS), or a task file: "
        "path/to/task.yaml (or a training config with a task: block), scored by the mean of each of "
        "its rewards and their weighted sum, reward_total",
    )
    p.add_argument(
        "--model",
        default="qwen2.5-coder-0.5b",
        help="preset name, .gguf file, folder saved with save_pretrained, training checkpoint "
        "(checkpoint-N, or its parent: the highest N is used), PEFT adapter folder, or hub id",
    )
    p.add_argument(
        "--base-model",
        default=None,
        help="base model of a PEFT adapter (default: the one its adapter_config.json names)",
    )
    p.add_argument("--split", default="eval", help=f"split to score. Splits: {_split_help()}")
    p.add_argument("--limit", type=int, default=None, help="score only the first N examples of the split")
    p.add_argument("--batch-size", type=int, default=8, help="prompts per generate call")
    p.add_argument("--max-new-tokens", type=int, default=None, help=f"generation cap (default: per task, {defaults})")
    p.add_argument("--dtype", choices=("bfloat16", "float32", "float16"), default="bfloat16", help="model dtype")
    p.add_argument("--device", default="auto", help="cpu, cuda, cuda:N or auto (cuda when available)")
    p.add_argument(
        "--output-dir",
        "--out",
        dest="out",
        metavar="DIR",
        help="output folder (default: runs/eval/<task>-<split>-<model>-<time>)",
    )
    p.add_argument("--seed", type=int, default=0, help="torch seed (greedy decoding does not use it; recorded)")
    p.add_argument("--hub", action="store_true", help="allow the model hub (without it: HF_HUB_OFFLINE=1)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    return p


def _run(args: argparse.Namespace, argv: list[str]) -> int:
    if args.limit is not None and args.limit < 1:
        raise EvalUserError(f"--limit must be >= 1, got {args.limit}")
    if args.batch_size < 1:
        raise EvalUserError(f"--batch-size must be >= 1, got {args.batch_size}")
    if args.max_new_tokens is not None and args.max_new_tokens < 1:
        raise EvalUserError(f"--max-new-tokens must be >= 1, got {args.max_new_tokens}")
    started = time.perf_counter()
    date = _dt.datetime.now(_dt.UTC).astimezone().isoformat(timespec="seconds")
    task = _get_task(args.task)
    examples = _load_examples(task, args.task, args.split, args.limit)
    if not examples:
        raise EvalUserError(f"split {args.split!r} of task {args.task!r} has no examples")
    max_new = args.max_new_tokens or default_max_new_tokens(task)

    import torch

    torch.manual_seed(args.seed)
    if args.model == "gym" and implements(task, "policy"):  # a gym task's warm-started tiny policy
        model, tokenizer = task.policy()
        model_info = {"spec": "gym", "kind": "gym warm start", "dtype": "float32"}
    else:
        model, tokenizer, model_info = load_model(args.model, args.dtype, args.device, args.base_model)
    loaded = time.perf_counter()
    metrics, gens, gen_s, score_s = _evaluate_timed(
        model, tokenizer, task, examples, args.batch_size, max_new, not args.quiet
    )
    finished = time.perf_counter()
    new_tokens = sum(g.new_tokens for g in gens)
    run = {
        "task": args.task,
        "split": args.split,
        "limit": args.limit,
        "n_examples": len(examples),
        "model": model_info,
        "generation": {
            "decoding": "greedy",
            "batch_size": args.batch_size,
            "max_new_tokens": max_new,
            "new_tokens": new_tokens,
            "truncated": sum(not g.stopped for g in gens),
            "seconds": round(gen_s, 3),
            "tokens_per_s": new_tokens / max(gen_s, 1e-9),  # real tokens (to each stop) / wall s
            "stop_token_ids": stop_token_ids(model, tokenizer),
        },
        "seed": args.seed,
        "date": date,
        "machine": machine_info(),
        "load_s": round(loaded - started, 3),
        "scoring_s": round(score_s, 3),
        "elapsed_s": round(finished - started, 3),
        "command": shlex.join(["mrtpo", "eval", *argv]),
    }
    out = (
        Path(args.out)
        if args.out
        else Path("runs")
        / "eval"
        / (
            f"{args.task}-{args.split}-{_slug(Path(args.model).name or args.model)}-"
            f"{_dt.datetime.now().strftime('%Y%m%d-%H%M%S')}"
        )
    )
    write_results(out, metrics, run, gens)
    headline = {k: v for k, v in metrics.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    print(json.dumps(headline, indent=2))
    print(
        f"wrote {out}/results.json, results.md, outputs.jsonl ({run['elapsed_s']:.1f} s, "
        f"{run['generation']['tokens_per_s']:.1f} tok/s)",
        file=sys.stderr,
    )
    return 0


def main(argv: list[str]) -> int:
    """Entry point of ``mrtpo eval``; returns the exit code (2 for a user error)."""
    argv = list(argv)
    # Before anything imports huggingface_hub (building the parser imports the tasks).
    from mrtpo.hub import go_offline, prepare_hub

    if "--hub" not in argv:
        go_offline("mrtpo eval sets HF_HUB_OFFLINE=1 unless given --hub", lift="pass --hub to use the hub")
    else:
        prepare_hub()  # a user's HF_HUB_OFFLINE, else the quick check
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    args = _parser().parse_args(argv)  # argparse exits with 2 on bad options
    try:
        return _run(args, argv)
    except EvalUserError as err:
        print(f"mrtpo eval: error: {err}", file=sys.stderr)
        return 2
