"""Which sampled completions the report shows, and how each becomes a token-credit card.

``credit_samples.jsonl`` holds the first ``credit_samples`` completions of each generation step,
tagged with the trainer's global step *before* that step's update: a sample tagged ``s`` was
scored and trained on in the update that ``metrics.jsonl`` logs as step ``s + 1`` (its rewards are
in that line's means). The report shows samples under the curves' numbering (:func:`metric_step`).

To compare like with like it shows the same prompt at the first step and at the latest step that
sampled it again (the last step when it did), saying so when the last step sampled only other
prompts or when no prompt came back.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mrtpo.report.records import Records, json_lines, step_records
from mrtpo.report.token_view import CompletionView, CreditRow

__all__ = ["Shown", "load_credit_samples", "metric_step", "no_spread", "pick_samples", "sample_view"]


def load_credit_samples(path: str | os.PathLike) -> list[dict[str, Any]]:
    """The records of a ``credit_samples.jsonl`` ([] if there is none)."""
    path = Path(path)
    if not path.is_file():
        return []
    return json_lines(path)


def metric_step(record: Mapping[str, Any]) -> int:
    """The step under which ``metrics.jsonl`` (and the curves) log a credit sample's update."""
    return int(record["step"]) + 1


@dataclass
class Shown:
    """Samples shown under one heading: the step (curves' numbering), the records, and a note."""

    step: int
    records: list[Mapping[str, Any]]
    note: str = ""


def _by_step(samples: Sequence[Mapping[str, Any]]) -> dict[int, list[Mapping[str, Any]]]:
    out: dict[int, list[Mapping[str, Any]]] = {}
    for s in samples:
        out.setdefault(metric_step(s), []).append(s)
    return dict(sorted(out.items()))


def _ids(records: Sequence[Mapping[str, Any]]) -> list[str]:
    seen: list[str] = []
    for r in records:
        if str(r.get("example_id")) not in seen:
            seen.append(str(r.get("example_id")))
    return seen


def pick_samples(samples: Sequence[Mapping[str, Any]], per_step: int) -> list[Shown]:
    """Up to ``per_step`` completions of one prompt at the first step and at the latest step that
    sampled that prompt again (the prompt chosen to make that step as late as possible), plus the
    last step's own samples when that step is not the last. Steps are the curves' (:func:`metric_step`)."""
    if not samples or per_step <= 0:
        return []
    steps = _by_step(samples)
    order = list(steps)
    first, last = order[0], order[-1]
    if first == last:
        return [Shown(first, list(steps[first][:per_step]))]
    best: tuple[int, str] | None = None  # (later step, prompt id)
    for later in reversed(order[1:]):
        common = [i for i in _ids(steps[first]) if i in _ids(steps[later])]
        if common:
            best = (later, common[0])
            break
    if best is None:
        note = (
            f"no prompt sampled at step {first} was sampled again: the last step shows other prompts "
            "(the samples are the first completions of each step's batch)"
        )
        return [Shown(first, list(steps[first][:per_step])), Shown(last, list(steps[last][:per_step]), note)]
    later, prompt = best

    def of(step: int) -> list[Mapping[str, Any]]:
        return [r for r in steps[step] if str(r.get("example_id")) == prompt][:per_step]

    if later == last:
        return [
            Shown(first, of(first), f"prompt {prompt}, shown again at the last step"),
            Shown(last, of(last), f"the same prompt ({prompt}) as at step {first}"),
        ]
    return [
        Shown(first, of(first), f"prompt {prompt}, shown again at step {later}"),
        Shown(
            later, of(later), f"the same prompt ({prompt}) as at step {first}: the latest step that sampled it again"
        ),
        Shown(last, list(steps[last][:per_step]), "the last step: other prompts"),
    ]


def no_spread(record: Mapping[str, Any], records: Records) -> set[str]:
    """The rewards that had no spread in the sample's group: the record's own ``no_spread`` list, or
    (older runs) those whose share of zero-spread groups was 1 at that step (every group flat)."""
    if "no_spread" in record:
        return set(record["no_spread"])
    step = metric_step(record)
    line = next((r for r in step_records(records) if int(r.get("step", -1)) == step), {})
    return {name for name in record.get("weights", {}) if line.get(f"skip/zero_spread/{name}") == 1.0}


def _last_user(example) -> str:
    for m in reversed(example.messages):
        if m.get("role") == "user":
            return str(m.get("content", ""))
    return ""


def sample_view(
    record: Mapping[str, Any], example_task: tuple | None = None, skipped: set[str] | frozenset[str] = frozenset()
) -> CompletionView:
    """A credit-samples record as a :class:`CompletionView` (rows in the record's reward order; the
    rewards in ``skipped`` marked as without spread), titled with the curves' step."""
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
        rows.append(CreditRow(name, rewards.get(name), weights, relevance.get(name), evidence, name in skipped))
    reward_str = ", ".join(f"{n}={'n/a' if r is None else f'{r:g}'}" for n, r in rewards.items())
    title = f"step {metric_step(record)} · {record.get('method', '?')} · {reward_str}"
    return CompletionView(title, record["tokens"], rows, record.get("advantage"), notes)
