"""``mrtpo explain``: the token-credit view of one prompt/completion pair, with a given model.

    mrtpo explain --task sql --index 3 --completion-file answer.txt --out explain.html
    mrtpo explain --task toolcall --index 0 --model runs/toolcall-mrtpo-x/checkpoint-40   # greedy

Takes example ``--index`` of ``--split``, a completion (``--completion`` text, ``--completion-file``,
or, with neither, the model's own greedy completion), scores it with the task's verifiers, replays
it with and without each verifier's evidence (:func:`mrtpo.replay.replay_completion`, the same
forwards the trainer runs) and turns the relevance into the token weights of ``--method``. Writes
one HTML card (a row per reward: each token shaded by that reward's weight, hover for the weight
and the relevance) and prints where each reward's credit peaks.

One completion has no group, so there is no advantage to show: the weights say how a reward's
advantage *would* be spread over these tokens in a group where it is non-zero.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

from mrtpo.cli_help import HelpFormatter
from mrtpo.tasks import TASK_NAMES

#: Training's default weight shape (:data:`mrtpo.credit.DEFAULT_LAM` / ``DEFAULT_W_MAX``, equal by a test),
#: written out so parsing the arguments does not import torch.
WEIGHT_SHAPE = {"lam": 0.2, "w_max": 1.2}

__all__ = ["explain", "main"]


class ExplainError(ValueError):
    """A mistake in the command's inputs; the message says the fix."""


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="mrtpo explain", description=__doc__.splitlines()[0], formatter_class=HelpFormatter
    )
    p.add_argument(
        "--task",
        required=True,
        help=f"task of the example: {', '.join(TASK_NAMES)}, a plugin's, or a task file (.yaml)",
    )
    p.add_argument("--index", type=int, default=0, help="example index within the split")
    p.add_argument("--split", default="train", help="train or eval")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--completion", help="the completion text to explain (default: the model's greedy completion)")
    src.add_argument("--completion-file", type=Path, help="file holding the completion text")
    p.add_argument("--model", default="qwen2.5-coder-0.5b", help="preset, model folder, checkpoint, .gguf or hub id")
    p.add_argument(
        "--dtype",
        default="float32",
        choices=("float32", "bfloat16"),
        help="weights dtype (training uses float32 on CPU)",
    )
    from mrtpo.credit import RELEVANCE_KINDS, available_methods  # the registries, plugins' methods included

    p.add_argument(
        "--method", default="mrtpo", choices=available_methods(), help="credit method whose weights are shown"
    )
    p.add_argument("--relevance", default="js", choices=RELEVANCE_KINDS, help="relevance of a replay")
    p.add_argument(
        "--lam",
        type=float,
        default=WEIGHT_SHAPE["lam"],
        help="0 uniform .. 1 proportional to relevance (training's default; the paper's: 1)",
    )
    p.add_argument(
        "--w-max",
        type=float,
        default=WEIGHT_SHAPE["w_max"],
        help="cap on one token's weight (training's default; 0: no cap, the paper's)",
    )
    p.add_argument("--temperature", type=float, default=1.0, help="replay temperature (the sampling temperature)")
    p.add_argument("--max-new-tokens", type=int, default=128, help="length cap of the greedy completion")
    p.add_argument("--no-eos", action="store_true", help="do not append the end-of-turn token to a given completion")
    p.add_argument(
        "--task-arg", action="append", default=[], metavar="KEY=VALUE", help="task constructor argument (YAML value)"
    )
    p.add_argument("--out", type=Path, default=Path("explain.html"), metavar="FILE", help="HTML file to write")
    return p.parse_args(argv)


def _task_args(items: list[str]) -> dict:
    import yaml

    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise ExplainError(f"--task-arg {item!r} is not KEY=VALUE")
        out[key.strip()] = yaml.safe_load(value)
    return out


def _greedy(model, tokenizer, prompt: str, max_new_tokens: int) -> list[int]:
    import torch

    ids = tokenizer(prompt, add_special_tokens=False, return_tensors="pt")["input_ids"]
    stop = [
        i
        for i in {tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids("<|im_end|>"), tokenizer.pad_token_id}
        if isinstance(i, int) and i >= 0
    ]
    with torch.no_grad():
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            do_sample=False,
            max_new_tokens=max_new_tokens,
            eos_token_id=stop,
            pad_token_id=tokenizer.pad_token_id,
        )
    new = out[0, ids.shape[1] :].tolist()
    for k, tok in enumerate(new):
        if tok in stop:
            return new[: k + 1]
    return new


