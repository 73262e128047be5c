"""The trainer's credit logs: :class:`CreditLogMixin`, a part of :class:`mrtpo.trainer.MRTPOTrainer`.

Per step: the skip counts, each completion's trained advantage in TRL's completions table, the
per-reward credit metrics over the global batch (:mod:`mrtpo.trainer.metrics`) and a few completions'
token weights in ``credit_samples.jsonl`` for the report's token view.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import Tensor

from mrtpo.credit import CreditBatch, group_normalize
from mrtpo.trainer.metrics import (
    append_samples,
    credit_metric_keys,
    credit_metric_sums,
    predicted_gains,
    signal_metric_keys,
    signal_metric_sums,
)


class CreditLogMixin:
    """The logging half of :class:`mrtpo.trainer.MRTPOTrainer` (it reads the trainer's ``args``,
    ``accelerator``, ``credit_method`` and ``_metrics``)."""

    def _log_skips(self, maps: dict) -> None:
        """Per step: each reward's share of groups with zero spread (from the gathered rewards), and,
        summed over processes, the completions and counterfactual contexts replayed and skipped (the
        completions the update leaves out are logged per micro-batch, by ``_compute_loss``)."""
        k = self._last_rewards.shape[1]
        group_adv = group_normalize(self._last_rewards, self.num_generations).view(-1, self.num_generations, k)
        zero_spread = (group_adv == 0).all(1).double().mean(0)
        for name, share in zip(self.reward_func_names, zero_spread.tolist()):
            self._metrics["train"][f"skip/zero_spread/{name}"].append(share)
        if "skipped" not in maps:  # nothing was replayed (a method without replays)
            return
        counts = self._replay_counts
        local = torch.tensor(list(counts.values()), dtype=torch.float64, device=self.accelerator.device)
        summed = self.accelerator.gather(local).view(-1, len(counts)).sum(0).cpu().tolist()
        for key, value in zip(counts, summed):
            self._metrics["train"][f"skip/{key}"].append(value)

    def _log_trained_advantages(self, advantages: Tensor, mask: Tensor) -> None:
        """Put each completion's trained advantage (the mean over its tokens, ``(B, T)`` → ``(B,)``,
        gathered over processes) in place of TRL's in the completions table TRL logs."""
        local = (advantages * mask).sum(1) / mask.sum(1).clamp_min(1)
        trained = self.accelerator.gather(local.to(self.accelerator.device)).cpu().tolist()
        logged = self._logs["advantages"]
        for _ in range(min(len(trained), len(logged))):
            logged.pop()
        logged.extend(trained)

    def _log_credit(self, inputs, out, batch: CreditBatch, maps: dict, advantages: Tensor) -> None:
        """Per-reward credit metrics over the global batch (:func:`mrtpo.trainer.metrics.credit_metric_sums`:
        each rank sums its completions, one gather of the ``(sum, count)`` pairs makes global means),
        and a few completions' token weights for the token-credit view."""
        weights = self.credit_method.weights(batch, self.credit_config)
        lengths = batch.mask.sum(-1).long().tolist()
        keys = credit_metric_keys(self.reward_func_names)
        local = credit_metric_sums(
            weights,
            lengths,
            self.reward_func_names,
            skipped=maps.get("skipped"),
            relevance=maps.get("relevance"),
            has_evidence=maps.get("has_evidence"),
        )
        known = maps.get("known_positions")
        relevant = known if known is not None else self._known_positions(inputs, out, checked_spans=False)
        if relevant is not None:  # lift, E[w²] and predicted G on the tokens each reward is known to read
            relevant = relevant.bool()
            keys = keys + signal_metric_keys(self.reward_func_names)
            local = torch.cat(
                [
                    local,
                    signal_metric_sums(weights, relevant, lengths, self.reward_func_names, skipped=maps.get("skipped")),
                ]
            )
        summed = self.accelerator.gather(local.to(self.accelerator.device)).view(-1, len(keys), 2).sum(0).cpu()
        means = {key: total / count for key, (total, count) in zip(keys, summed.tolist()) if count > 0}
        means.update(predicted_gains(means, self.reward_func_names))
        for key, value in means.items():
            self._metrics["train"][key].append(value)
        if self.args.credit_samples and self.accelerator.is_main_process:
            self._write_credit_samples(inputs, out, batch, weights, advantages, maps)

    def _write_credit_samples(self, inputs, out, batch, weights, advantages, maps) -> None:
        """Append this step's first ``credit_samples`` completions to ``credit_samples.jsonl``, each with
        the rewards that had no spread in its group (the report says "skipped" rather than "uniform")."""
        g = self.num_generations
        flat = (group_normalize(self._last_rewards, g).view(-1, g, self._last_rewards.shape[1]) == 0).all(1)
        append_samples(
            Path(self.args.output_dir) / "credit_samples.jsonl",
            inputs[: self.args.credit_samples],
            out["completion_ids"],
            batch.mask,
            batch.local_rewards(),
            weights,
            advantages,
            maps.get("relevance"),
            step=self.state.global_step,
            method=self.args.method,
            names=self.reward_func_names,
            decode=self.processing_class.decode,
            no_spread=flat.repeat_interleave(g, 0)[batch.rows or slice(None)],
        )
