"""Two real processes (torchrun, gloo, CPU) give the same advantages as one process on the global batch.

``tests/distributed_worker.py`` trains the tiny random policy under
``torchrun --standalone --nproc_per_node 2`` and dumps, per rank, what the trainer handed the
credit math in the first generation step (gathered rewards, its row slice, its local relevance
maps and masks) and the advantages it got back. Here, in one process, we recompute:

- the rewards of each rank's completions from their decoded text (so the gathered reward rows
  really are those completions: ordering across ranks is right);
- the advantages of the whole global batch from the dumped rewards + relevance with
  :mod:`mrtpo.credit` (no ``rows``), whose rows must equal each rank's local advantages;
- the relevance itself, by replaying the whole global batch through a one-process trainer
  with the same initial weights (the first generation step runs before any update);

and check lockstep (both ranks made the same number of replay forward calls in every step, even
when one rank had less replay work, and with each call made a collective as under ZeRO-3 / FSDP,
the calls paired up) and DDP (both ranks end with identical, changed parameters).
The batch is laid out so the middle group of 4 completions straddles the two ranks, and one prompt
has no in-prompt evidence, so group statistics really are cross-rank.

The worker's ``--gym`` run trains the gym policy (real reward spread) with the update's row skip on,
over steps where the ranks' zero-advantage rows differ: both ranks must run as many update rows (TRL's
loss gathers per-row tensors), and at every step the advantages and the DDP-reduced gradient must equal
one process's on the global batch. ``-m slow`` runs issue 31's 150-step two-process ``mrtpo train``.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent
WORKER_PATH = ROOT / "distributed_worker.py"
TIMEOUT_S = 420


def _load_worker():
    spec = importlib.util.spec_from_file_location("mrtpo_distributed_worker", WORKER_PATH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


worker = _load_worker()


def launch(out_dir: Path, *extra: str, nproc: int = 2, timeout: float = TIMEOUT_S) -> subprocess.CompletedProcess:
    """Run the worker under ``torchrun --standalone`` (see :func:`torchrun`)."""
    return torchrun(str(WORKER_PATH), str(out_dir), *extra, nproc=nproc, timeout=timeout)


def torchrun(*args: str, nproc: int = 2, timeout: float = TIMEOUT_S) -> subprocess.CompletedProcess:
    """``torchrun --standalone`` (free port chosen by torchrun) of ``args``, in its own process group
    so a timeout kills every rank, not only the launcher."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}", *args]
    env = dict(
        os.environ,
        HF_HUB_OFFLINE="1",
        HF_HUB_DISABLE_TELEMETRY="1",
        TOKENIZERS_PARALLELISM="false",
        OMP_NUM_THREADS="1",
        PYTHONUNBUFFERED="1",
    )
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, start_new_session=True
    )
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
        pytest.fail(f"torchrun did not finish within {timeout} s (a rank hung?)\n{_tails(stdout, stderr)}")
    return subprocess.CompletedProcess(cmd, proc.returncode, stdout, stderr)


def _tails(stdout: str, stderr: str, n: int = 12000) -> str:
    return f"--- stdout (tail) ---\n{stdout[-n:]}\n--- stderr (tail) ---\n{stderr[-n:]}"


def _ranks(out: Path, proc: subprocess.CompletedProcess) -> list[dict]:
    """Each rank's record of a worker run, with its final parameters (``params``) and its optimizer
    steps' parameters and gradients (``updates``)."""
    if proc.returncode != 0:
        pytest.fail(f"two-process run failed with exit code {proc.returncode}\n{_tails(proc.stdout, proc.stderr)}")
    ranks = []
    for r in range(2):
        path = out / f"rank{r}.json"
        if not path.exists():
            pytest.fail(f"rank {r} wrote no {path.name}\n{_tails(proc.stdout, proc.stderr)}")
        record = json.loads(path.read_text())
        record["params"] = torch.load(out / f"rank{r}_params.pt")
        record["updates"] = torch.load(out / f"rank{r}_updates.pt")
        ranks.append(record)
    return ranks


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("two_ranks")
    return {"ranks": _ranks(out, launch(out, "--simulate-sharded")), "out": out}


