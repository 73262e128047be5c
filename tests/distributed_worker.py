"""One rank of a real multi-process CPU run of MRTPOTrainer (launched by tests/test_distributed.py).

    torchrun --standalone --nproc_per_node 2 tests/distributed_worker.py OUT_DIR [--method mrtpo] [--gym]

Trains the tiny random policy (``mrtpo.testing.tiny_policy``), or with ``--gym`` the gym task's
warm-started policy (``gym-constraints``, real reward spread, built by ``mrtpo.train.build_trainer``
as ``mrtpo train`` does), for a few steps on gloo with ``use_cpu=True`` and writes, per rank,
``OUT_DIR/rank<r>.json``: per generation step the inputs, prompt/completion ids and masks, the
gathered global rewards, this process's row slice, the replay's relevance maps and the local
advantages; per update micro-batch its rows and the rows the update kept; the number of replay
forward calls per generation step. ``OUT_DIR/rank<r>_params.pt`` holds the parameters after
training, ``OUT_DIR/rank<r>_updates.pt`` the parameters and the (all-reduced, unclipped) gradient of
every optimizer step. The parent test recomputes everything in one process and compares.

Rewards and dataset are shared with the test (``build_rewards`` / ``build_dataset``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch

from mrtpo.rewards import completion_text, evidence

NUM_GENERATIONS = 4
PER_DEVICE_BATCH = 6  # 2 ranks x 6 = 12 completions = 3 groups of 4: the middle group straddles the ranks


@evidence("keyword", placement="in_prompt")
def keyword_rule(completions, **kwargs):
    """Stand-in for a keyword check (a random policy never writes the word, so a literal check has no
    spread): parity of the completion's ASCII byte count. Evidence: the keyword sentence in the prompt.

    One prompt has no keyword sentence (empty column): its evidence is absent, so that
    prompt's completions replay one context fewer.
    """
    return [float(sum(b < 128 for b in completion_text(c).encode()) % 2) for c in completions]


@evidence("gold", placement="privileged")
def byte_sum(completions, **kwargs):
    """Byte sum mod 5: differs between almost any two random completions (a spread in every group)."""
    return [float(sum(completion_text(c).encode()) % 5) for c in completions]


def length_or_none(completions, kind, **kwargs):
    """No evidence (uniform credit); not applicable (None -> NaN) to 'open' prompts."""
    return [None if k == "open" else float(len(completion_text(c)) % 3) for c, k in zip(completions, kind)]


def build_rewards():
    return [keyword_rule, byte_sum, length_or_none]


def build_rows(missing_evidence_in: str | None = None) -> list[dict]:
    """Three prompts: two carry an in-prompt keyword sentence, one has none (absent evidence).

    ``missing_evidence_in``: that example's keyword column names a sentence its prompt lacks (a
    broken dataset row, for the error-propagation check).
    """
    rows = []
    for i, (topic, keyword, kind) in enumerate(
        [
            ("owls", "Mention the word river.", "closed"),
            ("salt", "", "open"),
            ("kites", "Mention the word moon.", "closed"),
        ]
    ):
        system = "Answer in one line." + (f" {keyword}" if keyword else "")
        rows.append(
            {
                "prompt": [
                    {"role": "system", "content": system},
                    {"role": "user", "content": f"Say something about {topic}."},
                ],
                "keyword": keyword,
                "gold": f"a fact about {topic}",
                "kind": kind,
                "example_id": f"p{i}",
            }
        )
        if rows[-1]["example_id"] == missing_evidence_in:
            rows[-1]["keyword"] = "Mention the word nowhere."
    return rows


def build_dataset(missing_evidence_in: str | None = None):
    from datasets import Dataset

    return Dataset.from_list(build_rows(missing_evidence_in))


def gym_overrides(output_dir: str, max_steps: int, per_device_train_batch_size: int = 16) -> dict:
    """``mrtpo train`` settings of the gym run of issue 31 (its defaults otherwise, the row skip on):
    4 prompts x 8 completions per step over the processes."""
    return {
        "task": "gym-constraints",
        "model": "gym",
        "output_dir": output_dir,
        "max_steps": max_steps,
        "num_generations": 8,
        "per_device_train_batch_size": per_device_train_batch_size,
        "max_completion_length": 40,
        "learning_rate": 3e-4,
        "report": False,
        "save_strategy": "no",
        "lam": 1.0,
        "w_max": None,
    }  # the paper's weight shape: the trajectory the tests' step notes describe


def build_config(output_dir: str, method: str, max_steps: int, **kw):
    from mrtpo.trainer import MRTPOConfig

    base = {
        "output_dir": output_dir,
        "use_cpu": True,
        "bf16": False,
        "activation_checkpointing": False,
        "report_to": [],
        "per_device_train_batch_size": PER_DEVICE_BATCH,
        "num_generations": NUM_GENERATIONS,
        "max_completion_length": 8,
        "max_steps": max_steps,
        "logging_steps": 1,
        "save_strategy": "no",
        "learning_rate": 1e-2,
        "seed": 0,
        "temperature": 1.0,
        "multi_objective_aggregation": "normalize_then_sum",
        "credit_samples": 0,
        "dataloader_num_workers": 0,
    }
    base.update(kw)
    return MRTPOConfig(method=method, **base)


class RecordingMethod:
    """Wraps the trainer's credit method and keeps every CreditBatch it is called with."""

    def __init__(self, inner):
        self.inner = inner
        self.batches = []

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def __call__(self, batch, config=None):
        self.batches.append(batch)
        return self.inner(batch, config)


