#!/usr/bin/env python
"""Sanity run of the SQL task: greedy Qwen2.5-Coder-0.5B on the first N eval questions.

Loads the policy with ``mrtpo.models.load_policy``, generates greedily in batches with left
padding, scores the completions with the task's own ``evaluate`` and the three verifiers, then
prints a summary and writes everything (prompts' ids, completions, per-question scores) to JSON.

    .venv/bin/python scripts/sanity_sql.py --n 32 --out runs/sanity_sql.json
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
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="qwen2.5-coder-0.5b")
    ap.add_argument("--split", default="eval")
    ap.add_argument("--n", type=int, default=32, help="first N questions of the split")
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=200)
    ap.add_argument("--sample-rows", type=int, default=3)
    ap.add_argument("--data-dir", default=None)
    ap.add_argument("--out", default="runs/sanity_sql.json")
    args = ap.parse_args(argv)

    import torch

    from mrtpo.models import load_policy
    from mrtpo.tasks import get_task

    task = get_task("sql", data_dir=args.data_dir, sample_rows=args.sample_rows)
    examples = task.load(args.split, limit=args.n)
    t0 = time.time()
    model, tok = load_policy(args.model)
    print(f"[sanity_sql] loaded {args.model} in {time.time() - t0:.1f}s; {len(examples)} {args.split} questions")
    tok.padding_side = "left"
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token

    prompts = [tok.apply_chat_template(ex.messages, add_generation_prompt=True, tokenize=False) for ex in examples]
    # The evidence contract (SPEC §1): in_prompt texts occur exactly once in the templated prompt.
    verifiers = task.verifiers()
    for ex, p in zip(examples, prompts):
        for v in verifiers:
            ev = v.evidence(ex)
            if ev is not None and ev.placement == "in_prompt" and p.count(ev.text) != 1:
                raise SystemExit(f"evidence of {v.name} occurs {p.count(ev.text)} times in the prompt of {ex.id}")

    outputs: list[str] = []
    t_gen = time.time()
    new_tokens = 0
    for i in range(0, len(prompts), args.batch_size):
        batch = prompts[i : i + args.batch_size]
        enc = tok(batch, return_tensors="pt", padding=True, add_special_tokens=False)
        with torch.no_grad():
            gen = model.generate(
                **enc,
                max_new_tokens=args.max_new_tokens,
                do_sample=False,
                pad_token_id=tok.pad_token_id,
            )
        new = gen[:, enc["input_ids"].shape[1] :]
        new_tokens += int((new != tok.pad_token_id).sum())
        outputs += tok.batch_decode(new, skip_special_tokens=True)
        print(
            f"[sanity_sql] batch {i // args.batch_size + 1}: {len(outputs)}/{len(prompts)} done, "
            f"{time.time() - t_gen:.0f}s"
        )
    gen_s = time.time() - t_gen

    report = task.evaluate(outputs, examples)
    rewards = {v.name: [v(o, ex) for o, ex in zip(outputs, examples)] for v in verifiers}
    for row, out in zip(report["examples"], outputs):
        row["completion"] = out
    summary = {
        "model": args.model,
        "split": args.split,
        "n": len(examples),
        "max_new_tokens": args.max_new_tokens,
        "sample_rows": args.sample_rows,
        "generation_s": round(gen_s, 1),
        "new_tokens": new_tokens,
        "execution_accuracy": report["execution_accuracy"],
        "executable_rate": report["executable_rate"],
        "format_rate": report["format_rate"],
        "mean_rewards": {k: sum(x or 0.0 for x in v) / len(v) for k, v in rewards.items()},
        "per_db": report["per_db"],
        "errors": report["errors"],
    }
    print(json.dumps(summary, indent=2))
    out_path = Path(args.out)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps({"summary": summary, "report": report}, indent=2), encoding="utf-8")
    print(f"[sanity_sql] wrote {out_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