def _rewards(step: dict) -> torch.Tensor:
    return torch.tensor([[math.nan if v is None else v for v in row] for row in step["rewards"]], dtype=torch.float32)


def _pad_cat(tensors: list[torch.Tensor], value=0, left: bool = False) -> torch.Tensor:
    """Concatenate along dim 0, padding the last dim to the longest (right, or left for prompts)."""
    width = max(t.shape[-1] for t in tensors)
    padded = []
    for t in tensors:
        pad = [width - t.shape[-1], 0] if left else [0, width - t.shape[-1]]
        padded.append(torch.nn.functional.pad(t, pad, value=value))
    return torch.cat(padded)


def _global(ranks: list[dict], step: int = 0, pad_id: int | None = None) -> dict:
    """The global batch of generation step ``step``, rank 0's rows then rank 1's, as one process
    would hold it (prompts and completions padded with ``pad_id``, default the tiny tokenizer's)."""
    steps = [r["steps"][step] for r in ranks]
    pad_id = worker_tokenizer().pad_token_id if pad_id is None else pad_id
    return {
        "inputs": [row for s in steps for row in s["inputs"]],
        "prompt_ids": _pad_cat([torch.tensor(s["prompt_ids"]) for s in steps], pad_id, left=True),
        "prompt_mask": _pad_cat([torch.tensor(s["prompt_mask"]) for s in steps], 0, left=True),
        "completion_ids": _pad_cat([torch.tensor(s["completion_ids"]) for s in steps], pad_id),
        "completion_mask": _pad_cat([torch.tensor(s["completion_mask"]) for s in steps], 0),
        "credit_mask": _pad_cat([torch.tensor(s["credit_mask"]) for s in steps], 0.0),
        "relevance": _pad_cat([torch.tensor(s["relevance"]) for s in steps], 0.0),
        "has_evidence": torch.cat([torch.tensor(s["has_evidence"]) for s in steps]),
    }


def worker_tokenizer():
    from mrtpo.testing import tiny_tokenizer

    return tiny_tokenizer()


def _credit_config(step: dict):
    from mrtpo.credit import CreditConfig

    return CreditConfig(**step["credit_config"])


def _check_rows_match(global_adv: torch.Tensor, ranks: list[dict], atol: float, step_index: int = 0) -> None:
    for r in ranks:
        step = r["steps"][step_index]
        local = torch.tensor(step["advantages"])
        start, stop = step["rows"]
        t = local.shape[1]
        torch.testing.assert_close(
            local, global_adv[start:stop, :t], atol=atol, rtol=0, msg=lambda m, rank=r["rank"]: f"rank {rank}: {m}"
        )
        assert torch.all(global_adv[start:stop, t:] == 0)  # beyond this rank's padding: masked


def test_two_real_processes_share_one_global_batch(run):
    """A real two-process gloo run, and the batch layout the other checks rely on."""
    r0, r1 = run["ranks"]
    for r in (r0, r1):
        assert r["num_processes"] == 2 and r["world_size_env"] == 2
        assert r["distributed_type"].endswith("MULTI_CPU")
        assert r["global_step"] == 2
    s0, s1 = r0["steps"][0], r1["steps"][0]
    assert s0["rows"] == [0, 6] and s1["rows"] == [6, 12]
    assert s0["rewards"] == s1["rewards"] and len(s0["rewards"]) == 12  # gathered: the global batch on both
    ids = [row["example_id"] for row in s0["inputs"] + s1["inputs"]]
    groups = [ids[i : i + 4] for i in range(0, 12, 4)]
    assert all(len(set(g)) == 1 for g in groups), groups  # rows ordered group by group across ranks
    assert ids[4:6] == ids[6:8]  # the middle group straddles the ranks


def test_gathered_rewards_are_the_ranks_own_completions(run):
    """Rewards recomputed from each rank's decoded completions equal its rows of the gathered matrix."""
    tok = worker_tokenizer()
    for r in run["ranks"]:
        step = r["steps"][0]
        completions = []
        for ids, mask in zip(step["completion_ids"], step["completion_mask"]):
            text = tok.decode([i for i, m in zip(ids, mask) if m], skip_special_tokens=True)
            completions.append([{"role": "assistant", "content": text}])
        columns = {key: [row[key] for row in step["inputs"]] for key in ("keyword", "gold", "kind", "example_id")}
        expected = torch.tensor(
            [
                [math.nan if v is None else v for v in f(completions=completions, **columns)]
                for f in worker.build_rewards()
            ]
        ).T
        start, stop = step["rows"]
        torch.testing.assert_close(_rewards(step)[start:stop], expected, equal_nan=True)


