"""The end-of-training report of a run folder: ``report.html``, ``report.md`` and ``curves.png``.

:func:`make_report` reads what the trainer wrote (``config.yaml``, ``metrics.jsonl``,
``credit_samples.jsonl``) and renders:

- ``curves.png``: each reward's mean per step (a ``{0,1}`` reward as a proportion with its Wilson
  interval), total reward, length, loss, time split, held-out rewards and the diagnostics (grad
  norm, clip rate, KL, share of zero-spread groups; :mod:`mrtpo.report.curves`);
- ``report.html``: run summary, held-out and diagnostics tables (a metric the run did not log is
  named as missing), the curves (embedded), and the token-credit view of the same prompt at the
  first and at the last step (:mod:`mrtpo.report.samples`; each token shaded by each reward's
  weight on a labelled colour bar, a reward without spread shown as skipped);
- ``report.md``: the same summary and samples as text, linking the PNG.

Every step number is the one ``metrics.jsonl`` and the curves use.
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

from mrtpo.report.curves import TIME_PHASES, band_rule, load_metrics, plot_run, reward_names, series, step_records
from mrtpo.report.diagnostics import diagnostic_rows
from mrtpo.report.held_out import eval_rows
from mrtpo.report.samples import load_credit_samples, no_spread, pick_samples, sample_view
from mrtpo.report.token_view import CSS, render_cards

__all__ = ["load_credit_samples", "make_report", "pick_samples", "sample_view", "summarise"]


def _fmt(v: Any, spec: str = "{:.3f}") -> str:
    return spec.format(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else "n/a"


def summarise(records: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """First/last step values of each reward and of the total, step count, time split."""
    steps = step_records(records)
    names = reward_names(records)
    rows = []
    for label, key in [
        *((n, f"rewards/{n}/mean") for n in names),
        ("total reward", "reward"),
        ("completion length", "completions/mean_length"),
        ("loss", "loss"),
    ]:
        s, v = series(records, key)
        if v:
            rows.append(
                {
                    "name": label,
                    "first": v[0],
                    "last": v[-1],
                    "mean": sum(v) / len(v),
                    "first_step": s[0],
                    "last_step": s[-1],
                }
            )
    times = {}
    for phase in (*TIME_PHASES, "step_time"):
        key = phase if phase == "step_time" else f"time/{phase}"
        _, v = series(records, key)
        if v:
            times[phase] = sum(v)
    return {
        "steps": len(steps),
        "last_step": int(steps[-1]["step"]) if steps else 0,
        "rewards": names,
        "rows": rows,
        "time_total": times,
    }


def _examples(config: Mapping[str, Any], ids: set[str]) -> dict[str, Any]:
    """The task examples with these ids (for prompts and evidence placements); {} if unavailable."""
    if not ids or "task" not in config:
        return {}
    try:
        from mrtpo.tasks import get_task
        from mrtpo.tasks.lazy_rows import examples_by_id

        task = get_task(config["task"], **(config.get("task_args") or {}))
        found = {}
        for split in ("train", "eval"):  # by id: a task file's are looked up in its Arrow ids, not all built
            by_id = examples_by_id(
                [task.load(split, config.get("train_size") if split == "train" else config.get("eval_size") or 0)]
            )
            found.update({i: (by_id[i], task) for i in ids if i not in found and i in by_id})
            if set(found) >= ids:
                break
        return found
    except Exception:  # noqa: BLE001  (the report must not fail because a task's data moved)
        return {}


def _longest_backtick_run(text: str) -> int:
    runs = re.findall(r"`+", text)
    return max(map(len, runs)) if runs else 0


def _top_tokens(record: Mapping[str, Any], name: str, k: int = 3) -> str:
    w = record["weights"][name]
    order = sorted(range(len(w)), key=lambda i: -w[i])[:k]
    return ", ".join(f"{record['tokens'][i]!r}×{w[i]:.2f}" for i in order)


_TABLE_CSS = (
    "table{border-collapse:collapse;margin:8px 0}td,th{border:1px solid #ddd;padding:3px 10px;"
    "text-align:right}td:first-child,th:first-child{text-align:left}img{max-width:100%}"
    ".missing{color:#a33;text-align:left}"
)


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
    return (
        f"the first {size} train prompts, each revisited about {steps * per_step / size:.0f} times: a rising "
        "reward shows the loop learns on these prompts, not that it generalises"
    )


def _trend(records: Sequence[Mapping[str, Any]]) -> str:
    """Mean total reward over the first and the last quarter of the steps (at least one step each)."""
    _, values = series(records, "reward")
    if len(values) < 4:
        return ""
    k = len(values) // 4
    return (
        f"{sum(values[:k]) / k:.3f} over the first {k} steps → {sum(values[-k:]) / k:.3f} over the last {k} "
        f"(of {len(values)})"
    )


def _summary_rows(records: Sequence[Mapping[str, Any]], rule) -> list[dict[str, Any]]:
    """:func:`summarise`'s rows with each reward's kind and its last step's 95 % interval."""
    from mrtpo.report.stats import binary_count, mean_interval, wilson_interval

    rows = summarise(records)["rows"]
    last = step_records(records)[-1] if step_records(records) else {}
    for row in rows:
        name, interval = row["name"], ""
        std = last.get("reward_std" if name == "total reward" else f"rewards/{name}/std")
        if name in rule.binary:
            row["kind"] = "{0,1}"
            n = binary_count(row["last"], std) if isinstance(std, (int, float)) else None
            n = n or rule.n_hint
            if n:
                lo, hi = wilson_interval(min(max(row["last"], 0.0), 1.0), n)
                interval = f"[{lo:.3f}, {hi:.3f}] (Wilson, n={n})"
        elif isinstance(std, (int, float)) and math.isfinite(std) and rule.n_hint:
            lo, hi = mean_interval(row["last"], std, rule.n_hint)
            interval = f"[{lo:.3f}, {hi:.3f}] (n={rule.n_hint})"
        row["interval"] = interval
    return rows