def _tensor(x) -> list:
    return x.detach().cpu().tolist()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir")
    parser.add_argument("--method", default="mrtpo")
    parser.add_argument("--max-steps", type=int, default=2)
    parser.add_argument("--expect-processes", type=int, default=2)
    parser.add_argument(
        "--missing-evidence-in", default=None, help="example id whose evidence span is not in its prompt"
    )
    parser.add_argument(
        "--simulate-sharded",
        action="store_true",
        help="make every replay forward a collective (as under ZeRO-3 / FSDP) and check the calls pair up",
    )
    parser.add_argument("--groups-per-pass", type=int, default=1, help="replay_groups_per_pass (0: all groups)")
    parser.add_argument("--gym", action="store_true", help="train the gym policy on gym-constraints (gym_overrides)")
    args = parser.parse_args()

    import mrtpo.trainer.core
    from mrtpo.testing import tiny_policy
    from mrtpo.trainer import ZERO_ADVANTAGE_KEY, MRTPOTrainer

    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    if args.gym:
        from mrtpo.config import load_config
        from mrtpo.train import build_trainer

        trainer = build_trainer(load_config(overrides=gym_overrides(str(out_dir / "run"), args.max_steps)))
    else:
        model, tok = tiny_policy(seed=0)
        trainer = MRTPOTrainer(
            model=model,
            processing_class=tok,
            reward_funcs=build_rewards(),
            args=build_config(
                str(out_dir / "run"), args.method, args.max_steps, replay_groups_per_pass=args.groups_per_pass or None
            ),
            train_dataset=build_dataset(args.missing_evidence_in),
        )
    acc = trainer.accelerator
    assert acc.num_processes == args.expect_processes, (
        f"expected {args.expect_processes} processes, accelerate sees {acc.num_processes} "
        f"(distributed_type={acc.distributed_type}); launch with torchrun --nproc_per_node {args.expect_processes}"
    )
    rank = acc.process_index

    # Count the policy's forward calls made inside the replay, per generation step, whatever the
    # replay's internals are: a forward pre-hook on the module the trainer replays through.
    calls: list[list[list[int]]] = []  # per generation step: the input_ids shape of each replay call
    in_replay = [False]

    sharded_group = None
    if args.simulate_sharded:
        # ZeRO-3 / FSDP all-gather parameters in every forward, on their own communicator. Stand-in:
        # a gloo group of its own, on which every replay forward all-gathers (step, call index).
        # The k-th call of every rank must meet the k-th call of every other rank, at the same step.
        import datetime

        import torch.distributed as dist

        sharded_group = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=45))

    def count_call(module, f_args, f_kwargs):
        if in_replay[0]:
            ids = f_kwargs.get("input_ids", f_args[0] if f_args else None)
            calls[-1].append(list(ids.shape) if ids is not None else [])
            if sharded_group is not None:
                import torch.distributed as dist

                mine = torch.tensor([len(calls), len(calls[-1])])
                every = [torch.zeros_like(mine) for _ in range(acc.num_processes)]
                dist.all_gather(every, mine, group=sharded_group)  # times out if the other rank never comes
                assert all(torch.equal(e, mine) for e in every), (
                    f"rank {acc.process_index}: replay call (step, index) {mine.tolist()} "
                    f"met {[e.tolist() for e in every]}"
                )

    trainer.model.register_forward_pre_hook(count_call, with_kwargs=True)

    steps: list[dict] = []
    recorder = RecordingMethod(trainer.credit_method)
    trainer.credit_method = recorder  # sees exactly the CreditBatch the trainer hands the credit math
    original_replay = trainer._replay

    def recording_replay(inputs, out, coefficients):
        in_replay[0] = True
        try:
            return original_replay(inputs, out, coefficients)
        finally:
            in_replay[0] = False

    trainer._replay = recording_replay
    original_generate = trainer._generate_and_score_completions

    def recording_generate(inputs):
        calls.append([])
        out = original_generate(inputs)
        batch = recorder.batches[-1]
        steps.append(
            {
                "inputs": [dict(row) for row in inputs],
                "prompt_ids": _tensor(out["prompt_ids"]),
                "prompt_mask": _tensor(out["prompt_mask"]),
                "completion_ids": _tensor(out["completion_ids"]),
                "completion_mask": _tensor(out["completion_mask"]),
                "advantages": _tensor(out["advantages"]),
                # What the trainer gave the credit math: gathered rewards, this process's rows, local maps.
                "rewards": [[None if math.isnan(v) else v for v in r] for r in _tensor(batch.rewards)],
                "rows": [batch.rows.start, batch.rows.stop] if batch.rows is not None else None,
                "group_size": batch.group_size,
                "credit_mask": _tensor(batch.mask),
                "relevance": _tensor(batch.relevance) if batch.relevance is not None else None,
                "has_evidence": _tensor(torch.as_tensor(batch.has_evidence))
                if batch.has_evidence is not None
                else None,
                "credit_config": dataclasses.asdict(trainer.credit_config),
            }
        )
        return out

    trainer._generate_and_score_completions = recording_generate

    micro_batches: list[dict] = []  # every update micro-batch: its rows, and what the update ran
    original_rows = mrtpo.trainer.core.rows_that_move

    def recording_rows(inputs, zero, accelerator):
        kept, left_out = original_rows(inputs, zero, accelerator)
        tensors = {k: v for k, v in inputs.items() if torch.is_tensor(v)}
        micro_batches.append(
            {
                "inputs": {k: _tensor(v) for k, v in tensors.items()},
                "dtypes": {k: str(v.dtype).removeprefix("torch.") for k, v in tensors.items()},
                "kept_zero": _tensor(kept[ZERO_ADVANTAGE_KEY]),
                "left_out": left_out,
            }
        )
        return kept, left_out

    mrtpo.trainer.core.rows_that_move = recording_rows
    updates: list[dict] = []  # every optimizer step: the parameters it starts from and the reduced gradient
    original_clip = trainer._clip_grad_norm

    def recording_clip(model):
        named = acc.unwrap_model(model).named_parameters()
        updates.append({name: (p.detach().clone(), p.grad.detach().clone()) for name, p in named if p.grad is not None})
        return original_clip(model)

    trainer._clip_grad_norm = recording_clip
    result = trainer.train()

    record = {
        "rank": rank,
        "num_processes": acc.num_processes,
        "distributed_type": str(acc.distributed_type),
        "world_size_env": int(os.environ.get("WORLD_SIZE", "1")),
        "method": args.method,
        "replay_calls": calls,
        "steps": steps,
        "micro_batches": micro_batches,
        "train_loss": result.training_loss,
        "global_step": trainer.state.global_step,
    }
    (out_dir / f"rank{rank}.json").write_text(json.dumps(record))
    unwrapped = acc.unwrap_model(trainer.model)
    torch.save(
        {k: v.detach().cpu().clone() for k, v in unwrapped.state_dict().items()}, out_dir / f"rank{rank}_params.pt"
    )
    torch.save(updates, out_dir / f"rank{rank}_updates.pt")
    acc.wait_for_everyone()
    print(f"rank {rank}: done, {sum(map(len, calls))} replay calls over {len(calls)} generation steps", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
