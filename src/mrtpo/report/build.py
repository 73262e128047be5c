"""The end-of-training report of a run folder: ``report.html``, ``report.md`` and ``curves.png``.

:func:`make_report` reads what the trainer wrote (``config.yaml``, ``metrics.jsonl``,
``credit_samples.jsonl``) and renders:

- ``curves.png``: each reward's mean per step (±std), total reward, length, loss, time split;
- ``report.html``: run summary, the curves (embedded), and the token-credit view of a few sampled
  completions from the first and from the last generation step (each token shaded by each
  reward's weight; hover shows weight and relevance);
- ``report.md``: the same summary and samples as text, linking the PNG.
"""

from __future__ import annotations

import base64
import html
import math
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from mrtpo.report.curves import (
    TIME_PHASES,
    json_lines,
    load_metrics,
    plot_run,
    reward_names,
    series,
    step_records,
)
from mrtpo.report.held_out import eval_rows
from mrtpo.report.token_view import CSS, CompletionView, CreditRow, render_cards

__all__ = ["load_credit_samples", "make_report", "pick_samples", "sample_view", "summarise"]


def load_credit_samples(path: str | os.PathLike) -> list[dict[str, Any]]:
    path = Path(path)
    if not path.is_file():
        return []
    return json_lines(path)


def pick_samples(samples: Sequence[Mapping[str, Any]], per_step: int) -> list[tuple[int, list[Mapping[str, Any]]]]:
    """``[(step, records)]`` for the first and the last generation step (one entry if they coincide)."""
    if not samples or per_step <= 0:
        return []
    steps = sorted({int(s["step"]) for s in samples})
    chosen = [steps[0]] if steps[0] == steps[-1] else [steps[0], steps[-1]]
    return [(st, [s for s in samples if int(s["step"]) == st][:per_step]) for st in chosen]