def _known_positions(task, verifiers, example, tokenizer, completion_ids: list[int], needs: str):
    """``(1, K, T)``: the positions the task knows each reward reads in the completion, for a method that
    weighs them (the ``oracle``); ``None`` for the others."""
    from mrtpo.known_positions import known_position_mask
    from mrtpo.replay_plan import context_rule
    from mrtpo.task_base import implements

    if not context_rule(needs).known:
        return None
    text = tokenizer.decode(completion_ids, skip_special_tokens=True)
    spans_of = task.checked_spans if implements(task, "checked_spans") else None
    return known_position_mask(
        verifiers, [example], [text], [list(completion_ids)], len(completion_ids), tokenizer, spans_of
    )


def explain(
    model,
    tokenizer,
    task,
    example,
    completion_ids: list[int],
    completion_text: str,
    *,
    method: str = "mrtpo",
    relevance: str = "js",
    lam: float = WEIGHT_SHAPE["lam"],
    w_max: float | None = WEIGHT_SHAPE["w_max"],
    temperature: float = 1.0,
):
    """Rewards, evidence, relevance and ``method``'s weights for one completion; returns a dict
    with ``view`` (a :class:`~mrtpo.report.token_view.CompletionView`) and the raw tensors."""
    import torch

    from mrtpo.counterfactual import prompt_renderer
    from mrtpo.credit import CreditBatch, CreditConfig, get_method
    from mrtpo.replay import replay_completion
    from mrtpo.report.token_view import CompletionView, CreditRow

    verifiers = task.verifiers()
    names = [v.name for v in verifiers]
    rewards = [v(completion_text, example) for v in verifiers]
    evidences = [v.evidence(example) for v in verifiers]
    credit = get_method(method)
    ids = torch.tensor(completion_ids, dtype=torch.long)
    result = replay_completion(
        model,
        tokenizer,
        example,
        ids,
        evidences,
        render=prompt_renderer(task, tokenizer),
        kind=relevance,
        temperature=temperature,
        verifiers=names,
        needs=("per_reward", credit.needs),  # each reward's map is shown
    )
    t = ids.numel()
    batch = CreditBatch(
        rewards=torch.tensor([[float("nan") if r is None else float(r) for r in rewards]]),
        group_size=1,
        mask=torch.ones(1, t),
        relevance=result.relevance.unsqueeze(0),
        has_evidence=torch.tensor([result.has_evidence]),
        joint_relevance=None if result.joint is None else result.joint.unsqueeze(0),
        entropy=None if result.entropy is None else result.entropy.unsqueeze(0),
        decoy_relevance=None if result.decoy is None else result.decoy.unsqueeze(0),
        known_positions=_known_positions(task, verifiers, example, tokenizer, completion_ids, credit.needs),
    )
    weights = credit.weights(batch, CreditConfig(lam=lam, w_max=w_max))[0]  # (K, T)
    tokens = [tokenizer.decode([i]) for i in completion_ids]
    rows = [
        CreditRow(n, r, weights[k].tolist(), result.relevance[k].tolist(), ev.placement if ev else None)
        for k, (n, r, ev) in enumerate(zip(names, rewards, evidences))
    ]
    reward_str = ", ".join(f"{n}={'n/a' if r is None else f'{r:g}'}" for n, r in zip(names, rewards))
    notes = {"example": example.id, "method": method, "relevance": relevance}
    for n, ev in zip(names, evidences):
        if ev is not None:
            text = " ".join(ev.text.split())
            notes[f"{n} evidence ({ev.placement})"] = text if len(text) <= 160 else text[:157] + "..."
    view = CompletionView(f"{example.id} · {reward_str}", tokens, rows, None, notes)
    return {
        "view": view,
        "names": names,
        "rewards": rewards,
        "evidences": evidences,
        "weights": weights,
        "relevance": result.relevance,
        "tokens": tokens,
    }


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    from mrtpo.hub import prepare_hub

    prepare_hub()  # before anything loads; offline only where the user or the machine says so
    from mrtpo.counterfactual import DEFAULT_PRIVILEGED_HEADER, prompt_renderer
    from mrtpo.evaluate import EvalUserError, load_model
    from mrtpo.models import ModelLoadError
    from mrtpo.report.token_view import render_html
    from mrtpo.tasks import UnknownTaskError, get_task
    from mrtpo.tasks.from_config import TaskFileError

    t0 = time.perf_counter()
    try:
        task = get_task(args.task, **_task_args(args.task_arg))
        if args.index < 0:
            raise ExplainError(f"--index must be >= 0, got {args.index}")
        examples = task.load(args.split, limit=args.index + 1)
        if args.index >= len(examples):
            raise ExplainError(
                f"--index {args.index} is out of range: split {args.split!r} of task {args.task!r} "
                f"has {len(examples)} examples"
            )
        example = examples[args.index]
        if args.completion_file is not None:
            if not args.completion_file.is_file():
                raise ExplainError(f"--completion-file {args.completion_file} does not exist")
            given = args.completion_file.read_text()
        else:
            given = args.completion
        if given is not None and not given.strip():
            raise ExplainError("the completion is empty; give some text (or neither option, for a greedy completion)")
        model, tokenizer, _ = load_model(args.model, dtype=args.dtype, device="cpu")
    except (ExplainError, EvalUserError, ModelLoadError, TypeError, UnknownTaskError, TaskFileError) as exc:
        print(f"mrtpo explain: {exc}", file=sys.stderr)
        return 2
    prompt = prompt_renderer(task, tokenizer)(example)
    if given is None:
        ids = _greedy(model, tokenizer, prompt, args.max_new_tokens)
        text = tokenizer.decode(ids, skip_special_tokens=True)
        origin = f"greedy completion of {args.model}"
    else:
        text = given
        ids = tokenizer(given, add_special_tokens=False)["input_ids"]
        eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
        eos = eos if isinstance(eos, int) and eos >= 0 and eos != tokenizer.unk_token_id else tokenizer.eos_token_id
        if not args.no_eos and eos is not None:
            ids = ids + [eos]
        origin = "given completion"
    if not ids:
        print("mrtpo explain: the completion has no tokens", file=sys.stderr)
        return 2
    res = explain(
        model,
        tokenizer,
        task,
        example,
        ids,
        text,
        method=args.method,
        relevance=args.relevance,
        lam=args.lam,
        w_max=args.w_max or None,
        temperature=args.temperature,
    )
    print(f"{args.task} {example.id} · {origin} · {len(ids)} tokens · model {args.model}")
    print("  " + text.strip().replace("\n", "\n  ")[:600])
    for k, (name, r, ev) in enumerate(zip(res["names"], res["rewards"], res["evidences"])):
        w = res["weights"][k]
        top = sorted(range(len(ids)), key=lambda i: -float(w[i]))[:5]
        peaks = ", ".join(f"{res['tokens'][i]!r}×{float(w[i]):.2f}" for i in top)
        r_str = "n/a" if r is None or (isinstance(r, float) and math.isnan(r)) else f"{r:g}"
        where = ev.placement if ev is not None else "no evidence, uniform"
        print(f"  {name:>14} = {r_str:<5} ({where}): credit peaks on {peaks}")
    intro = (
        f"{origin}; weights of method {args.method!r}. In-prompt evidence is removed for the counterfactual; "
        f"privileged evidence is appended under {DEFAULT_PRIVILEGED_HEADER!r}. A single completion has no group "
        "advantage, so only the weights are shown."
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(render_html([res["view"]], f"Token credit · {args.task} · {example.id}", intro))
    print(f"wrote {args.out} ({time.perf_counter() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