def _missing_note(row: Mapping[str, Any]) -> str:
    return "not in metrics.jsonl" + (f" ({row['why']})" if row.get("why") else "")


def make_report(output_dir: str | os.PathLike, samples: int = 2) -> dict[str, Path]:
    """Write ``curves.png``, ``report.html`` and ``report.md`` into the run folder; return their paths.

    ``samples``: completions of one prompt shown at the first and at the last step.
    """
    out = Path(output_dir)
    records = load_metrics(out / "metrics.jsonl")
    config = _read_config(out)
    task, method, model = config.get("task", "?"), config.get("method", "?"), config.get("model", "?")
    title = f"{task} · {method} · {model}"
    credit_samples = load_credit_samples(out / "credit_samples.jsonl")
    rule = band_rule(records, config, credit_samples)
    curves = plot_run(records, out / "curves.png", title=title, rule=rule, config=config)
    summary = summarise(records)
    rows = _summary_rows(records, rule)
    picked = pick_samples(credit_samples, samples)
    wanted = {str(r.get("example_id")) for shown in picked for r in shown.records}
    examples = _examples(config, wanted)

    lora = f"LoRA r={config['lora_r']}" if config.get("lora_r") else "full fine-tuning"
    info = [
        ("task", task),
        ("method", method),
        ("model", f"{model} ({lora})"),
        ("steps logged", f"{summary['steps']} (last step {summary['last_step']})"),
        (
            "batch",
            (
                f"{config.get('per_device_train_batch_size', '?')} completions/device/step, "
                f"{config.get('num_generations', '?')} per prompt, "
                f"max {config.get('max_completion_length', '?')} tokens"
            ),
        ),
        ("learning rate", str(config.get("learning_rate", "?"))),
    ]
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
    if rule.binary:
        info.append(
            (
                "bands",
                f"{', '.join(sorted(rule.binary))}: {{0,1}} rewards, each step's mean a proportion with "
                "its 95% Wilson interval; other curves: the 95% interval of the mean",
            )
        )
    held_out = eval_rows(records)
    no_eval = "No held-out evaluation in metrics.jsonl (the run had eval_strategy: no, or no eval_size)."
    diag = diagnostic_rows(records, config)

    # --- markdown -------------------------------------------------------------------------
    md = [f"# Training report: {title}", ""]
    md += [f"- **{k}**: {v}" for k, v in info]
    md += ["", "| metric | first step | last step | last step 95% interval | mean |", "|---|---:|---:|---|---:|"]
    md += [
        f"| {r['name']}{' ({0,1})' if r.get('kind') else ''} | {_fmt(r['first'])} | {_fmt(r['last'])} | "
        f"{r.get('interval', '')} | {_fmt(r['mean'])} |"
        for r in rows
    ]
    md += ["", "## Held-out evaluation", ""]
    if held_out:
        md += ["| metric | first eval | last eval |", "|---|---:|---:|"]
        md += [
            f"| {r['name']} | {_fmt(r['first'])} (step {r['first_step']}) | {_fmt(r['last'])} (step {r['last_step']}) |"
            for r in held_out
        ]
    else:
        md.append(no_eval)
    md += ["", "## Diagnostics", "", "| panel | curve | key | first | last | mean |", "|---|---|---|---:|---:|---:|"]
    for r in diag:
        values = (
            f"{_fmt(r['first'])} | {_fmt(r['last'])} | {_fmt(r['mean'])}"
            if not r["missing"]
            else f"{_missing_note(r)} | | "
        )
        md.append(f"| {r['panel']} | {r['label']} | `{r['key']}` | {values} |")
    md += ["", "![training curves](curves.png)", "", "## Sampled completions", ""]
    if not picked:
        md.append("No credit samples were recorded (credit_samples=0, or no step ran).")
    for shown in picked:
        md += [f"### step {shown.step}", ""] + ([f"_{shown.note}_", ""] if shown.note else [])
        for rec in shown.records:
            rewards = ", ".join(f"{n}={'n/a' if r is None else f'{r:g}'}" for n, r in rec.get("rewards", {}).items())
            text = "".join(rec["tokens"]).strip()
            fence = "`" * max(3, _longest_backtick_run(text) + 1)  # a completion may hold ``` itself
            md += [f"**{rec.get('example_id')}** · {rewards}", "", f"{fence}text", text, fence, ""]
            flat = no_spread(rec, records)
            md += [
                f"- `{n}` skipped (no spread)" if n in flat else f"- `{n}` credit peaks on {_top_tokens(rec, n)}"
                for n in rec["weights"]
            ]
            md.append("")
    md += [
        (
            "Files: `config.yaml` (settings), `metrics.jsonl` (per step), `credit_samples.jsonl` (token weights), "
            "`checkpoint-N/` (resumable checkpoints), `report.html` (token-credit view)."
        ),
        "",
    ]
    md_path = out / "report.md"
    md_path.write_text("\n".join(md))

    # --- html -----------------------------------------------------------------------------
    png = base64.b64encode(curves.read_bytes()).decode("ascii")
    esc = html.escape
    parts = [
        f"<!doctype html><html><head><meta charset='utf-8'><title>{esc(title)}</title>",
        f"<style>{CSS}{_TABLE_CSS}</style></head><body>",
        f"<h1>Training report: {esc(title)}</h1><ul>",
    ]
    parts += [f"<li><b>{esc(k)}</b>: {esc(str(v))}</li>" for k, v in info]
    parts.append(
        "</ul><table><tr><th>metric</th><th>first step</th><th>last step</th>"
        "<th>last step 95% interval</th><th>mean</th></tr>"
    )
    parts += [
        f"<tr><td>{esc(r['name'])}{' ({0,1})' if r.get('kind') else ''}</td><td>{_fmt(r['first'])}</td>"
        f"<td>{_fmt(r['last'])}</td><td>{esc(r.get('interval', ''))}</td><td>{_fmt(r['mean'])}</td></tr>"
        for r in rows
    ]
    parts.append("</table><h2>Held-out evaluation</h2>")
    if held_out:
        parts.append("<table><tr><th>metric</th><th>first eval</th><th>last eval</th></tr>")
        parts += [
            f"<tr><td>{esc(r['name'])}</td><td>{_fmt(r['first'])} (step {r['first_step']})</td>"
            f"<td>{_fmt(r['last'])} (step {r['last_step']})</td></tr>"
            for r in held_out
        ]
        parts.append("</table>")
    else:
        parts.append(f"<p class='missing'>{esc(no_eval)}</p>")
    parts.append(
        "<h2>Diagnostics</h2><table><tr><th>panel</th><th>curve</th><th>key</th><th>first</th>"
        "<th>last</th><th>mean</th></tr>"
    )
    for r in diag:
        cells = (
            f"<td>{_fmt(r['first'])}</td><td>{_fmt(r['last'])}</td><td>{_fmt(r['mean'])}</td>"
            if not r["missing"]
            else f"<td colspan='3' class='missing'>{esc(_missing_note(r))}</td>"
        )
        parts.append(
            f"<tr><td>{esc(r['panel'])}</td><td>{esc(r['label'])}</td><td><code>{esc(r['key'])}</code></td>{cells}</tr>"
        )
    parts.append("</table>")
    parts.append(f"<h2>Curves</h2><img alt='training curves' src='data:image/png;base64,{png}'>")
    parts.append(
        "<h2>Where each reward's credit went</h2><p>Sampled completions of the same prompt at the first "
        "and the last step (steps numbered as in the curves). Each row shades the tokens by that reward's "
        "weight (hover for weight and relevance); the last row is the per-token advantage.</p>"
    )
    if not picked:
        parts.append("<p>No credit samples were recorded (credit_samples=0, or no step ran).</p>")
    for i, shown in enumerate(picked):
        parts.append(f"<h3>step {shown.step}</h3>" + (f"<p class='notes'>{esc(shown.note)}</p>" if shown.note else ""))
        parts.append(
            render_cards(
                [sample_view(r, examples.get(str(r.get("example_id"))), no_spread(r, records)) for r in shown.records],
                legend=i == 0,
            )
        )
    parts.append("</body></html>")
    html_path = out / "report.html"
    html_path.write_text("".join(parts))
    return {"html": html_path, "md": md_path, "curves": curves}
