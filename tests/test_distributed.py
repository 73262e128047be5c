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
    """Run the worker under ``torchrun --standalone`` (free port chosen by torchrun), in its own
    process group so a timeout kills every rank, not only the launcher."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
           str(WORKER_PATH), str(out_dir), *extra]
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_HUB_DISABLE_TELEMETRY="1", TOKENIZERS_PARALLELISM="false",
               OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
        pytest.fail(f"torchrun did not finish within {timeout} s (a rank hung?)\n{_tails(stdout, stderr)}")
    return subprocess.CompletedProcess(cmd, proc.returncode, stdout, stderr)


def _tails(stdout: str, stderr: str, n: int = 12000) -> str:
    return f"--- stdout (tail) ---\n{stdout[-n:]}\n--- stderr (tail) ---\n{stderr[-n:]}"


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("two_ranks")
    proc = launch(out, "--simulate-sharded")
    if proc.returncode != 0:
        pytest.fail(f"two-process run failed with exit code {proc.returncode}\n{_tails(proc.stdout, proc.stderr)}")
    ranks = []
    for r in range(2):
        path = out / f"rank{r}.json"
        if not path.exists():
            pytest.fail(f"rank {r} wrote no {path.name}\n{_tails(proc.stdout, proc.stderr)}")
        record = json.loads(path.read_text())
        record["params"] = torch.load(out / f"rank{r}_params.pt")
        ranks.append(record)
    return {"ranks": ranks, "out": out}


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


def _global(ranks: list[dict]) -> dict:
    """The global batch, rank 0's rows then rank 1's, as one process would hold it."""
    steps = [r["first_step"] for r in ranks]
    pad_id = worker_tokenizer().pad_token_id
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


def _check_rows_match(global_adv: torch.Tensor, ranks: list[dict], atol: float) -> None:
    for r in ranks:
        step = r["first_step"]
        local = torch.tensor(step["advantages"])
        start, stop = step["rows"]
        t = local.shape[1]
        torch.testing.assert_close(local, global_adv[start:stop, :t], atol=atol, rtol=0,
                                   msg=lambda m, rank=r["rank"]: f"rank {rank}: {m}")
        assert torch.all(global_adv[start:stop, t:] == 0)  # beyond this rank's padding: masked


def test_two_real_processes_share_one_global_batch(run):
    """A real two-process gloo run, and the batch layout the other checks rely on."""
    r0, r1 = run["ranks"]
    for r in (r0, r1):
        assert r["num_processes"] == 2 and r["world_size_env"] == 2
        assert r["distributed_type"].endswith("MULTI_CPU")
        assert r["global_step"] == 2
    s0, s1 = r0["first_step"], r1["first_step"]
    assert s0["rows"] == [0, 6] and s1["rows"] == [6, 12]
    assert s0["rewards"] == s1["rewards"] and len(s0["rewards"]) == 12  # gathered: the global batch on both
    ids = [row["example_id"] for row in s0["inputs"] + s1["inputs"]]
    groups = [ids[i:i + 4] for i in range(0, 12, 4)]
    assert all(len(set(g)) == 1 for g in groups), groups  # rows ordered group by group across ranks
    assert ids[4:6] == ids[6:8]  # the middle group straddles the ranks


def test_gathered_rewards_are_the_ranks_own_completions(run):
    """Rewards recomputed from each rank's decoded completions equal its rows of the gathered matrix."""
    tok = worker_tokenizer()
    for r in run["ranks"]:
        step = r["first_step"]
        completions = []
        for ids, mask in zip(step["completion_ids"], step["completion_mask"]):
            text = tok.decode([i for i, m in zip(ids, mask) if m], skip_special_tokens=True)
            completions.append([{"role": "assistant", "content": text}])
        columns = {key: [row[key] for row in step["inputs"]] for key in ("keyword", "gold", "kind", "example_id")}
        expected = torch.tensor([[math.nan if v is None else v for v in f(completions=completions, **columns)]
                                 for f in worker.build_rewards()]).T
        start, stop = step["rows"]
        torch.testing.assert_close(_rewards(step)[start:stop], expected, equal_nan=True)


def test_local_advantages_equal_rows_of_the_one_process_computation(run):
    """The mrtpo advantages of the whole global batch, computed once (no ``rows``), restricted to each
    rank's rows, equal that rank's local advantages; their token means are the global GDPO ones."""
    from mrtpo.credit import CreditBatch, gdpo_advantages, get_method

    ranks = run["ranks"]
    g = _global(ranks)
    step0 = ranks[0]["first_step"]
    rewards = _rewards(step0)
    batch = CreditBatch(rewards=rewards, group_size=step0["group_size"], mask=g["credit_mask"],
                        relevance=g["relevance"], has_evidence=g["has_evidence"])
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
    trainer = MRTPOTrainer(model=model, processing_class=tok, reward_funcs=worker.build_rewards(),
                           args=worker.build_config(str(tmp_path), "mrtpo", 1, per_device_train_batch_size=12),
                           train_dataset=worker.build_dataset())
    assert trainer.accelerator.num_processes == 1
    model.train()  # the trainer replays in training mode
    step0 = ranks[0]["first_step"]
    coefficients = reward_coefficients(_rewards(step0), step0["group_size"], step0["credit_config"]["reward_weights"])
    maps = trainer._replay(g["inputs"], {k: g[k] for k in ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask")},
                           coefficients)
    torch.testing.assert_close(maps["relevance"], g["relevance"], atol=1e-5, rtol=1e-4)
    assert torch.equal(maps["has_evidence"], g["has_evidence"])
    batch = CreditBatch(rewards=_rewards(step0), group_size=step0["group_size"], mask=g["credit_mask"],
                        relevance=maps["relevance"], has_evidence=maps["has_evidence"])
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
    has0 = torch.tensor(r0["first_step"]["has_evidence"])
    has1 = torch.tensor(r1["first_step"]["has_evidence"])
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
    step0 = ranks[0]["first_step"]
    batch = CreditBatch(rewards=_rewards(step0), group_size=step0["group_size"], mask=g["credit_mask"],
                        relevance=g["relevance"], has_evidence=g["has_evidence"])
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


@pytest.mark.slow
def test_evidence_error_on_one_rank_stops_the_whole_run(tmp_path):
    """A dataset row whose evidence is not in its prompt, held by one rank only, fails the run with the
    error naming the reward and example; the other rank does not hang."""
    proc = launch(tmp_path, "--missing-evidence-in", "p2", "--max-steps", "1", timeout=300)
    output = proc.stdout + proc.stderr
    assert proc.returncode != 0, _tails(proc.stdout, proc.stderr)
    assert "EvidenceNotFoundError" in output and "'keyword_rule' for example 'p2'" in output, _tails(proc.stdout, proc.stderr)


CONFIGS = {"multi_gpu.yaml": ("MULTI_GPU", 1), "zero2.yaml": ("DEEPSPEED", 1), "zero3.yaml": ("DEEPSPEED", 1),
           "fsdp2.yaml": ("FSDP", 1), "multi_node_zero3.yaml": ("DEEPSPEED", 2)}


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