def test_local_advantages_equal_rows_of_the_one_process_computation(run):
    """The mrtpo advantages of the whole global batch, computed once (no ``rows``), restricted to each
    rank's rows, equal that rank's local advantages; their token means are the global GDPO ones."""
    from mrtpo.credit import CreditBatch, gdpo_advantages, get_method

    ranks = run["ranks"]
    g = _global(ranks)
    step0 = ranks[0]["steps"][0]
    rewards = _rewards(step0)
    batch = CreditBatch(
        rewards=rewards,
        group_size=step0["group_size"],
        mask=g["credit_mask"],
        relevance=g["relevance"],
        has_evidence=g["has_evidence"],
    )
    global_adv = get_method("mrtpo")(batch, _credit_config(step0))
    _check_rows_match(global_adv, ranks, atol=1e-6)
    # Independent invariant: the token mean of each row is the GDPO advantage of the global batch.
    mask = g["credit_mask"]
    valid = mask.sum(1) > 0
    mean = (global_adv * mask).sum(1)[valid] / mask.sum(1)[valid]
    torch.testing.assert_close(mean, gdpo_advantages(rewards, step0["group_size"])[valid], atol=1e-4, rtol=1e-4)
    assert global_adv.abs().max() > 0.1  # a real learning signal, not all zeros


def test_relevance_matches_a_one_process_replay_of_the_global_batch(tmp_path, run):
    """One process replaying all 12 completions with the initial weights gives the relevance each
    rank computed for its 6 (the first replay precedes any update), hence the same advantages; it
    skips the same (group, reward) replays, from the same global reward coefficients."""
    from mrtpo.credit import CreditBatch, get_method, reward_coefficients
    from mrtpo.testing import tiny_policy
    from mrtpo.trainer import MRTPOTrainer

    ranks = run["ranks"]
    g = _global(ranks)
    model, tok = tiny_policy(seed=0)
    trainer = MRTPOTrainer(
        model=model,
        processing_class=tok,
        reward_funcs=worker.build_rewards(),
        args=worker.build_config(str(tmp_path), "mrtpo", 1, per_device_train_batch_size=12),
        train_dataset=worker.build_dataset(),
    )
    assert trainer.accelerator.num_processes == 1
    model.train()  # the trainer replays in training mode
    step0 = ranks[0]["steps"][0]
    coefficients = reward_coefficients(_rewards(step0), step0["group_size"], step0["credit_config"]["reward_weights"])
    keys = ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask")
    maps = trainer._replay(g["inputs"], {k: g[k] for k in keys}, coefficients)
    torch.testing.assert_close(maps["relevance"], g["relevance"], atol=1e-5, rtol=1e-4)
    assert torch.equal(maps["has_evidence"], g["has_evidence"])
    batch = CreditBatch(
        rewards=_rewards(step0),
        group_size=step0["group_size"],
        mask=g["credit_mask"],
        relevance=maps["relevance"],
        has_evidence=maps["has_evidence"],
    )
    _check_rows_match(get_method("mrtpo")(batch, _credit_config(step0)), ranks, atol=1e-4)


