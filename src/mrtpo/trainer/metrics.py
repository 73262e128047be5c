"""What the trainer writes down: every log line to ``metrics.jsonl`` (line-atomic appends; torn last
lines dropped on resume), the process's peak memory, and the per-reward credit metrics and
token-weight samples of a generation batch.

Pure functions of tensors (no trainer inside); :class:`mrtpo.trainer.MRTPOTrainer` gathers the
per-process sums they return over processes and logs them.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor
from transformers import TrainerCallback

from mrtpo.credit.signal import lift_and_mean_square, predicted_gain


class MetricsJSONL(TrainerCallback):
    """Writes every log line as JSON to ``<output_dir>/metrics.jsonl`` (appends across resumes).

    Each line is one ``write`` to a file opened for appending, so a crash leaves at most a torn last
    line, which the next resume drops. Non-finite numbers (NaN, ±inf) are written as ``null``: the
    file stays JSON. On resume, lines logged after the checkpoint's step (by the interrupted run)
    are dropped, so the file reads as one continuous run.

    With ``detail=False`` the credit metrics beyond :data:`SUMMARY_CREDIT` (deciles, Gini, entropy,
    overlaps: 15 keys a reward) are then taken out of the log line the later callbacks see (console,
    TensorBoard, wandb, trackio); ``metrics.jsonl`` and ``trainer.state.log_history`` keep them all.
    The trainer puts this callback first, so it sees every line whole.
    """

    def __init__(self, path: Path, detail: bool = True):
        self.path = Path(path)
        self.detail = detail

    def on_train_begin(self, args, state, control, **kwargs):
        if state.is_world_process_zero:
            trim_jsonl(self.path, lambda record: record.get("step", 0) <= state.global_step)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not state.is_world_process_zero or not logs:
            return
        record = {"step": state.global_step, "epoch": state.epoch, "time": time.time()}
        record.update({k: v for k, v in logs.items() if isinstance(v, (int, float, str)) or v is None})
        self.path.parent.mkdir(parents=True, exist_ok=True)
        append_jsonl(self.path, record)
        if not self.detail:
            for key in [k for k in logs if is_credit_detail(k)]:
                del logs[key]


#: The credit metrics a reward keeps on the console and in trackers (``log_credit_detail=false``).
SUMMARY_CREDIT = ("relevance_mean", "top10_share")


def is_credit_detail(key: str) -> bool:
    """Whether log key ``key`` is a credit metric beyond :data:`SUMMARY_CREDIT` (``credit/<reward>/<metric>``,
    ``credit/top10_overlap/<a>~<b>``)."""
    parts = key.split("/")
    return parts[0] == "credit" and (parts[1] == "top10_overlap" or parts[-1] not in SUMMARY_CREDIT)


def json_line(record: dict[str, Any]) -> str:
    """``record`` as one line of strict JSON: NaN and ±inf become ``null``."""

    def finite(v):
        return None if isinstance(v, float) and not math.isfinite(v) else v

    return json.dumps({k: finite(v) for k, v in record.items()}, allow_nan=False) + "\n"


def append_jsonl(path: Path, record: dict[str, Any]) -> None:
    """Append ``record`` as one line in a single ``write`` (a crash cannot interleave half-lines)."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, json_line(record).encode())
    finally:
        os.close(fd)


def trim_jsonl(path: Path, keep: Callable[[dict[str, Any]], bool]) -> bool:
    """Keep the lines of a JSON-lines file whose record passes ``keep``; True if a torn last line (an
    interrupted write) was dropped. The file is replaced atomically, and only when something changes.
    A line that is not JSON anywhere but at the end is damage, not a torn write: ValueError naming it."""
    if not path.exists():
        return False
    text = path.read_text()
    lines = [line for line in text.splitlines() if line.strip()]
    records, torn = [], False
    for i, line in enumerate(lines):
        try:
            records.append((line, json.loads(line)))
        except ValueError:
            if i < len(lines) - 1:
                raise ValueError(f"{path} line {i + 1} is not JSON: {line[:80]!r}") from None
            torn = True
    kept = "".join(line + "\n" for line, record in records if keep(record))
    if kept != text:
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(kept)
        os.replace(tmp, path)
    return torn


