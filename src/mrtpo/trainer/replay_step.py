"""The trainer's evidence replays: :class:`ReplayStepMixin`, a part of :class:`mrtpo.trainer.MRTPOTrainer`.

Per step, this process's completions are planned (:func:`mrtpo.replay_plan.plan_replays`), their
contexts tokenized as TRL tokenizes the prompt, the ranks agree on the number of forward calls, and
the plan is carried out (:func:`mrtpo.replay.run_replay_plan`); the maps come back in the
:class:`~mrtpo.credit.CreditBatch` fields. The evidence of every row is checked once, at start-up.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from mrtpo.known_positions import known_position_mask, knows_positions
from mrtpo.model_calls import ForwardCounter, autocast_outputs
from mrtpo.packing import can_pack
from mrtpo.replay import run_replay_plan
from mrtpo.replay_passes import replay_forward_calls
from mrtpo.replay_plan import (
    GroupPlan,
    counterfactual_texts,
    group_rows,
    plan_group,
    plan_replays,
)
from mrtpo.rewards import VerifierReward, evidence_for
from mrtpo.verifiers import Evidence


class ReplayStepMixin:
    """The replay half of :class:`mrtpo.trainer.MRTPOTrainer` (it reads the trainer's ``args``, ``model``,
    ``processing_class``, ``accelerator`` and ``reward_funcs``)."""

    def _check_evidence(self, dataset: Any) -> None:
        """Build every row's counterfactual prompts once, before training.

        A missing or repeated ``in_prompt`` span then fails on every rank at start-up with the
        reward and example named, instead of failing one rank mid-run while the others wait.
        Streaming datasets (no length) are checked lazily, during the replays.
        """
        if dataset is None or not hasattr(dataset, "__len__"):
            return
        for row in dataset:
            evidences = self._evidences(row)
            group = plan_group([0], evidences, [True] * len(evidences), self.credit_method.needs)
            self._counterfactual_texts(row, group)

    def _evidences(self, row: dict) -> list[Evidence | None]:
        """Each reward's evidence for this row's prompt (``None``: the reward declares none)."""
        return [evidence_for(f, row) if has else None for f, has in zip(self.reward_funcs, self._with_evidence)]

    def _counterfactual_texts(self, row: dict, group: GroupPlan) -> list[str]:
        """The group's counterfactual prompts, rendered as TRL renders the prompt (:mod:`mrtpo.replay_plan`)."""
        return counterfactual_texts(
            group,
            row["prompt"],
            self.reward_func_names,
            self._render,
            header=self.args.privileged_header,
            example_id=str(row.get("example_id", "?")),
        )

    def _render(self, prompt: Any) -> str:
        """The prompt string exactly as TRL renders it for generation."""
        if isinstance(prompt, str):
            return prompt
        return self.processing_class.apply_chat_template(
            prompt,
            tools=self.tools or None,
            chat_template=self.chat_template,
            add_generation_prompt=True,
            tokenize=False,
            **self.chat_template_kwargs,
        )

    def _tokenize(self, prompt: Any, text: str) -> list[int]:
        # TRL tokenizes string prompts with the tokenizer's special tokens, chat prompts without.
        return self.processing_class(text=text, add_special_tokens=isinstance(prompt, str))["input_ids"]

    def _replay(self, inputs: list[dict], out: dict, coefficients: Tensor | None = None) -> dict[str, Tensor | None]:
        """Relevance maps for this process's completions, as the credit method needs them.

        Completions of the same prompt are replayed together (:func:`mrtpo.replay.batch_relevance`): each
        context's prompt is encoded once per pass, its KV cache shared by the group's completions,
        and up to ``replay_groups_per_pass`` groups share a pass's three forward calls.
        ``coefficients`` ``(B, K)``: each completion's reward coefficients ``ω_k Â[j,k]``; a map that
        only multiplies zero coefficients is not computed (``None``: compute every map).
        Every rank first plans its groups and agrees with the others on the maximum number of forward calls,
        then replays and pads with dummy calls up to it, so sharded models (FSDP, ZeRO-3) and DDP stay in lockstep.
        """
        was_training = self.model.training
        self.model.eval()  # dropout off: the two contexts must differ only by the evidence
        try:  # under mixed precision, autocast's bf16 logits: no fp32 copy of them
            with autocast_outputs(self.model):
                return self._replay_eval_mode(inputs, out, coefficients)
        finally:
            self.model.train(was_training)

    def _replay_eval_mode(self, inputs: list[dict], out: dict, coefficients: Tensor | None) -> dict[str, Tensor | None]:
        # the step's few device tensors the plan reads come to the host once, as lists: the plan itself
        # (per group and per row) then makes no host sync, however many groups there are
        lengths = out["completion_mask"].sum(-1).long().cpu()
        prompt_ids, prompt_mask = out["prompt_ids"].tolist(), out["prompt_mask"].tolist()
        base_ids = [[token for token, keep in zip(ids, keeps) if keep] for ids, keeps in zip(prompt_ids, prompt_mask)]
        groups = group_rows([(str(row.get("example_id", j)), tuple(base_ids[j])) for j, row in enumerate(inputs)])
        nonzero = None if coefficients is None else (coefficients != 0).tolist()
        plan = plan_replays(
            groups,
            [self._evidences(inputs[rows[0]]) for rows in groups],
            lengths.tolist(),
            self.credit_method.needs,
            nonzero,
        )
        micro_batch, per_pass = self.args.replay_micro_batch, self.args.replay_groups_per_pass
        packed = self.args.packed_sequences and can_pack(self.model)
        calls = {}

        def contexts_of(group) -> list[list[int]]:
            row = inputs[group.rows[0]]
            return [base_ids[group.rows[0]]] + [
                self._tokenize(row["prompt"], text) for text in self._counterfactual_texts(row, group)
            ]

        def agree(replays) -> None:  # every group's contexts first: the call count is agreed before any call
            calls["planned"] = replay_forward_calls(
                [r.contexts for r in replays], [len(r.lengths) for r in replays], micro_batch, per_pass, packed
            )
            calls["target"] = self._agree_forward_calls(calls["planned"])

        counter = ForwardCounter()
        # one host copy of the ids (each pass sends its rows back in one); the maps stay on the device until
        # the step's last replay: one host copy per step
        maps = run_replay_plan(
            self.model,
            plan,
            contexts_of,
            out["completion_ids"].cpu(),
            lengths,
            device=self.accelerator.device,
            on_replays=agree,
            kind=self.args.relevance,
            temperature=self.temperature,
            chunk_size=self.args.relevance_chunk_size,
            top_k=self.args.relevance_top_k,
            micro_batch=micro_batch,
            groups_per_pass=per_pass,
            counter=counter,
            on_device=True,
            packed=packed,
        )
        if counter.calls != calls["planned"]:
            raise RuntimeError(
                f"replay made {counter.calls} forward calls but planned {calls['planned']}: "
                "replay_forward_calls no longer matches mrtpo.replay.pass_context_logits"
            )
        self._pad_forward_calls(calls["target"] - counter.calls)
        self.replay_forward_calls = calls["target"]
        self._replay_counts = plan.counts()
        return {**{key: m.cpu() if m is not None else None for key, m in maps.items()}, "skipped": plan.skipped()}

    def _known_positions(self, inputs: list[dict], out: dict, checked_spans: bool = True) -> Tensor | None:
        """``(B, K, T)`` float: 1 on the positions the task knows each reward reads in this process's completions
        (:func:`mrtpo.known_positions.known_position_mask`: what the ``oracle`` weights, and where the
        ``credit/*/lift`` metrics are measured); ``None`` when no reward's are known. ``checked_spans=False``:
        the gym verifiers' ground truth only (no per-token decoding of a real task's spans)."""
        known = [
            f
            if isinstance(f, VerifierReward) and knows_positions(f.verifier, f.spans_of if checked_spans else None)
            else None
            for f in self.reward_funcs
        ]
        first = next((f for f in known if f is not None), None)
        if first is None:
            return None
        ids = out["completion_ids"].cpu()
        rows = [ids[j, :n].tolist() for j, n in enumerate(out["completion_mask"].sum(-1).long().tolist())]
        texts = [self.processing_class.decode(r, skip_special_tokens=True) for r in rows]
        return known_position_mask(
            [f.verifier if f else None for f in known],
            [first.examples[row["example_id"]] for row in inputs],
            texts,
            rows,
            ids.shape[1],
            self.processing_class,
            first.spans_of if checked_spans else None,
        )

    def _agree_forward_calls(self, calls: int) -> int:
        """The maximum over ranks of the replay forward calls each rank will make.

        Exchanged *before* any replay forward: under ZeRO-3 / FSDP every forward is itself a
        collective, so an exchange after a rank's last call would meet another rank's next forward.
        """
        if self.accelerator.num_processes == 1:
            return calls
        counts = self.accelerator.gather(torch.tensor([calls], device=self.accelerator.device))
        return int(counts.max().item())

    @torch.no_grad()
    def _pad_forward_calls(self, count: int) -> None:
        """``count`` one-token dummy forwards, so this rank makes as many replay calls as the others."""
        dummy = torch.tensor([[self.processing_class.pad_token_id or 0]], device=self.accelerator.device)
        for _ in range(count):
            self.model(input_ids=dummy, use_cache=False)