def test_replay_forward_calls_in_lockstep(run):
    """Every generation step, both ranks call the policy's forward the same number of times in the
    replay, although their replay work differs (one prompt's evidence is absent on one rank only).

    The run also makes every replay forward a collective on its own gloo group, as ZeRO-3 / FSDP do
    (``--simulate-sharded``): the k-th call of each rank had to meet the k-th call of the other, or
    the run would have timed out there. (It did, before the call count was agreed on up front.)"""
    r0, r1 = run["ranks"]
    calls0, calls1 = r0["replay_calls"], r1["replay_calls"]
    assert len(calls0) == len(calls1) == 2  # two generation steps
    for step, (a, b) in enumerate(zip(calls0, calls1)):
        assert len(a) == len(b) > 0, f"step {step}: rank 0 made {len(a)} replay forward calls, rank 1 {len(b)}"
    # The layout of step 1 (fixed by the seed): rank 0 holds prompts with evidence only; rank 1 holds
    # the prompt without in-prompt evidence, so it has fewer contexts to replay.
    has0 = torch.tensor(r0["steps"][0]["has_evidence"])
    has1 = torch.tensor(r1["steps"][0]["has_evidence"])
    assert has0[:, 0].all() and not has1[:, 0].all(), "expected the evidence-less prompt on rank 1 only"
    assert calls0[0] != calls1[0], "expected different replay work on the two ranks in step 1"


def test_one_replay_pass_per_rank_stays_in_lockstep(tmp_path, run):
    """With every local group in one replay pass (``replay_groups_per_pass: null``), each rank makes
    the pass's 3 calls in the first step, paired up call by call as under ZeRO-3 / FSDP, over the
    same rows as the default run's pass per group (same seed: the same first batch)."""
    proc = launch(tmp_path, "--simulate-sharded", "--groups-per-pass", "0", "--max-steps", "1")
    assert proc.returncode == 0, _tails(proc.stdout, proc.stderr)
    for r in range(2):
        (one_pass,) = json.loads((tmp_path / f"rank{r}.json").read_text())["replay_calls"]
        per_group = run["ranks"][r]["replay_calls"][0]
        real = [shape for shape in per_group if shape != [1, 1]]  # not the dummy calls that pad to the other rank
        assert len(one_pass) == 3 < len(real)
        assert sum(shape[0] for shape in one_pass) == sum(shape[0] for shape in real)


def test_ddp_ranks_end_with_identical_trained_parameters(run):
    from mrtpo.testing import tiny_policy

    p0, p1 = (r["params"] for r in run["ranks"])
    assert p0.keys() == p1.keys()
    for name in p0:
        assert torch.equal(p0[name], p1[name]), f"parameter {name} differs between ranks"
    initial = tiny_policy(seed=0)[0].state_dict()
    changed = [name for name in p0 if not torch.equal(p0[name], initial[name])]
    assert len(changed) > len(p0) // 2, f"only {changed} changed: training did not update the model"


def test_logged_credit_metrics_cover_the_global_batch(run):
    """TRL logs reward metrics over the gathered batch; the credit metrics should be global too.

    Recompute ``credit/<reward>/top10_share`` of step 1 over all 12 completions from the dumped
    relevance, and compare with the value rank 0 wrote to metrics.jsonl.
    """
    from mrtpo.credit import CreditBatch, get_method

    ranks = run["ranks"]
    g = _global(ranks)
    step0 = ranks[0]["steps"][0]
    batch = CreditBatch(
        rewards=_rewards(step0),
        group_size=step0["group_size"],
        mask=g["credit_mask"],
        relevance=g["relevance"],
        has_evidence=g["has_evidence"],
    )
    weights = get_method("mrtpo").weights(batch, _credit_config(step0))
    lines = [json.loads(x) for x in (run["out"] / "run" / "metrics.jsonl").read_text().splitlines()]
    logged = next(x for x in lines if x.get("step") == 1 and "credit/keyword_rule/top10_share" in x)
    shares = []
    for j, n in enumerate(g["credit_mask"].sum(1).long().tolist()):
        if n:
            w = weights[j, 0, :n]
            top = torch.topk(w, max(1, math.ceil(0.1 * n))).values
            shares.append(float(top.sum() / w.sum()))
    assert logged["credit/keyword_rule/top10_share"] == pytest.approx(sum(shares) / len(shares), abs=1e-6)


def test_evidence_error_on_one_rank_stops_the_whole_run(tmp_path):
    """A dataset row whose evidence is not in its prompt, held by one rank only, fails the run with the
    error naming the reward and example; the other rank does not hang."""
    proc = launch(tmp_path, "--missing-evidence-in", "p2", "--max-steps", "1", timeout=300)
    output = proc.stdout + proc.stderr
    assert proc.returncode != 0, _tails(proc.stdout, proc.stderr)
    assert "EvidenceNotFoundError" in output and "'keyword_rule' for example 'p2'" in output, _tails(
        proc.stdout, proc.stderr
    )


