"""Measure the tool-calling warm start on the real default model (a script, not a test: it takes
about an hour on two CPU cores). Results go to ``--out`` (``results.json``, rewritten after every
stage, and ``log.txt``); ``docs/results.md`` quotes them.

    .venv/bin/python scripts/toolcall_warm_start.py --out runs/toolcall_warm_start

Stages:

1. **SFT** with :func:`mrtpo.warm_start.run_sft` (TRL ``SFTTrainer``, LoRA, constant learning rate) on
   the task's training pairs (:func:`mrtpo.warm_start.task_rows`, pairs over ``max_length`` left out),
   saving the adapters every ``--every`` steps, so the model after ``k`` steps is the model of a
   ``k``-step warm start. Its cost (seconds per step, peak memory) is recorded.
2. **Dose table**: for each dose (0 = the base model) sample ``--samples`` completions of each of the
   first ``--prompts`` *training* prompts (what RL samples) at the training temperature with the
   trainer's sampling settings (T = 1, top-p 1, no top-k, no repetition penalty), and report the
   ``format`` rate and the share of groups with format spread (neither all 0 nor all 1). A sample is
   stopped as soon as its format is decided (it cannot become the instructed form any more), which
   leaves the format reward exact and saves most of the generation at low doses.
   Each prompt is read once; its KV cache is copied to its samples.
3. Greedy BFCL AST accuracy per category before (dose 0) and after (chosen dose) on the first
   ``--eval-n`` eval items (the eval split's proportional prefix), through ``mrtpo.evaluate``.
4. At the chosen dose (most groups with spread; the smaller dose on a tie): the format rate with the
   call-format instruction removed from the prompt (the format replay's counterfactual), and with
   Qwen2.5's own chat template given ``tools=`` (its own ``<tool_call>`` instruction) instead of our
   system message; the latter also at dose 0 unless ``--skip qwen0``.

Run it again with the same ``--out`` to continue: what ``results.json`` already holds is kept and not
measured again (the SFT too, once its last checkpoint is there).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import resource
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

TAG, END = "<tool_call>", "</tool_call>"


def decided(text: str) -> bool:
    """True once ``text`` can no longer become the instructed form (blocks and whitespace only)."""
    rest = text.lstrip()
    while rest:
        if not rest.startswith(TAG):
            return not TAG.startswith(rest[: len(TAG)])
        close = rest.find(END)
        if close < 0:
            return False
        rest = rest[close + len(END) :].lstrip()
    return False


def table(results: dict) -> str:
    """The measured figures of ``results.json`` as markdown tables (docs/results.md quotes them)."""
    lines = [
        "| SFT steps | format rate (T = 1) | groups with format spread | all formatted | none formatted | "
        "mean correctness of formatted samples | sampling s |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for k in sorted(results["doses"], key=int):
        d = results["doses"][k]
        c = d["mean_correctness_when_formatted"]
        lines.append(
            f"| {k} | {d['format_rate']:.2f} ({round(d['format_rate'] * d['samples'])}/{d['samples']}) | "
            f"**{d['groups_with_spread']}/{d['prompts']}** = {d['share_with_spread']:.2f} | "
            f"{d['groups_all_formatted']} | {d['groups_none_formatted']} | "
            f"{'n/a' if c is None else f'{c:.2f}'} | {d['seconds']:.0f} |"
        )
    if results.get("extras"):
        lines += ["", "| model (SFT steps) | prompt | format rate | groups with spread |", "|---|---|---:|---:|"]
        for key, d in results["extras"].items():
            name, k = key.split("@")
            lines.append(
                f"| {k} | {name.replace('_', ' ')} | {d['format_rate']:.2f} "
                f"({round(d['format_rate'] * d['samples'])}/{d['samples']}) | "
                f"{d['groups_with_spread']}/{d['prompts']} |"
            )
    if results.get("bfcl"):
        cats = ["simple_python", "multiple", "parallel", "parallel_multiple", "irrelevance"]
        lines += [
            "",
            "| model (SFT steps) | " + " | ".join(cats) + " | overall | format rate |",
            "|---|" + "---:|" * (len(cats) + 2),
        ]
        for k, b in sorted(results["bfcl"].items(), key=lambda kv: int(kv[0])):
            per = b["per_category"]
            cells = [f"{per[c]['correct']}/{per[c]['total']}" if c in per else "-" for c in cats]
            lines.append(f"| {k} | " + " | ".join(cells) + f" | **{b['correct']}/{b['n']}** | {b['format_rate']:.2f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    if argv is None and sys.argv[1:2] == ["--table"]:
        print(table(json.loads(Path(sys.argv[2]).read_text())))
        return 0
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="qwen2.5-coder-0.5b")
    p.add_argument("--out", default="runs/toolcall_warm_start")
    p.add_argument("--doses", default="0,8,16,32,4,12,24", help="SFT steps to measure, in this order")
    p.add_argument("--every", type=int, default=4, help="save the adapters every this many steps")
    p.add_argument("--prompts", type=int, default=32)
    p.add_argument("--samples", type=int, default=4)
    p.add_argument("--prompts-per-batch", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--eval-n", type=int, default=32)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--first-token",
        default="",
        help="only measure log P(<tool_call> first) after these SFT steps "
        "(comma-separated) on the 4 shortest of the --prompts training prompts, then stop",
    )
    p.add_argument("--learning-rate", type=float, default=None, help="override the warm start's learning rate")
    p.add_argument("--no-text-tags", action="store_true", help="teach the tags as the tokenizer's added tokens")
    p.add_argument("--max-length", type=int, default=None, help="override the warm start's max_length (smoke tests)")
    p.add_argument("--skip", default="", help="comma-separated stages to skip: extras, bfcl, qwen0")
    args = p.parse_args(argv)

    import torch
    import transformers
    import trl
    from peft import PeftModel
    from transformers import StoppingCriteria, StoppingCriteriaList

    from mrtpo.counterfactual import counterfactual_text
    from mrtpo.evaluate import evaluate_model
    from mrtpo.machine import cpu_flags
    from mrtpo.models import load_policy
    from mrtpo.shared_prompt import generate_with_shared_prefill
    from mrtpo.tasks.toolcall import ToolCallTask, parse_completion
    from mrtpo.tasks.toolcall.prompt import render_prompt, system_prompt
    from mrtpo.warm_start import TASK_DEFAULTS, fit_rows, run_sft, task_rows
    from mrtpo.warning_filters import filter_dependency_warnings

    filter_dependency_warnings()  # as the mrtpo commands do: pinned dependencies' own deprecations

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    log_file = open(out / "log.txt", "a", buffering=1)

    def log(*parts):
        line = f"[{time.strftime('%H:%M:%S')}] " + " ".join(str(x) for x in parts)
        print(line, flush=True)
        log_file.write(line + "\n")

    flags = cpu_flags()
    results: dict = {
        "command": " ".join([".venv/bin/python", "scripts/toolcall_warm_start.py", *sys.argv[1:]]),
        "machine": {
            "cpu": platform.processor() or platform.machine(),
            "cores": os.cpu_count(),
            "torch_threads": torch.get_num_threads(),
            "avx2": "avx2" in flags,
            "avx512f": "avx512f" in flags,
            "avx512_bf16": "avx512_bf16" in flags,
            "amx_bf16": "amx_bf16" in flags,
            "dtype": "float32",
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "trl": trl.__version__,
        },
        "settings": vars(args),
        "doses": {},
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }

    previous = out / "results.json"
    if previous.is_file():  # a second invocation: keep what was measured, measure only what is missing
        old = json.loads(previous.read_text())
        results["doses"] = old.get("doses", {})
        for key in ("extras", "bfcl", "runs", "first_token", "sft"):
            if key in old:
                results[key] = old[key]
        results["runs"] = results.get("runs", []) + [{"command": old.get("command"), "started": old.get("started")}]

    def save():
        (out / "results.json").write_text(json.dumps(results, indent=1) + "\n")

    task = ToolCallTask()
    fmt, corr = task.verifiers()
    examples = task.load("train", args.prompts)
    settings = dataclasses.replace(TASK_DEFAULTS["toolcall"], steps=max(int(d) for d in args.doses.split(",")))
    if args.max_length:
        settings = dataclasses.replace(settings, max_length=args.max_length)
    if args.learning_rate:
        settings = dataclasses.replace(settings, learning_rate=args.learning_rate)
    if args.no_text_tags:
        settings = dataclasses.replace(settings, text_tags=())
    results["warm_start_settings"] = settings.record()
    log("machine", results["machine"])

    def load_base():
        return load_policy(args.model, dtype=torch.float32)

    model, tok = load_base()
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    stop_ids = sorted({i for i in (im_end, tok.eos_token_id) if i is not None})

    class FormatDecided(StoppingCriteria):
        def __init__(self, width):
            self.width = width

        def __call__(self, input_ids, scores, **kwargs):
            rows = [tok.decode(r[self.width :], skip_special_tokens=True) for r in input_ids]
            return torch.tensor([decided(t) for t in rows], dtype=torch.bool, device=input_ids.device)

    def sample(model, prompts, exs, label, seed):
        """``--samples`` completions per prompt at T=1; format, correctness and forms per sample."""
        model.eval()
        tok.padding_side = "left"
        order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
        texts = [None] * len(prompts)
        t0, new_tokens = time.perf_counter(), 0
        for b in range(0, len(order), args.prompts_per_batch):
            idx = order[b : b + args.prompts_per_batch]
            enc = tok([prompts[i] for i in idx], return_tensors="pt", padding=True, add_special_tokens=False)
            width = enc["input_ids"].shape[1]
            torch.manual_seed(seed * 1000 + b)
            ids, mask = enc["input_ids"], enc["attention_mask"]
            with torch.no_grad():
                # each prompt is read once and its KV cache copied to its samples (num_return_sequences
                # would read it once per sample): mrtpo.shared_prompt, as the trainer samples
                gen = generate_with_shared_prefill(
                    model,
                    model.generate,
                    ids.repeat_interleave(args.samples, 0),
                    mask.repeat_interleave(args.samples, 0),
                    do_sample=True,
                    temperature=1.0,
                    top_p=1.0,
                    top_k=0,
                    repetition_penalty=1.0,
                    max_new_tokens=args.max_new_tokens,
                    eos_token_id=stop_ids,
                    pad_token_id=tok.pad_token_id,
                    stopping_criteria=StoppingCriteriaList([FormatDecided(width)]),
                )
            for j, i in enumerate(idx):
                rows = gen[j * args.samples : (j + 1) * args.samples, width:]
                texts[i] = [tok.decode(r, skip_special_tokens=True) for r in rows]
                new_tokens += int(sum(((r != tok.pad_token_id) & (r >= 0)).sum() for r in rows))
        seconds = time.perf_counter() - t0
        groups = []
        for ex, outs in zip(exs, texts):
            f = [fmt(o, ex) for o in outs]
            groups.append(
                {
                    "id": ex.id,
                    "format": f,
                    "correctness_when_formatted": [corr(o, ex) for o, x in zip(outs, f) if x == 1.0],
                    "forms": [parse_completion(o).form for o in outs],
                    "outputs": outs,
                }
            )
        n = sum(len(g["format"]) for g in groups)
        formatted = [c for g in groups for c in g["correctness_when_formatted"]]
        forms: dict[str, int] = {}
        for g in groups:
            for form in g["forms"]:
                forms[form] = forms.get(form, 0) + 1
        summary = {
            "label": label,
            "prompts": len(groups),
            "samples": n,
            "format_rate": sum(sum(g["format"]) for g in groups) / n,
            "groups_with_spread": sum(0 < sum(g["format"]) < len(g["format"]) for g in groups),
            "groups_all_formatted": sum(sum(g["format"]) == len(g["format"]) for g in groups),
            "groups_none_formatted": sum(sum(g["format"]) == 0 for g in groups),
            "mean_correctness_when_formatted": sum(formatted) / len(formatted) if formatted else None,
            "forms": forms,
            "seconds": round(seconds, 1),
            "new_tokens": new_tokens,
        }
        summary["share_with_spread"] = summary["groups_with_spread"] / len(groups)
        log(label, {k: v for k, v in summary.items() if k != "forms"}, "forms", forms)
        return summary, groups

    def our_prompts(exs):
        return [task.render_prompt(e, tok) for e in exs]

    def without_instruction(exs):
        return [
            counterfactual_text(
                e.messages,
                [fmt.evidence(e)],
                lambda m, e=e: render_prompt(dataclasses.replace(e, messages=m), tok),
                example_id=e.id,
            )
            for e in exs
        ]

    def qwen_template(exs):
        prompts = []
        for e in exs:
            ours = system_prompt(e.tools)
            rest = e.messages[0]["content"][len(ours) :].strip()
            assert e.messages[0]["content"].startswith(ours)
            msgs = ([{"role": "system", "content": rest}] if rest else []) + e.messages[1:]
            prompts.append(tok.apply_chat_template(msgs, tools=e.tools, tokenize=False, add_generation_prompt=True))
        return prompts

    # ---- 1. SFT, adapters saved every --every steps
    sft_dir = out / "sft"
    rows, dropped = fit_rows(task_rows(task, tok), tok, settings.max_length)
    results["sft"] = {"pairs": len(rows), "left_out_longer": dropped}
    done_steps = sorted(int(c.name.split("-")[1]) for c in sft_dir.glob("checkpoint-*"))
    if settings.steps and (not done_steps or done_steps[-1] < settings.steps):
        log(f"SFT: {len(rows)} pairs ({dropped} over {settings.max_length} tokens left out), {settings.steps} steps")
        merged, stats = run_sft(model, tok, rows, settings, sft_dir, save_steps=args.every, log=log)
        stats["peak_rss_gib"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2)
        results["sft"].update(stats)
        (out / "sft_stats.json").write_text(json.dumps(results["sft"], indent=1))
        del merged
    elif (out / "sft_stats.json").is_file():
        results["sft"] = json.loads((out / "sft_stats.json").read_text())
    save()

    def model_at(k):
        base, _ = load_base()
        if k == 0:
            return base
        peft = PeftModel.from_pretrained(base, str(sft_dir / f"checkpoint-{k}"))
        return peft.merge_and_unload().eval()

    if args.first_token:  # a cheap probe: how likely the answer opens with the tag, either spelling
        from mrtpo.warm_start import text_token_ids

        special = tok.convert_tokens_to_ids(TAG)
        spelled = text_token_ids(tok, TAG, (TAG,))
        short = sorted(our_prompts(examples), key=len)[:4]
        results.setdefault("first_token", {})
        for k in [int(x) for x in args.first_token.split(",")]:
            m = model_at(k)
            rows = []
            for prompt in short:
                ids = tok(prompt, return_tensors="pt", add_special_tokens=False)["input_ids"]
                full = torch.cat([ids, torch.tensor([spelled])], dim=1)
                with torch.no_grad():
                    logp = m(full).logits[0, ids.shape[1] - 1 : -1].log_softmax(-1)
                lp_special = logp[0, special].item()
                lp_text = sum(logp[i, t].item() for i, t in enumerate(spelled))
                rows.append({"special_token": round(lp_special, 2), "text_tokens": round(lp_text, 2)})
            results["first_token"][str(k)] = rows
            log(f"log P({TAG} first) after {k} steps:", rows)
            save()
            del m
        return 0

    # ---- 2. dose table
    prompts = our_prompts(examples)
    for k in [int(d) for d in args.doses.split(",")]:
        if str(k) in results["doses"]:
            continue
        m = model_at(k)
        summary, groups = sample(m, prompts, examples, f"dose {k} steps", args.seed)
        results["doses"][str(k)] = summary
        (out / f"samples_dose{k}.json").write_text(json.dumps(groups, indent=1))
        save()
        del m
    best = max(results["doses"].values(), key=lambda s: (s["groups_with_spread"], -int(s["label"].split()[1])))
    chosen = int(best["label"].split()[1])
    results["chosen_dose"] = chosen
    log("chosen dose", chosen, "steps:", best["groups_with_spread"], "of", best["prompts"], "groups with spread")
    save()

    skip = set(filter(None, args.skip.split(",")))
    if "bfcl" not in skip:
        # ---- 4. greedy BFCL AST per category, before and after
        evals = task.load("eval", args.eval_n)
        results.setdefault("bfcl", {})
        for k in (0, chosen):
            if str(k) in results["bfcl"]:
                continue
            m = model_at(k)
            t0 = time.perf_counter()
            metrics, gens = evaluate_model(
                m, tok, task, evals, batch_size=8, max_new_tokens=args.max_new_tokens, progress=False
            )
            per = {
                c: {"correct": s["correct"], "total": s["total"], "format_rate": s["format_rate"]}
                for c, s in metrics["per_category"].items()
            }
            results["bfcl"][str(k)] = {
                "accuracy": metrics["accuracy"],
                "correct": metrics["correct"],
                "n": metrics["n"],
                "format_rate": metrics["format_rate"],
                "per_category": per,
                "seconds": round(time.perf_counter() - t0, 1),
            }
            (out / f"bfcl_dose{k}.json").write_text(
                json.dumps([{"id": g.id, "output": g.output, **v} for g, v in zip(gens, metrics["items"])], indent=1)
            )
            log(f"BFCL greedy dose {k}", results["bfcl"][str(k)])
            save()
            del m
    if "extras" not in skip:
        # ---- 3. instruction removed; Qwen's own template with tools
        results.setdefault("extras", {})
        todo = [(chosen, "without_instruction", without_instruction), (chosen, "qwen_template_tools", qwen_template)]
        if "qwen0" not in skip:
            todo.append((0, "qwen_template_tools", qwen_template))
        for k, name, make in todo:
            if f"{name}@{k}" in results["extras"]:
                continue
            m = model_at(k)
            summary, groups = sample(m, make(examples), examples, f"dose {k} {name}", args.seed)
            results["extras"][f"{name}@{k}"] = summary
            (out / f"samples_{name}_dose{k}.json").write_text(json.dumps(groups, indent=1))
            save()
            del m
    results["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    save()
    log("done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
