#!/usr/bin/env python
"""Sanity run of the instructions task: a policy answers IFEval prompts greedily, scored exactly
as IFEval defines it (prompt/instruction level, strict/loose).

    .venv/bin/python scripts/sanity_instructions.py                 # Qwen2.5-Coder-0.5B, 32 prompts
    .venv/bin/python scripts/sanity_instructions.py --n 8 --model smollm2-135m --max-new-tokens 64

Batched generation with left padding through the model's chat template; prints the scores and
writes them, the settings and every response to ``--out`` (JSON).
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
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def generate(model, tokenizer, prompts: list[str], batch_size: int, max_new_tokens: int) -> list[str]:
    """Greedy completions, ``batch_size`` prompts at a time, left-padded."""
    import torch

    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    outputs: list[str] = []
    for start in range(0, len(prompts), batch_size):
        batch = prompts[start : start + batch_size]
        enc = tokenizer(batch, return_tensors="pt", padding=True, add_special_tokens=False)
        with torch.no_grad():
            out = model.generate(
                **enc,
                do_sample=False,
                temperature=None,
                top_p=None,
                top_k=None,
                max_new_tokens=max_new_tokens,
                pad_token_id=tokenizer.pad_token_id,
            )
        new = out[:, enc["input_ids"].shape[1] :]
        outputs.extend(tokenizer.decode(row, skip_special_tokens=True) for row in new)
        print(f"[sanity] generated {len(outputs)}/{len(prompts)}", flush=True)
    return outputs


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="qwen2.5-coder-0.5b")
    ap.add_argument("--split", default="eval", choices=["eval", "eval_ifbench"])
    ap.add_argument("--n", type=int, default=32, help="the first N prompts of the split")
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--out", default="runs/sanity_instructions.json")
    args = ap.parse_args(argv)

    import torch

    from mrtpo.models import load_policy
    from mrtpo.tasks import get_task

    torch.manual_seed(0)
    task = get_task("instructions")
    examples = task.load(args.split, limit=args.n)
    t0 = time.time()
    model, tokenizer = load_policy(args.model)
    t_load = time.time() - t0
    prompts = [tokenizer.apply_chat_template(e.messages, tokenize=False, add_generation_prompt=True) for e in examples]
    t0 = time.time()
    outputs = generate(model, tokenizer, prompts, args.batch_size, args.max_new_tokens)
    t_gen = time.time() - t0
    result = task.evaluate(outputs, examples)
    n_tokens = [len(tokenizer(o, add_special_tokens=False)["input_ids"]) for o in outputs]
    summary = {
        k: result[k]
        for k in (
            "prompt_level_strict",
            "prompt_level_loose",
            "instruction_level_strict",
            "instruction_level_loose",
            "n_prompts",
            "n_instructions",
            "n_excluded_prompts",
        )
    }
    record = {
        "settings": {
            **vars(args),
            "decoding": "greedy",
            "padding_side": "left",
            "torch": torch.__version__,
        },
        "summary": summary,
        "seconds": {"load": round(t_load, 1), "generate": round(t_gen, 1)},
        "mean_completion_tokens": sum(n_tokens) / max(len(n_tokens), 1),
        "result": result,
        "responses": [
            {"id": e.id, "prompt": e.gold["prompt"], "response": o, "tokens": n}
            for e, o, n in zip(examples, outputs, n_tokens)
        ],
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=1, ensure_ascii=False), encoding="utf-8")
    print(
        json.dumps(
            {
                "summary": summary,
                "seconds": record["seconds"],
                "mean_completion_tokens": record["mean_completion_tokens"],
            },
            indent=1,
        )
    )
    print(f"[sanity] wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