class _TwoProcesses:
    """Stand-in for a 2-process accelerator in one process: ``gather`` returns this process's tensor
    followed by the other process's ``other`` (what a real gather of one-row tensors returns)."""

    num_processes, device = 2, torch.device("cpu")

    def __init__(self, other: list[int]):
        self.other = torch.tensor([other])

    def gather(self, tensor):
        return torch.cat([tensor.view(1, -1), self.other])


class _OneProcess:
    """Stand-in for a one-process accelerator, which must not be asked to gather."""

    num_processes, device = 1, torch.device("cpu")

    def gather(self, tensor):
        raise AssertionError("one process makes no collective")


def _micro_batch(zero: list[bool]) -> dict:
    """A micro-batch whose completion ids are the row numbers; ``zero`` marks rows of advantage 0."""
    from mrtpo.trainer import ZERO_ADVANTAGE_KEY

    b = len(zero)
    return {
        "completion_ids": torch.arange(b).view(b, 1),
        "advantages": torch.tensor([[0.0 if z else 1.0] for z in zero]),
        ZERO_ADVANTAGE_KEY: torch.tensor(zero),
        "num_items_in_batch": torch.tensor(7),
    }


def test_update_rows_are_padded_to_the_other_process_and_untouched_alone():
    """A process with 3 moving rows of 6, next to one that wants 5, keeps its 3 moving rows and its
    first 2 zero rows, in order; 2 rows (one per process) are left out. Alone it keeps the 3 moving
    rows without any collective; a micro-batch without zero rows passes through unchanged."""
    from mrtpo.trainer.update_rows import rows_that_move

    zero = [False, True, True, False, True, False]
    kept, left_out = rows_that_move(_micro_batch(zero), torch.tensor(zero), _TwoProcesses([5, 6]))
    assert kept["completion_ids"].flatten().tolist() == [0, 1, 2, 3, 5] and left_out == 2
    assert kept["num_items_in_batch"] == 7  # the normaliser spans the whole generation batch
    kept, left_out = rows_that_move(_micro_batch(zero), torch.tensor(zero), _TwoProcesses([1, 6]))
    assert kept["completion_ids"].flatten().tolist() == [0, 3, 5] and left_out == 6  # the other one runs 1 row
    kept, left_out = rows_that_move(_micro_batch(zero), torch.tensor(zero), _OneProcess())
    assert kept["completion_ids"].flatten().tolist() == [0, 3, 5] and left_out == 3
    kept, left_out = rows_that_move(_micro_batch([True] * 4), torch.ones(4, dtype=torch.bool), _OneProcess())
    assert kept["completion_ids"].flatten().tolist() == [0] and left_out == 3  # one row: a forward and backward
    batch = _micro_batch([False] * 4)
    assert rows_that_move(batch, torch.zeros(4, dtype=torch.bool), _OneProcess()) == (batch, 0)
    # A key that is not a per-row tensor: nothing can be cut, so every process runs all its rows.
    kept, left_out = rows_that_move(
        {**_micro_batch(zero), "pixel_values": torch.ones(1)}, torch.tensor(zero), _TwoProcesses([1, 6])
    )
    assert kept["completion_ids"].flatten().tolist() == list(range(6)) and left_out == 0


GYM_STEPS = 8  # with the worker's seed, step 3 has zero-advantage rows on both ranks, step 7 on rank 0 only


@pytest.fixture(scope="module")
def gym_run(tmp_path_factory):
    """Two processes train the gym policy on gym-constraints (issue 31's settings, row skip on)."""
    out = tmp_path_factory.mktemp("gym_two_ranks")
    return {"ranks": _ranks(out, launch(out, "--gym", "--max-steps", str(GYM_STEPS))), "out": out}


def _moving_rows(micro_batch: dict) -> torch.Tensor:
    """``(B,)`` bool: the rows of a recorded micro-batch whose advantage is not 0 everywhere."""
    from mrtpo.trainer import ZERO_ADVANTAGE_KEY

    return ~torch.tensor(micro_batch["inputs"][ZERO_ADVANTAGE_KEY])