def peak_memory_gib(device: torch.device) -> float:
    """Peak memory of this process so far, GiB: the accelerator's peak allocation on CUDA, the peak
    resident set size (``ru_maxrss``, KiB on Linux) elsewhere."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


#: Per reward: the share of its relevance mass in each tenth of the response (by position).
DECILE_KEYS = tuple(f"relevance_decile{d}" for d in range(10))


def credit_metric_keys(names: Sequence[str]) -> list[str]:
    """The credit metric keys for rewards ``names``, in the order :func:`credit_metric_sums` fills them."""
    keys = [
        f"credit/{n}/{m}"
        for n in names
        for m in ("top10_share", "weight_entropy", "relevance_mean", "gini", "half_weight_share", *DECILE_KEYS)
    ]
    keys += [f"credit/top10_overlap/{names[a]}~{names[c]}" for a in range(len(names)) for c in range(a + 1, len(names))]
    return keys


def credit_metric_sums(
    weights: Tensor,
    lengths: Sequence[int],
    names: Sequence[str],
    *,
    skipped: Tensor | None = None,
    relevance: Tensor | None = None,
    has_evidence: Tensor | None = None,
) -> Tensor:
    """``(len(keys), 2)`` float64 ``(sum, count)`` per key of :func:`credit_metric_keys`, over this
    process's completions; summing over processes and dividing gives the global means.

    ``weights`` ``(B, K, T)`` token weights, ``lengths`` the ``B`` completion lengths; ``skipped``
    ``(B, K)`` bool marks (completion, reward) pairs whose map was not computed (a zero
    coefficient): their uniform weights say nothing about where credit went, so they are left out.
    ``relevance`` ``(B, K, T)`` with ``has_evidence`` ``(B, K)`` adds each reward's mean relevance.
    Per completion and reward: the share of weight on its top 10 % of tokens, the normalised
    entropy of its weights (1 = uniform), their Gini coefficient (0 = uniform, (n − 1)/n = one
    token), the smallest share of tokens carrying half the weight (about 0.5 = uniform), and, where
    a map was computed, the share of its relevance in each tenth of the response; for each pair of
    rewards the Jaccard overlap of their top-10 % token sets.
    """
    keys = credit_metric_keys(names)
    index = {key: i for i, key in enumerate(keys)}
    sums = torch.zeros(len(keys), 2, dtype=torch.float64)
    b, k, t = weights.shape
    n = torch.as_tensor(list(lengths), dtype=torch.long)
    valid = torch.arange(t) < n.view(-1, 1, 1)  # (B, 1, T)
    counted = (n > 0).view(-1, 1).expand(b, k)  # (B, K) pairs that contribute
    if skipped is not None:
        counted = counted & ~skipped.bool()
    w = weights.detach().double().masked_fill(~valid, 0.0)
    total = w.sum(-1)  # (B, K)
    # top 10 % of each response's tokens (at least one), ties broken by position as a stable sort does
    top = torch.ceil(0.1 * n.double()).clamp_min(1).long().view(-1, 1, 1)  # (B, 1, 1)
    order = torch.sort(w.masked_fill(~valid, -math.inf), dim=-1, descending=True, stable=True).indices
    in_top = torch.zeros(b, k, t, dtype=torch.bool).scatter(-1, order, (torch.arange(t) < top).expand(b, k, t))
    share = torch.where(total > 0, (w * in_top).sum(-1) / total.clamp_min(1e-300), 0.0)
    uniform = valid.double() / n.clamp_min(1).view(-1, 1, 1)
    p = torch.where((total > 0).unsqueeze(-1), w / total.clamp_min(1e-300).unsqueeze(-1), uniform)
    entropy = -(p * p.clamp_min(1e-12).log()).masked_fill(~valid, 0.0).sum(-1)
    entropy = torch.where(n.view(-1, 1) > 1, entropy / n.double().clamp_min(2).log().view(-1, 1), 1.0)

    ascending = w.masked_fill(~valid, -math.inf).sort(dim=-1).values.clamp_min(0)  # the padding first, as 0
    rank = torch.arange(1, t + 1) - (t - n).view(-1, 1, 1)  # 1..n on a response's own tokens
    coefficient = torch.where(rank >= 1, 2 * rank - n.view(-1, 1, 1) - 1, 0).double()
    gini = (coefficient * ascending).sum(-1) / (n.view(-1, 1).double().clamp_min(1) * total.clamp_min(1e-300))
    descending = w.gather(-1, order).cumsum(-1)
    carrying = ((descending < 0.5 * total.unsqueeze(-1)) & valid).sum(-1) + 1
    half_share = carrying.double() / n.view(-1, 1).clamp_min(1)
    decile = (torch.arange(t) * 10 // n.clamp_min(1).view(-1, 1)).clamp_max(9)  # (B, T)
    in_decile = torch.nn.functional.one_hot(decile, 10).double() * valid[:, 0].unsqueeze(-1)  # (B, T, 10)

    def add(key: str, values: Tensor, where: Tensor) -> None:
        sums[index[key], 0] += values[where].sum()
        sums[index[key], 1] += where.sum()

    for i, name in enumerate(names):
        add(f"credit/{name}/top10_share", share[:, i], counted[:, i])
        add(f"credit/{name}/weight_entropy", entropy[:, i], counted[:, i])
        positive = counted[:, i] & (total[:, i] > 0)
        add(f"credit/{name}/gini", gini[:, i], positive)
        add(f"credit/{name}/half_weight_share", half_share[:, i], positive)
        if relevance is not None and has_evidence is not None:
            r = relevance[:, i].detach().double().masked_fill(~valid[:, 0], 0.0)  # (B, T)
            mapped = counted[:, i] & has_evidence[:, i].bool()
            add(f"credit/{name}/relevance_mean", r.sum(-1) / n.clamp_min(1), mapped)
            mass = torch.einsum("bt,btd->bd", r, in_decile)  # (B, 10)
            mass_share = mass / mass.sum(-1, keepdim=True).clamp_min(1e-300)
            for d, key in enumerate(DECILE_KEYS):
                add(f"credit/{name}/{key}", mass_share[:, d], mapped & (r.sum(-1) > 0))
    for a in range(k):
        for c in range(a + 1, k):
            both = counted[:, a] & counted[:, c]
            inter = (in_top[:, a] & in_top[:, c]).sum(-1).double()
            union = (in_top[:, a] | in_top[:, c]).sum(-1).double()
            add(f"credit/top10_overlap/{names[a]}~{names[c]}", inter / union.clamp_min(1), both)
    return sums


def signal_metric_keys(names: Sequence[str]) -> list[str]:
    """Per reward, the lift ``ℓ`` and ``E[w²]`` on its known relevant tokens (:func:`signal_metric_sums`),
    then ``predicted_g`` (:func:`predicted_gains`, from the global means)."""
    return [f"credit/{n}/{m}" for n in names for m in ("lift", "mean_w2")]


def signal_metric_sums(
    weights: Tensor, relevant: Tensor, lengths: Sequence[int], names: Sequence[str], *, skipped: Tensor | None = None
) -> Tensor:
    """``(2K, 2)`` float64 ``(sum, count)`` of each reward's ``ℓ`` and ``E[w²]`` over this process's
    completions (:func:`mrtpo.credit.signal.lift_and_mean_square`), in :func:`signal_metric_keys` order.

    ``weights`` ``(B, K, T)``; ``relevant`` ``(B, K, T)`` bool, the tokens each reward is known to read;
    ``lengths`` the ``B`` completion lengths; ``skipped`` ``(B, K)``: pairs whose map was not computed
    (a zero coefficient: their weights cannot act), left out. A pair counts where its lift is defined.
    """
    sums = torch.zeros(2 * len(names), 2, dtype=torch.float64)
    for b, n in enumerate(lengths):
        for i in range(len(names)):
            if skipped is not None and bool(skipped[b, i]):
                continue
            got = lift_and_mean_square(weights[b, i, :n].detach(), relevant[b, i, :n], torch.ones(n))
            if got is not None:
                sums[2 * i : 2 * i + 2, 0] += torch.tensor(got, dtype=torch.float64)
                sums[2 * i : 2 * i + 2, 1] += 1
    return sums


def predicted_gains(means: dict[str, float], names: Sequence[str]) -> dict[str, float]:
    """``credit/<reward>/predicted_g = ℓ² / E[w²]`` from the means of :func:`signal_metric_keys` (where both are)."""
    out = {}
    for n in names:
        lift, w2 = means.get(f"credit/{n}/lift"), means.get(f"credit/{n}/mean_w2")
        if lift is not None and w2 is not None:
            out[f"credit/{n}/predicted_g"] = predicted_gain(lift, w2)
    return out


def credit_sample(
    *,
    step: int,
    example_id: str,
    method: str,
    names: Sequence[str],
    rewards: Sequence[float],
    token_ids: Sequence[int],
    tokens: Sequence[str],
    weights: Tensor,
    advantage: Tensor,
    relevance: Tensor | None = None,
    no_spread: Sequence[bool] | None = None,
) -> dict[str, Any]:
    """One line of ``credit_samples.jsonl`` (the token-credit view): a completion's tokens with each
    reward's weights ``(K, n)``, its advantage ``(n,)`` and, for ``mrtpo``, its relevance ``(K, n)``;
    a NaN reward (not scored) is written as ``null``. ``no_spread`` ``(K,)``: the rewards with no
    spread in the completion's group (advantage 0: they give it no credit), listed by name."""
    record = {
        "step": step,
        "example_id": example_id,
        "method": method,
        "rewards": {name: None if math.isnan(r) else r for name, r in zip(names, rewards)},
        "token_ids": list(token_ids),
        "tokens": list(tokens),
        "weights": {name: weights[i].tolist() for i, name in enumerate(names)},
        "advantage": advantage.tolist(),
    }
    if relevance is not None:
        record["relevance"] = {name: relevance[i].tolist() for i, name in enumerate(names)}
    if no_spread is not None:
        record["no_spread"] = [name for name, flat in zip(names, no_spread) if flat]
    return record


