"""``mrtpo report --compare RUN RUN…``: several runs (e.g. GDPO and MRTPO) on one figure.

Reads each run folder's ``config.yaml`` and ``metrics.jsonl`` and writes a PNG (each reward, total
reward, held-out reward, length, loss, grad norm and time per step, one colour per run, the legend
naming each run's method and folder: :func:`mrtpo.report.curves.plot_runs`) and an HTML page
holding it with a table of the runs: settings, and each reward's last-step mean with its 95 %
interval (:mod:`mrtpo.report.stats`).
"""

from __future__ import annotations

import base64
import html
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from mrtpo.report.curves import BandRule, band_rule, load_metrics, plot_runs, reward_names, step_records
from mrtpo.report.held_out import eval_series
from mrtpo.report.samples import load_credit_samples
from mrtpo.report.stats import binary_count, mean_interval, wilson_interval

__all__ = ["compare_runs", "output_paths", "run_labels"]


def _config(run: Path) -> dict[str, Any]:
    import yaml

    try:
        data = yaml.safe_load((run / "config.yaml").read_text())
    except (OSError, yaml.YAMLError):
        return {}
    return data if isinstance(data, dict) else {}


def run_labels(runs: Sequence[Path], configs: Sequence[dict[str, Any]]) -> list[str]:
    """``"<method> · <folder name>"`` per run (``?`` for a run without a method), made unique."""
    labels: list[str] = []
    for run, config in zip(runs, configs):
        label = f"{config.get('method', '?')} · {run.resolve().name}"
        k, base = 2, label
        while label in labels:
            label, k = f"{base} ({k})", k + 1
        labels.append(label)
    return labels


def output_paths(output: str | os.PathLike) -> tuple[Path, Path]:
    """``(html, png)`` for ``--output``: ``x.png`` → ``x.html`` beside it, anything else → ``x.html``, ``x.png``."""
    output = Path(output)
    stem = output.with_suffix("") if output.suffix.lower() in (".html", ".htm", ".png") else output
    return stem.with_suffix(".html"), stem.with_suffix(".png")


def _last_cell(records, name: str, rule: BandRule) -> str:
    """A reward's last-step mean with its 95 % interval, as text ("not logged" if absent)."""
    steps = [r for r in step_records(records) if isinstance(r.get(f"rewards/{name}/mean"), (int, float))]
    if not steps:
        return "not logged"
    last = steps[-1]
    m, s = float(last[f"rewards/{name}/mean"]), last.get(f"rewards/{name}/std")
    if name in rule.binary:
        n = (binary_count(m, s) if isinstance(s, (int, float)) else None) or rule.n_hint
        if n:
            lo, hi = wilson_interval(min(max(m, 0.0), 1.0), n)
            return f"{m:.3f} [{lo:.3f}, {hi:.3f}] (step {last['step']}, Wilson, n={n})"
    elif isinstance(s, (int, float)) and rule.n_hint:
        lo, hi = mean_interval(m, s, rule.n_hint)
        return f"{m:.3f} [{lo:.3f}, {hi:.3f}] (step {last['step']}, n={rule.n_hint})"
    return f"{m:.3f} (step {last['step']})"


def compare_runs(runs: Sequence[str | os.PathLike], output: str | os.PathLike = "compare.html") -> dict[str, Path]:
    """Draw ``runs`` (run folders) on one figure; write it and its HTML page; return their paths."""
    if len(runs) < 2:
        raise ValueError(f"--compare needs at least two run folders, got {len(runs)}")
    folders = [Path(r) for r in runs]
    configs = [_config(f) for f in folders]
    labels = run_labels(folders, configs)
    records = {label: load_metrics(f / "metrics.jsonl") for label, f in zip(labels, folders)}
    rules = {
        label: band_rule(records[label], config, load_credit_samples(f / "credit_samples.jsonl"))
        for label, f, config in zip(labels, folders, configs)
    }
    tasks = sorted({str(c.get("task", "?")) for c in configs})
    title = f"{' / '.join(tasks)}: " + " vs ".join(labels)
    html_path, png_path = output_paths(output)
    plot_runs(records, png_path, title=title, rules=rules)
    names: list[str] = []
    for recs in records.values():
        names += [n for n in reward_names(recs) if n not in names]
    esc = html.escape
    head = "".join(
        f"<th>{esc(h)}</th>"
        for h in ["run", "folder", "task", "model", "steps", *names, "held-out total reward (last eval)"]
    )
    rows = []
    for label, folder, config in zip(labels, folders, configs):
        recs, rule = records[label], rules[label]
        steps, values = eval_series(recs, "eval_reward")
        held = f"{values[-1]:.3f} (step {steps[-1]})" if steps else "no held-out evaluation"
        cells = [
            label,
            str(folder),
            str(config.get("task", "?")),
            str(config.get("model", "?")),
            str(len(step_records(recs))),
            *(_last_cell(recs, n, rule) for n in names),
            held,
        ]
        rows.append("<tr>" + "".join(f"<td>{esc(c)}</td>" for c in cells) + "</tr>")
    png = base64.b64encode(png_path.read_bytes()).decode("ascii")
    page = (
        f"<!doctype html><html><head><meta charset='utf-8'><title>{esc(title)}</title><style>"
        "body{font-family:system-ui,sans-serif;margin:24px;color:#222}table{border-collapse:collapse}"
        "td,th{border:1px solid #ddd;padding:3px 10px;text-align:left;font-size:13px}img{max-width:100%}"
        f"</style></head><body><h1>{esc(title)}</h1><p>Each reward's last logged step: mean [95% interval]; "
        "{0,1} rewards are proportions with Wilson intervals. Curves: one colour per run.</p>"
        f"<table><tr>{head}</tr>{''.join(rows)}</table>"
        f"<img alt='runs compared' src='data:image/png;base64,{png}'></body></html>"
    )
    html_path.parent.mkdir(parents=True, exist_ok=True)
    html_path.write_text(page)
    return {"html": html_path, "png": png_path}
