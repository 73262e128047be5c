"""``MRTPOConfig`` / ``MRTPOTrainer``: TRL's GRPO with reward-specific token-level credit.

A thin subclass pair of TRL's ``GRPOConfig`` / ``GRPOTrainer`` (TRL pinned to 1.16.*). What
differs from GRPOTrainer, and nothing else:

1. ``_calculate_rewards`` also keeps the gathered ``(N, K)`` reward matrix (TRL's own code scores).
2. ``_generate_and_score_completions`` runs TRL's generation and scoring unchanged, then replaces
   TRL's ``(B,)`` advantages by the ``(B, T)`` advantages of ``args.method`` (a name from
   :mod:`mrtpo.credit`'s registry), running exactly the evidence replays that method needs.
   Group and batch statistics come from the gathered global rewards; each process replays only
   its own completions (a group's shared prompt encoded once per context, its KV cache reused),
   then pads its forward-call count to the global maximum so all ranks stay in lockstep.
   Work that cannot move the policy is skipped, decided per reward: a reward's counterfactual is
   not replayed for a group where its coefficient ``ω_k Â[j,k]`` is 0 for every member (zero
   spread, fewer than two valid values), and a group with nothing left to replay is not replayed.
   Under ``dapo`` / ``cispo`` without KL or entropy terms the update also leaves out completions
   whose advantage is 0 at every token (their loss and gradient are 0; the normaliser is global),
   all processes running as many rows (:mod:`mrtpo.trainer.update_rows`); TRL's update metrics (entropy,
   clip ratios) then cover the rows it ran.
3. TRL's off-policy sequence mask (``off_policy_mask_threshold``) keeps or drops a sequence by the
   sign of its *sequence* advantage (carried next to the ``(B, T)`` advantages), never token by
   token; TRL's completions table logs each completion's trained advantage (its token mean).
4. The update's forward (``_get_per_token_logps_and_entropies``) runs each distinct prompt of a
   micro-batch once and its completions on the prompt's KV cache (:mod:`mrtpo.shared_prompt`): the
   same log-probabilities, loss and gradient as TRL's forward of every row whole, for ~84 % fewer
   tokens on a 330-token prompt with 8 × 64-token completions (``shared_prompt_update``).
5. ``_generate`` / ``training_step`` are wrapped only to time generation, scoring, replay and
   update, and a callback writes every log line to ``<output_dir>/metrics.jsonl``
   (:mod:`mrtpo.trainer.metrics`, with the per-reward credit metrics).
6. The model card names MRTPO, its paper and the base model (:mod:`mrtpo.trainer.card`).

The config and the keys it shares with the trainer live in :mod:`mrtpo.trainer.config`.

TRL's loss is untouched: it already accepts ``(B, T)`` advantages. Loss types that assume one
advantage per sequence are rejected by the config, and so are TRL's reward-aggregation settings
that the method decides instead (``multi_objective_aggregation``; ``scale_rewards`` other than ``group``,
except under ``method="grpo"``, whose advantages are then TRL's own, scaled as asked).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import torch
from torch import Tensor
from trl import GRPOTrainer

from mrtpo.credit import CreditBatch, CreditConfig, get_method, reward_coefficients
from mrtpo.fast_decode import fast_sampling
from mrtpo.known_positions import knows_positions
from mrtpo.packing import can_pack, packed_logps
from mrtpo.replay_plan import (
    CREDIT_FIELDS,
    context_rule,
    needs_evidence,
)
from mrtpo.reward_calls import check_reward_calls
from mrtpo.rewards import VerifierReward, checked_reward_funcs, declares_evidence
from mrtpo.run_lock import lock_run_folder
from mrtpo.shared_prompt import can_share_prompts, shared_prefill, shared_prompt_logps
from mrtpo.trainer.card import ModelCardMixin
from mrtpo.trainer.config import (
    GLOBAL_NORMALISER_LOSSES,
    SEQUENCE_ADVANTAGES_KEY,
    SEQUENCE_LEVEL_LOSSES,
    TRL_AGGREGATION,
    ZERO_ADVANTAGE_KEY,
    MRTPOConfig,
)
from mrtpo.trainer.credit_log import CreditLogMixin
from mrtpo.trainer.metrics import (
    MetricsJSONL,
    peak_memory_gib,
)
from mrtpo.trainer.replay_step import ReplayStepMixin
from mrtpo.trainer.update_rows import rows_that_move
from mrtpo.trl_compat import ensure_fused_head_runs
from mrtpo.validation import check_train_dataset


class MRTPOTrainer(ModelCardMixin, ReplayStepMixin, CreditLogMixin, GRPOTrainer):
    """GRPOTrainer whose advantages are token-level and reward-specific (see the module docstring).

    ``reward_funcs`` are ordinary TRL reward functions; those that declare evidence (the
    :func:`mrtpo.rewards.evidence` decorator, or :class:`mrtpo.rewards.VerifierReward`) get
    relevance-weighted credit under ``method="mrtpo"``; the others get uniform weights.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        check_reward_calls(GRPOTrainer.__init__, self, *args, **kwargs)  # before GRPOTrainer loads a model by name
        check_train_dataset(kwargs.get("train_dataset", args[3] if len(args) > 3 else None))
        ensure_fused_head_runs()  # TRL 1.15 without Triton: its fused head's kernel in PyTorch
        super().__init__(*args, **kwargs)
        if not isinstance(self.args, MRTPOConfig):
            raise TypeError("MRTPOTrainer needs an MRTPOConfig (args=MRTPOConfig(...))")
        if self.environment_factories is not None:
            raise NotImplementedError("MRTPOTrainer does not support environment rollouts (environment_factory)")
        self.credit_method = get_method(self.args.method)
        # TRL computes its own (B,) advantages too (kept for comparison): the method's sequence level.
        self.multi_objective_aggregation = TRL_AGGREGATION[self.credit_method.sequence]
        self._loss_sequence_advantages: Tensor | None = None
        self.credit_config = CreditConfig(
            lam=self.args.lam,
            w_max=self.args.w_max,
            batch_norm=self.args.credit_batch_norm,
            reward_weights=self.reward_weights.tolist(),
            reward_lam=self.args.reward_lam,
            weighting=self.args.weighting,
            rank_power=self.args.rank_power,
            weight_mean=self.args.weight_mean,
            oracle_shuffle=self.args.oracle_shuffle,
        )
        if self.args.reward_lam is not None and len(self.args.reward_lam) != len(self.reward_funcs):
            raise ValueError(
                f"reward_lam has {len(self.args.reward_lam)} entries for {len(self.reward_funcs)} "
                f"reward functions ({', '.join(self.reward_func_names)}): give one per reward, in order"
            )
        self._with_evidence = [declares_evidence(f) for f in self.reward_funcs]
        if needs_evidence(self.credit_method.needs):
            if not any(self._with_evidence):
                raise ValueError(
                    f"method {self.args.method!r} needs rewards with evidence, but none of {self.reward_func_names} "
                    "declares any: decorate them with @mrtpo.evidence(...) or wrap task verifiers in VerifierReward"
                )
            self._check_evidence(self.train_dataset)
        if context_rule(self.credit_method.needs).known and not any(
            isinstance(f, VerifierReward) and knows_positions(f.verifier, f.spans_of) for f in self.reward_funcs
        ):
            raise ValueError(
                f"method {self.args.method!r} weights the positions a task knows each reward "
                f"reads, but none of {self.reward_func_names} knows them: use a gym task or one "
                "with checked_spans"
            )
        self._last_rewards: Tensor | None = None
        self._update_skips_zero_rows = self._skips_zero_rows()
        self._timing = {"generation": 0.0, "scoring": 0.0, "replay": 0.0}
        # first: it writes each log line whole, then leaves the trackers the summary (log_credit_detail)
        self.callback_handler.callbacks.insert(
            0, MetricsJSONL(Path(self.args.output_dir) / "metrics.jsonl", detail=self.args.log_credit_detail)
        )

    def _skips_zero_rows(self) -> bool:
        """Whether the update may leave out completions whose advantage is 0 at every token
        (``skip_zero_advantage``, default true).

        Exact only when such a row adds exactly nothing to the loss and its gradient: its policy term
        is ``−min(r·0, clip(r)·0) = 0`` under every token-level loss, but a KL term (``beta``), an
        entropy bonus, the entropy quantile mask (a quantile over the micro-batch's tokens) or a
        router aux loss depend on the rows present, and so does the normaliser of every loss type but
        :data:`GLOBAL_NORMALISER_LOSSES`.
        """
        return (
            self.args.skip_zero_advantage
            and self.loss_type in GLOBAL_NORMALISER_LOSSES
            and self.beta == 0.0
            and not self._entropy_bonus_enabled
            and self.top_entropy_quantile == 1.0
            and not self.aux_loss_enabled
        )

    # --- timing wrappers -------------------------------------------------------------------
    def _generate(self, prompts: list):
        start = time.perf_counter()
        try:
            return super()._generate(prompts)
        finally:
            self._timing["generation"] += time.perf_counter() - start

    def _generate_single_turn(self, prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        """TRL's generation; on its transformers path with text only, each distinct prompt is prefilled
        once (:func:`mrtpo.shared_prompt.shared_prefill`) instead of once per sample of its group."""
        shares = (
            self.args.shared_prompt_generation
            and not self.use_vllm
            and not self.use_transformers_continuous_batching
            and images is None
            and not multimodal_fields
        )
        call_args = (prompt_ids, images, multimodal_fields, num_generations, has_tool_images)
        if not shares:
            return super()._generate_single_turn(*call_args)
        model = self.accelerator.unwrap_model(self.model_wrapped)
        fast = self.args.fast_generation and not (self._dist.is_zero3 or self._dist.is_fsdp)  # full weights only
        with fast_sampling(model) if fast else shared_prefill(model):
            return super()._generate_single_turn(*call_args)

    def _tokenize_prompts(self, prompts: list):
        """TRL's prompt tokenisation run once per distinct text-only prompt (a group's rows share one)."""
        keys = [json.dumps(p, sort_keys=True, default=str) for p in prompts]
        distinct = list(dict.fromkeys(keys))
        if len(distinct) == len(keys) or self._is_vlm:
            return super()._tokenize_prompts(prompts)
        ids, images, fields = super()._tokenize_prompts([prompts[keys.index(k)] for k in distinct])
        if images is not None or fields:
            return super()._tokenize_prompts(prompts)
        return [ids[distinct.index(k)] for k in keys], None, {}

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        start = time.perf_counter()
        with checked_reward_funcs(self):  # a value that is not a finite number or None names its function
            rewards = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        self._timing["scoring"] += time.perf_counter() - start
        self._last_rewards = rewards.detach().float().cpu()
        return rewards

    def train(self, *args: Any, **kwargs: Any):
        """TRL's ``train``, holding ``output_dir``'s run lock on the main process (:mod:`mrtpo.run_lock`):
        a second writer of the folder, from the Python API or ``mrtpo train``, is refused with its pid."""
        lock = (
            lock_run_folder(Path(self.args.output_dir), "MRTPOTrainer.train") if self.is_world_process_zero() else None
        )
        try:
            return super().train(*args, **kwargs)
        finally:
            if lock is not None:
                lock.release()

    def training_step(self, model, inputs, num_items_in_batch):
        before = dict(self._timing)
        start = time.perf_counter()
        loss = super().training_step(model, inputs, num_items_in_batch)
        total = time.perf_counter() - start
        spent = {k: self._timing[k] - before[k] for k in self._timing}
        if spent["generation"] > 0 or spent["replay"] > 0:  # a step that generated a new batch
            for k, v in spent.items():
                self._metrics["train"][f"time/{k}"].append(v)
        self._metrics["train"]["time/update"].append(total - sum(spent.values()))
        self._metrics["train"]["memory/peak_gib"].append(peak_memory_gib(self.accelerator.device))
        return loss

    # --- the one real override -----------------------------------------------------------------
    def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
        out = super()._generate_and_score_completions(inputs)
        if not self.model.training or self._last_rewards is None:
            return out  # evaluation keeps TRL's sequence-level advantages
        device = out["advantages"].device
        mask = out["completion_mask"].float().cpu()
        if "tool_mask" in out:
            mask = mask * out["tool_mask"].float().cpu()
        b = mask.shape[0]
        rows = slice(self.accelerator.process_index * b, (self.accelerator.process_index + 1) * b)

        coefficients = reward_coefficients(self._last_rewards, self.num_generations, self.credit_config.reward_weights)
        start = time.perf_counter()
        local = coefficients[rows] if self.args.skip_zero_advantage else None  # None: every map is computed
        rule = context_rule(self.credit_method.needs)
        maps = self._replay(inputs, out, local) if rule.replays else {}
        if rule.known:
            maps["known_positions"] = self._known_positions(inputs, out)
        self._timing["replay"] += time.perf_counter() - start

        batch = CreditBatch(
            rewards=self._last_rewards,
            group_size=self.num_generations,
            mask=mask,
            rows=rows,
            known_positions=maps.get("known_positions"),
            **{field: maps.get(field) for field in CREDIT_FIELDS},
        )
        advantages = self.credit_method(batch, self.credit_config)
        sequence = self.credit_method.sequence_advantages(batch, self.credit_config)
        if self.args.scale_rewards != "group":  # method grpo only (MRTPOConfig): TRL's own, scaled as asked
            sequence = out["advantages"].detach().float().cpu()
            advantages = sequence.unsqueeze(1) * mask
        self._trl_advantages = out["advantages"].detach().cpu()  # TRL's own (B,), kept for comparison
        out["advantages"] = advantages.to(device)
        # Travels with the rows through TRL's shuffle and split: the off-policy mask's per-sequence sign.
        out[SEQUENCE_ADVANTAGES_KEY] = sequence.to(device)
        if self._update_skips_zero_rows:
            out[ZERO_ADVANTAGE_KEY] = self._zero_advantage_rows(coefficients[rows], sequence, mask).to(device)
        self._log_skips(maps)
        self._log_trained_advantages(advantages, mask)
        self._log_credit(inputs, out, batch, maps, advantages)
        return out

    def _zero_advantage_rows(self, coefficients: Tensor, sequence: Tensor, mask: Tensor) -> Tensor:
        """``(B,)`` bool: completions whose advantage is 0 at every token, whatever the token weights.

        ``coefficients`` ``(B, K)`` (``ω_k Â[j,k]``), ``sequence`` ``(B,)`` the method's sequence
        advantages, ``mask`` ``(B, T)``. GRPO: the (uniform) sequence advantage is 0. The GDPO family:
        every reward's coefficient is 0, so ``A[j,t] = −μ/σ``, and ``μ`` (the batch mean of
        ``S[j] = Σ_k ω_k Â[j,k]``) is 0 because each group's ``Â[·,k]`` sum to 0: the advantage is 0
        up to float rounding (|A| below 1e-15).
        """
        if self.credit_method.sequence == "grpo":
            zero = sequence == 0
        else:
            zero = (coefficients == 0).all(1)
        return zero.cpu() | (mask.sum(1) == 0)

    # --- the update's forward: each distinct prompt once ------------------------------------------
    def _get_per_token_logps_and_entropies(
        self,
        model,
        input_ids,
        attention_mask,
        logits_to_keep,
        batch_size=None,
        compute_entropy=False,
        compute_aux_loss=False,
        **extra,
    ):
        """TRL's per-token log-probabilities and entropies ``(B, T)``, computed by
        :func:`mrtpo.shared_prompt.shared_prompt_logps` (each distinct prompt once, same values) for
        text-only batches when ``shared_prompt_update`` is on and the model keeps its cache; TRL's own
        path otherwise (images, MoE aux loss, activation checkpointing while training)."""
        prompt_length = input_ids.size(1) - logits_to_keep
        shareable = (
            self.args.shared_prompt_update
            and not compute_aux_loss
            and all(value is None for value in extra.values())
            and can_share_prompts(model, prompt_length)
        )
        if not shareable:
            return super()._get_per_token_logps_and_entropies(
                model,
                input_ids,
                attention_mask,
                logits_to_keep,
                batch_size=batch_size,
                compute_entropy=compute_entropy,
                compute_aux_loss=compute_aux_loss,
                **extra,
            )
        batch_size = batch_size or input_ids.size(0)
        packed = self.args.packed_sequences and can_pack(model)
        logps, entropies = [], []
        for start in range(0, input_ids.size(0), batch_size):
            rows = slice(start, start + batch_size)
            with self.accelerator.autocast():
                chunk_logps, chunk_entropy = (packed_logps if packed else shared_prompt_logps)(
                    model,
                    input_ids[rows, :prompt_length],
                    attention_mask[rows, :prompt_length],
                    input_ids[rows, prompt_length:],
                    attention_mask[rows, prompt_length:],
                    compute_entropy,
                )
            logps.append(chunk_logps)
            entropies.append(chunk_entropy)
        return torch.cat(logps), (torch.cat(entropies) if compute_entropy else None), None

    # --- TRL's off-policy sequence mask, per sequence -------------------------------------------
    def _compute_loss(self, model, inputs):
        zero = inputs.get(ZERO_ADVANTAGE_KEY)
        if zero is not None:  # the same row count on every process: TRL's loss gathers per-row metrics
            inputs, left_out = rows_that_move(inputs, zero, self.accelerator)
            self._metrics["train"]["skip/update_completions_skipped"].append(left_out)
        self._loss_sequence_advantages = inputs.get(SEQUENCE_ADVANTAGES_KEY)
        try:
            return super()._compute_loss(model, inputs)
        finally:
            self._loss_sequence_advantages = None

    def get_off_policy_mask(
        self,
        advantages: Tensor,
        per_token_logps: Tensor,
        sampling_per_token_logps: Tensor,
        mask: Tensor,
        off_policy_threshold: float,
    ) -> Tensor:
        """TRL's off-policy sequence mask ``(B, 1)`` (keep if advantage ≥ 0 or mean KL ≤ threshold),
        with the advantage of the *sequence* (its GDPO / GRPO advantage), so a sequence is kept or
        dropped whole even when its token advantages ``(B, T)`` have both signs."""
        sequence = self._loss_sequence_advantages
        if sequence is not None:
            advantages = sequence.to(advantages).view(-1, 1)
        elif advantages.dim() == 2 and advantages.shape[1] > 1:
            raise RuntimeError("the off-policy mask needs the batch's sequence advantages, which it does not carry")
        return GRPOTrainer.get_off_policy_mask(
            advantages, per_token_logps, sampling_per_token_logps, mask, off_policy_threshold
        )


__all__ = [
    "GLOBAL_NORMALISER_LOSSES",
    "SEQUENCE_ADVANTAGES_KEY",
    "SEQUENCE_LEVEL_LOSSES",
    "TRL_AGGREGATION",
    "ZERO_ADVANTAGE_KEY",
    "MRTPOConfig",
    "MRTPOTrainer",
    "MetricsJSONL",
]