def _fmt(v: Any, spec: str = "{:.3f}") -> str:
    return spec.format(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else "n/a"


def summarise(records: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """First/last step values of each reward and of the total, step count, time split."""
    steps = step_records(records)
    names = reward_names(records)
    rows = []
    for label, key in [*((n, f"rewards/{n}/mean") for n in names), ("total reward", "reward"),
                       ("completion length", "completions/mean_length"), ("loss", "loss")]:
        s, v = series(records, key)
        if v:
            rows.append({"name": label, "first": v[0], "last": v[-1], "mean": sum(v) / len(v),
                         "first_step": s[0], "last_step": s[-1]})
    times = {}
    for phase in (*TIME_PHASES, "step_time"):
        key = phase if phase == "step_time" else f"time/{phase}"
        _, v = series(records, key)
        if v:
            times[phase] = sum(v)
    return {"steps": len(steps), "last_step": int(steps[-1]["step"]) if steps else 0, "rewards": names,
            "rows": rows, "time_total": times}


def _examples(config: Mapping[str, Any], ids: set[str]) -> dict[str, Any]:
    """The task examples with these ids (for prompts and evidence placements); {} if unavailable."""
    if not ids or "task" not in config:
        return {}
    try:
        from mrtpo.tasks import get_task

        task = get_task(config["task"], **(config.get("task_args") or {}))
        found = {}
        for split in ("train", "eval"):
            for ex in task.load(split, config.get("train_size") if split == "train" else config.get("eval_size") or 0):
                if ex.id in ids:
                    found[ex.id] = (ex, task)
            if set(found) >= ids:
                break
        return found
    except Exception:  # noqa: BLE001  (the report must not fail because a task's data moved)
        return {}


def _last_user(example) -> str:
    for m in reversed(example.messages):
        if m.get("role") == "user":
            return str(m.get("content", ""))
    return ""


def sample_view(record: Mapping[str, Any], example_task: tuple | None = None) -> CompletionView:
    """A credit-samples record as a :class:`CompletionView` (rows in the record's reward order)."""
    rewards = record.get("rewards", {})
    relevance = record.get("relevance") or {}
    placements: dict[str, str | None] = {}
    notes = {"example": str(record.get("example_id", "?"))}
    if example_task is not None:
        example, task = example_task
        for v in task.verifiers():
            ev = v.evidence(example)
            placements[v.name] = ev.placement if ev is not None else None
        question = example.meta.get("question") or _last_user(example)
        notes["prompt"] = question if len(question) <= 240 else question[:237] + "..."
    rows = []
    for name, weights in record["weights"].items():
        evidence = placements.get(name)
        if evidence is None and name in relevance and any(relevance[name]):
            evidence = "evidence replay"
        rows.append(CreditRow(name, rewards.get(name), weights, relevance.get(name), evidence))
    reward_str = ", ".join(f"{n}={'n/a' if r is None else f'{r:g}'}" for n, r in rewards.items())
    title = f"step {record.get('step')} · {record.get('method', '?')} · {reward_str}"
    return CompletionView(title, record["tokens"], rows, record.get("advantage"), notes)


def _longest_backtick_run(text: str) -> int:
    runs = re.findall(r"`+", text)
    return max(map(len, runs)) if runs else 0


def _top_tokens(record: Mapping[str, Any], name: str, k: int = 3) -> str:
    w = record["weights"][name]
    order = sorted(range(len(w)), key=lambda i: -w[i])[:k]
    return ", ".join(f"{record['tokens'][i]!r}×{w[i]:.2f}" for i in order)


_TABLE_CSS = ("table{border-collapse:collapse;margin:8px 0}td,th{border:1px solid #ddd;padding:3px 10px;"
              "text-align:right}td:first-child,th:first-child{text-align:left}img{max-width:100%}")


def _read_config(out: Path) -> dict[str, Any]:
    path = out / "config.yaml"
    if not path.is_file():
        return {}
    import yaml

    data = yaml.safe_load(path.read_text())
    return data if isinstance(data, dict) else {}


def _pool_note(config: Mapping[str, Any], steps: int) -> str:
    """Say how often each prompt of a small train pool (``train_size``) came back, and what that means."""
    size = config.get("train_size")
    per_step = int(config.get("per_device_train_batch_size") or 0) // max(1, int(config.get("num_generations") or 1))
    if not size or not per_step or not steps or steps * per_step <= size:
        return ""
    return (f"the first {size} train prompts, each revisited about {steps * per_step / size:.0f} times: a rising "
            "reward shows the loop learns on these prompts, not that it generalises")


def _trend(records: Sequence[Mapping[str, Any]]) -> str:
    """Mean total reward over the first and the last quarter of the steps (at least one step each)."""
    _, values = series(records, "reward")
    if len(values) < 4:
        return ""
    k = len(values) // 4
    return (f"{sum(values[:k]) / k:.3f} over the first {k} steps → {sum(values[-k:]) / k:.3f} over the last {k} "
            f"(of {len(values)})")


def make_report(output_dir: str | os.PathLike, samples: int = 2) -> dict[str, Path]:
    """Write ``curves.png``, ``report.html`` and ``report.md`` into the run folder; return their paths.

    ``samples``: completions shown from the first and from the last generation step.
    """
    out = Path(output_dir)
    records = load_metrics(out / "metrics.jsonl")
    config = _read_config(out)
    task, method, model = config.get("task", "?"), config.get("method", "?"), config.get("model", "?")
    title = f"{task} · {method} · {model}"
    curves = plot_run(records, out / "curves.png", title=title)
    summary = summarise(records)
    picked = pick_samples(load_credit_samples(out / "credit_samples.jsonl"), samples)
    wanted = {str(r.get("example_id")) for _, recs in picked for r in recs}
    examples = _examples(config, wanted)

    lora = f"LoRA r={config['lora_r']}" if config.get("lora_r") else "full fine-tuning"
    info = [("task", task), ("method", method), ("model", f"{model} ({lora})"),
            ("steps logged", f"{summary['steps']} (last step {summary['last_step']})"),
            ("batch", (f"{config.get('per_device_train_batch_size', '?')} completions/device/step, "
                       f"{config.get('num_generations', '?')} per prompt, "
                       f"max {config.get('max_completion_length', '?')} tokens")),
            ("learning rate", str(config.get("learning_rate", "?")))]
    pool = _pool_note(config, summary["steps"])
    if pool:
        info.append(("prompt pool", pool))
    trend = _trend(records)
    if trend:
        info.append(("total reward trend", trend))
    t = summary["time_total"]
    if t:
        split = ", ".join(f"{p} {t[p]:.0f} s" for p in TIME_PHASES if p in t)
        total = f"{t['step_time']:.0f} s in steps" if "step_time" in t else ""
        info.append(("time", "; ".join(x for x in (total, split) if x)))

    # --- markdown -------------------------------------------------------------------------
    md = [f"# Training report: {title}", ""]
    md += [f"- **{k}**: {v}" for k, v in info]
    md += ["", "| metric | first step | last step | mean |", "|---|---:|---:|---:|"]
    md += [f"| {r['name']} | {_fmt(r['first'])} | {_fmt(r['last'])} | {_fmt(r['mean'])} |" for r in summary["rows"]]
    held_out = eval_rows(records)
    if held_out:
        md += ["", "## Held-out evaluation", "", "| metric | first eval | last eval |", "|---|---:|---:|"]
        md += [f"| {r['name']} | {_fmt(r['first'])} (step {r['first_step']}) | "
               f"{_fmt(r['last'])} (step {r['last_step']}) |" for r in held_out]
    md += ["", "![training curves](curves.png)", "", "## Sampled completions", ""]
    if not picked:
        md.append("No credit samples were recorded (credit_samples=0, or no step ran).")
    for step, recs in picked:
        md += [f"### generation step {step}", ""]
        for rec in recs:
            rewards = ", ".join(f"{n}={'n/a' if r is None else f'{r:g}'}" for n, r in rec.get("rewards", {}).items())
            text = "".join(rec["tokens"]).strip()
            fence = "`" * max(3, _longest_backtick_run(text) + 1)  # a completion may hold ``` itself
            md += [f"**{rec.get('example_id')}** · {rewards}", "", f"{fence}text", text, fence, ""]
            md += [f"- `{n}` credit peaks on {_top_tokens(rec, n)}" for n in rec["weights"]]
            md.append("")
    md += [("Files: `config.yaml` (settings), `metrics.jsonl` (per step), `credit_samples.jsonl` (token weights), "
            "`checkpoint-N/` (resumable checkpoints), `report.html` (token-credit view)."), ""]
    md_path = out / "report.md"
    md_path.write_text("\n".join(md))

    # --- html -----------------------------------------------------------------------------
    png = base64.b64encode(curves.read_bytes()).decode("ascii")
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>",
             f"<style>{CSS}{_TABLE_CSS}</style></head><body>",
             f"<h1>Training report: {html.escape(title)}</h1><ul>"]
    parts += [f"<li><b>{html.escape(k)}</b>: {html.escape(str(v))}</li>" for k, v in info]
    parts.append("</ul><table><tr><th>metric</th><th>first step</th><th>last step</th><th>mean</th></tr>")
    parts += [f"<tr><td>{html.escape(r['name'])}</td><td>{_fmt(r['first'])}</td><td>{_fmt(r['last'])}</td>"
              f"<td>{_fmt(r['mean'])}</td></tr>" for r in summary["rows"]]
    parts.append("</table>")
    if held_out:
        parts.append("<h2>Held-out evaluation</h2><table><tr><th>metric</th><th>first eval</th><th>last eval</th></tr>")
        parts += [f"<tr><td>{html.escape(r['name'])}</td><td>{_fmt(r['first'])} (step {r['first_step']})</td>"
                  f"<td>{_fmt(r['last'])} (step {r['last_step']})</td></tr>" for r in held_out]
        parts.append("</table>")
    parts.append(f"<h2>Curves</h2><img alt='training curves' src='data:image/png;base64,{png}'>")
    parts.append("<h2>Where each reward's credit went</h2><p>Sampled completions of the first and the last "
                 "generation step. Each row shades the tokens by that reward's weight (hover for weight and "
                 "relevance); the last row is the per-token advantage.</p>")
    if not picked:
        parts.append("<p>No credit samples were recorded (credit_samples=0, or no step ran).</p>")
    for step, recs in picked:
        parts.append(f"<h3>generation step {step}</h3>")
        parts.append(render_cards([sample_view(r, examples.get(str(r.get("example_id")))) for r in recs]))
    parts.append("</body></html>")
    html_path = out / "report.html"
    html_path.write_text("".join(parts))
    return {"html": html_path, "md": md_path, "curves": curves}