def test_gym_ranks_disagree_on_zero_rows_yet_update_as_many_rows(gym_run):
    """The ranks' zero-advantage rows differ (the per-rank skip aborted such a run in TRL's gather),
    yet in every micro-batch both ran the same number of rows: all their moving rows, padded with
    zero-advantage rows to the larger count; the logged skip count is the rows left out."""
    r0, r1 = gym_run["ranks"]
    assert r0["global_step"] == r1["global_step"] == GYM_STEPS
    assert len(r0["micro_batches"]) == len(r1["micro_batches"]) == GYM_STEPS  # one micro-batch per step
    lines = [json.loads(x) for x in (gym_run["out"] / "run" / "metrics.jsonl").read_text().splitlines()]
    logged = {x["step"]: x["skip/update_completions_skipped"] for x in lines if "skip/update_completions_skipped" in x}
    moving = []
    for step, pair in enumerate(zip(r0["micro_batches"], r1["micro_batches"]), start=1):
        counts = [int(_moving_rows(m).sum()) for m in pair]
        ran = [len(m["kept_zero"]) for m in pair]
        assert ran[0] == ran[1] == max(1, *counts), f"step {step}: moving rows {counts}, rows run {ran}"
        for m, n in zip(pair, counts):
            assert len(m["kept_zero"]) - sum(m["kept_zero"]) == n  # every moving row ran
            assert m["left_out"] == logged[step] == sum(_moving_rows(x).numel() - r for x, r in zip(pair, ran))
        moving.append(counts)
    assert any(a != b for a, b in moving), f"the ranks never disagreed: {moving}"
    assert any(max(m) < 16 for m in moving), f"no step left rows out on both ranks: {moving}"


def test_gym_advantages_equal_one_process_credit_at_every_step(gym_run):
    """At every step, the mrtpo advantages one process computes on the whole global batch (gathered
    rewards, both ranks' relevance), restricted to each rank's rows, equal that rank's advantages."""
    from mrtpo.credit import CreditBatch, get_method

    ranks = gym_run["ranks"]
    for step in range(GYM_STEPS):
        g = _global(ranks, step, pad_id=0)
        record = ranks[0]["steps"][step]
        batch = CreditBatch(
            rewards=_rewards(record),
            group_size=record["group_size"],
            mask=g["credit_mask"],
            relevance=g["relevance"],
            has_evidence=g["has_evidence"],
        )
        _check_rows_match(get_method("mrtpo")(batch, _credit_config(record)), ranks, atol=1e-5, step_index=step)


def _global_micro_batch(pair: list[dict], pad_id: int) -> dict:
    """Both ranks' micro-batches of one step as one process's micro-batch of the global batch."""
    from mrtpo.trainer import SEQUENCE_ADVANTAGES_KEY, ZERO_ADVANTAGE_KEY

    (n0,), (n1,) = ([m["inputs"]["num_items_in_batch"]] for m in pair)
    assert n0 == n1  # the normaliser is already global
    dtypes = pair[0]["dtypes"]
    parts = {k: [torch.tensor(m["inputs"][k], dtype=getattr(torch, dtypes[k])) for m in pair] for k in dtypes}
    left = {"prompt_ids": pad_id, "prompt_mask": 0}
    right = {"completion_ids": pad_id, "completion_mask": 0, "advantages": 0.0}
    batch = {k: _pad_cat(parts[k], left[k], left=True) for k in left}
    batch.update({k: _pad_cat(parts[k], right[k]) for k in right})
    batch.update({k: torch.cat(parts[k]) for k in (SEQUENCE_ADVANTAGES_KEY, ZERO_ADVANTAGE_KEY)})
    batch["num_items_in_batch"] = parts["num_items_in_batch"][0]
    assert set(batch) == set(dtypes)
    return batch


