"""Sanity check of the toolcall task with a real model: greedy generation on a few eval items,
scored with BFCL's AST checker and the two rewards. A script, not a test (it takes minutes).

    .venv/bin/python scripts/sanity_toolcall.py                      # 32 items, Qwen2.5-Coder-0.5B
    .venv/bin/python scripts/sanity_toolcall.py --n 16 --out runs/x.json

The items are the first ``--n`` of the eval split, whose documented order interleaves the five
categories proportionally (32 items: 11 simple_python, 5 multiple, 5 parallel, 5 parallel_multiple,
6 irrelevance). Prints the BFCL accuracies, the format rate and mean rewards, and writes them with
every prompt id, output and verdict to ``--out`` as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="qwen2.5-coder-0.5b")
    parser.add_argument("--n", type=int, default=32)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=200)
    parser.add_argument("--out", default="runs/sanity_toolcall.json")
    args = parser.parse_args(argv)

    import torch

    from mrtpo.models import load_policy
    from mrtpo.tasks.toolcall import ToolCallTask, render_prompt

    task = ToolCallTask()
    examples = task.load("eval", limit=args.n)
    model, tok = load_policy(args.model)
    model.eval()
    tok.padding_side = "left"
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    stop_ids = {tok.eos_token_id}
    im_end = tok.convert_tokens_to_ids("<|im_end|>") if "<|im_end|>" in tok.get_vocab() else None
    if im_end is not None:
        stop_ids.add(im_end)
    stop_ids.discard(None)

    outputs: list[str] = []
    started = time.perf_counter()
    generated_tokens = 0
    for i in range(0, len(examples), args.batch_size):
        batch = examples[i : i + args.batch_size]
        prompts = [render_prompt(e, tok) for e in batch]
        enc = tok(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
        with torch.no_grad():
            out = model.generate(
                **enc,
                max_new_tokens=args.max_new_tokens,
                do_sample=False,
                eos_token_id=sorted(stop_ids),
                pad_token_id=tok.pad_token_id,
            )
        new = out[:, enc["input_ids"].shape[1] :]
        for row in new:
            ids = row.tolist()
            for j, t in enumerate(ids):
                if t in stop_ids:
                    ids = ids[:j]
                    break
            generated_tokens += len(ids)
            outputs.append(tok.decode(ids, skip_special_tokens=True))
        print(f"[sanity] {len(outputs)}/{len(examples)} generated ({time.perf_counter() - started:.0f} s)", flush=True)
    elapsed = time.perf_counter() - started

    result = task.evaluate(outputs, examples)
    fmt, corr = task.verifiers()
    rewards = [{"format": fmt(o, e), "correctness": corr(o, e)} for o, e in zip(outputs, examples)]
    summary = {
        "model": args.model,
        "n": len(examples),
        "max_new_tokens": args.max_new_tokens,
        "generation_seconds": round(elapsed, 1),
        "generated_tokens": generated_tokens,
        "accuracy": result["accuracy"],
        "accuracy_macro": result["accuracy_macro"],
        "format_rate": result["format_rate"],
        "per_category": {
            c: {k: s[k] for k in ("correct", "total", "accuracy", "format_rate")}
            for c, s in result["per_category"].items()
        },
        "mean_reward": {k: sum(r[k] for r in rewards) / len(rewards) for k in ("format", "correctness")},
    }
    print(json.dumps(summary, indent=2))
    for item, o in list(zip(result["items"], outputs))[:6]:
        print(f"--- {item['id']} valid={item['valid']} {item['error_type'] or ''}\n{o[:400]}")
    record = {**summary, "items": [{**item, "output": o, **r} for item, o, r in zip(result["items"], outputs, rewards)]}
    path = Path(args.out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=2, ensure_ascii=False), encoding="utf-8")
    print(f"[sanity] wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