def append_samples(
    path: Path,
    rows: Sequence[dict],
    completion_ids: Tensor,
    mask: Tensor,
    rewards: Tensor,
    weights: Tensor,
    advantages: Tensor,
    relevance: Tensor | None,
    *,
    step: int,
    method: str,
    names: Sequence[str],
    decode: Callable[[list[int]], str],
    no_spread: Tensor | None = None,
) -> None:
    """Append a :func:`credit_sample` line to ``path`` for each of the batch's first ``len(rows)``
    completions (``rows``: their input rows; ``decode``: one token id list to its text; ``no_spread``
    ``(B, K)`` bool: the rewards without spread in each completion's group)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        for j, row in enumerate(rows):
            n = int(mask[j].sum())
            ids = completion_ids[j, :n].tolist()
            record = credit_sample(
                step=step,
                example_id=str(row.get("example_id", "")),
                method=method,
                names=names,
                rewards=rewards[j].tolist(),
                token_ids=ids,
                tokens=[decode([i]) for i in ids],
                weights=weights[j, :, :n],
                advantage=advantages[j, :n],
                relevance=relevance[j, :, :n] if relevance is not None else None,
                no_spread=no_spread[j].tolist() if no_spread is not None else None,
            )
            f.write(json.dumps(record) + "\n")


__all__ = [
    "MetricsJSONL",
    "append_jsonl",
    "append_samples",
    "credit_metric_keys",
    "credit_metric_sums",
    "credit_sample",
    "json_line",
    "peak_memory_gib",
    "predicted_gains",
    "signal_metric_keys",
    "signal_metric_sums",
    "trim_jsonl",
    "DECILE_KEYS",
]