def test_gym_update_gradient_equals_one_process_on_the_global_batch(tmp_path, gym_run):
    """At every optimizer step, the gradient DDP reduced over the two ranks (each running its padded
    rows) equals the gradient of one process's update on the whole global micro-batch (its own row
    skip), from the same parameters; both ranks end with the same parameters."""
    from mrtpo.config import load_config
    from mrtpo.train import build_trainer

    r0, r1 = gym_run["ranks"]
    trainer = build_trainer(load_config(overrides=worker.gym_overrides(str(tmp_path), GYM_STEPS, 32)))
    assert trainer.accelerator.num_processes == 1
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1
    params = dict(trainer.model.named_parameters())
    assert len(r0["updates"]) == len(r1["updates"]) == GYM_STEPS
    for step, (u0, u1) in enumerate(zip(r0["updates"], r1["updates"]), start=1):
        assert u0.keys() == u1.keys() == params.keys()
        with torch.no_grad():
            for name, p in params.items():
                assert torch.equal(u0[name][0], u1[name][0]) and torch.equal(u0[name][1], u1[name][1])
                p.copy_(u0[name][0])
        pair = [r0["micro_batches"][step - 1], r1["micro_batches"][step - 1]]
        trainer.model.zero_grad()
        micro_batch = _global_micro_batch(pair, trainer.processing_class.pad_token_id)
        trainer._compute_loss(trainer.model, micro_batch).backward()
        norm = torch.cat([u0[name][1].flatten() for name in params]).norm()
        assert norm > 1e-3, f"step {step}: no gradient to compare"
        for name, p in params.items():
            torch.testing.assert_close(
                p.grad, u0[name][1], atol=1e-6, rtol=1e-4, msg=lambda m, s=step, n=name: f"step {s}, {n}: {m}"
            )
    for name in r0["params"]:
        assert torch.equal(r0["params"][name], r1["params"][name]), f"parameter {name} differs between ranks"


@pytest.mark.slow
def test_two_process_gym_run_with_defaults_finishes_150_steps(tmp_path):
    """Issue 31's "done when": ``mrtpo train`` of the gym policy on two processes, the row skip on,
    runs its 150 steps (before the row counts were agreed, it aborted at step 3-7 in TRL's gather)."""
    out = tmp_path / "p2"
    proc = torchrun(
        "-m",
        "mrtpo.cli",
        "train",
        "--task",
        "gym-constraints",
        "--model",
        "gym",
        "--output-dir",
        str(out),
        "--max-steps",
        "150",
        "num_generations=8",
        "per_device_train_batch_size=16",
        "max_completion_length=40",
        "learning_rate=3e-4",
        "report=false",
        timeout=900,
    )
    assert proc.returncode == 0, _tails(proc.stdout, proc.stderr)
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [x["step"] for x in lines if "skip/update_completions_skipped" in x]
    assert steps == list(range(1, 151))  # every step updated with the row skip on
    assert (out / "checkpoint-150").is_dir()


CONFIGS = {
    "multi_gpu.yaml": ("MULTI_GPU", 1),
    "zero2.yaml": ("DEEPSPEED", 1),
    "zero3.yaml": ("DEEPSPEED", 1),
    "fsdp2.yaml": ("FSDP", 1),
    "multi_node_zero3.yaml": ("DEEPSPEED", 2),
}


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_example_accelerate_configs_load(name):
    """The example configs of docs/scaling.md parse with accelerate's own loader (which rejects unknown
    top-level keys), and every fsdp_config / deepspeed_config key is an ``accelerate launch`` option.
    (Not run here: there is no GPU, DeepSpeed or NCCL on this machine.)"""
    import yaml
    from accelerate.commands.config.config_args import load_config_from_file
    from accelerate.commands.launch import launch_command_parser

    path = ROOT.parent / "configs" / "accelerate" / name
    config = load_config_from_file(str(path))
    kind, machines = CONFIGS[name]
    assert str(config.distributed_type).endswith(kind) and config.num_machines == machines
    assert config.num_processes % machines == 0 and not config.use_cpu
    options = {action.dest for action in launch_command_parser()._actions}
    raw = yaml.safe_load(path.read_text())
    for section in ("fsdp_config", "deepspeed_config"):
        unknown = [key for key in raw.get(section, {}) if key not in options]
        assert not unknown, f"{name}: {section} keys accelerate launch does not know: {unknown}"
    if kind == "DEEPSPEED":
        assert raw["deepspeed_config"]["zero_stage"] == (2 if "zero2" in name else 3)
