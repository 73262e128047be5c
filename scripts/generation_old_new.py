#!/usr/bin/env python
"""Generation alone, old path against new, alternately in one process, in wall and CPU time.

    OMP_NUM_THREADS=1 PYTHONPATH=src python scripts/generation_old_new.py qwen2.5-coder-0.5b --rounds 2
    OMP_NUM_THREADS=1 PYTHONPATH=src python scripts/generation_old_new.py smollm2-135m --rounds 1 --profile

The model is the one the trainer builds for ``bench step --task instructions --preset cpu`` at
2 prompts x 8 completions x <= 64 tokens (LoRA, the CPU's dtype); the prompts are the training set's
first two. Old: ``generate`` with each distinct prompt prefilled once (``fast_generation=false``);
new: :func:`mrtpo.fast_decode.sample`. The floor is ``bench step``'s: the forward FLOPs of the
distinct prompt tokens and every sampled token at the float32 matmul rate per CPU second.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import torch
from transformers import GenerationConfig

from mrtpo.bench.step import _config, flops_per_token, matmul_gflops
from mrtpo.fast_decode import sample
from mrtpo.model_calls import underlying_model
from mrtpo.shared_prompt import generate_with_shared_prefill
from mrtpo.train import build_trainer


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model", nargs="?", default="smollm2-135m")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--profile", action="store_true", help="then torch.profiler over one call of the new path")
    args = p.parse_args()
    torch.set_num_threads(1)
    settings = SimpleNamespace(
        preset="cpu",
        task="instructions",
        seed=0,
        overrides=[
            f"model={args.model}",
            "num_generations=8",
            "per_device_train_batch_size=16",
            "max_completion_length=64",
        ],
    )
    trainer = build_trainer(_config(settings, "gdpo", Path(tempfile.mkdtemp()), 1))
    model = trainer.accelerator.unwrap_model(trainer.model).eval()
    tok = trainer.processing_class
    texts = [
        tok.apply_chat_template(trainer.train_dataset[i]["prompt"], tokenize=False, add_generation_prompt=True)
        for i in range(2)
    ]
    enc = tok(
        [t for t in texts for _ in range(8)],
        return_tensors="pt",
        padding=True,
        padding_side="left",
        add_special_tokens=False,
    )
    ids, mask = enc["input_ids"], enc["attention_mask"]
    config = GenerationConfig(
        do_sample=True,
        max_new_tokens=64,
        temperature=1.0,
        top_k=0,
        top_p=1.0,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    rate = matmul_gflops(clock=time.process_time)
    prompts = sum(len(x) for x in {tuple(r[m.bool()].tolist()) for r, m in zip(ids, mask)})
    context = float(mask.sum(-1).float().mean()) + 32
    floor = flops_per_token(underlying_model(model), context) * (prompts + 16 * 64) / rate / 1e9
    print(
        f"{args.model}: floor {floor:.2f} s ({prompts} prompt + 1024 sampled tokens at {rate:.0f} GFLOP/s "
        "per CPU second)"
    )
    paths = {
        "old": lambda: generate_with_shared_prefill(
            model, model.generate, input_ids=ids, attention_mask=mask, generation_config=config
        ),
        "new": lambda: sample(model, ids, mask, config),
    }
    for round_ in range(args.rounds):
        for name, run in paths.items():
            torch.manual_seed(round_)
            wall, cpu = time.perf_counter(), time.process_time()
            run()
            wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
            print(f"round {round_} {name}: wall {wall:.2f} s, CPU {cpu:.2f} s = {cpu / floor:.1f}x floor", flush=True)
    if args.profile:
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
            paths["new"]()
        averages = prof.key_averages(group_by_input_shape=True)
        print(averages.table(sort_by="self_cpu_time_total", row_limit=30, max_shapes_column_width=70))


if __name__ == "__main__":
    main()
