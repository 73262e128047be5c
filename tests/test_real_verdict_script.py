"""scripts/real_verdict.py: the plan expands to the design's runs, the learning rate is chosen from
the tuning digests, finished runs are skipped, a digest is computed from a run folder by hand, and
the GPU recipe resolves to the design's shape (dry runs only: nothing trains here)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "real_verdict.py"


@pytest.fixture(scope="module")
def rv():
    spec = importlib.util.spec_from_file_location("real_verdict", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_plan_expands_to_the_designs_runs(rv):
    design = rv.read_design()
    runs = rv.expand(design)
    names = [r["name"] for r in runs]
    assert len(names) == len(set(names))
    tune = [r for r in runs if r["phase"] == "tune"]
    verdict = [r for r in runs if r["phase"] == "verdict"]
    assert len(tune) == 2 * 3 * 2  # 2 methods x {1e-5, 3e-5, 1e-4} x 2 tuning seeds
    assert {r["learning_rate"] for r in tune} == {1e-5, 3e-5, 1e-4}
    assert not {r["seed"] for r in tune} & set(design["seeds"])  # tuning never on the verdict's seeds
    count = {role: sum(r["role"] == role for r in verdict) for role in ("baseline", "treatment", "control", "oracle")}
    assert count == {"baseline": 8, "treatment": 8, "control": 4, "oracle": 4}
    assert [r["method"] for r in verdict[:4]] == ["gdpo", "mrtpo", "mrtpo-shuffled", "oracle"]  # paired by seed
    assert runs.index(tune[-1]) < runs.index(verdict[0])


def test_auc_is_the_curves_mean_height(rv):
    # trapezoids 50 x 0.3 + 50 x 0.4 + 50 x 0.5 = 60 over 150 steps
    assert rv.auc([(0, 0.2), (50, 0.4), (100, 0.4), (150, 0.6)]) == pytest.approx(0.4)
    assert rv.auc([(100, 0.5), (0, 0.5)]) == pytest.approx(0.5)


def _tuning_digest(folder, method, lr, seed, value, rv):
    name = f"tune-{method}-lr{rv.lr_text(lr)}-seed{seed}"
    (folder / f"{name}.json").write_text(json.dumps({"name": name, "learning_rate": lr, "held_out_auc": value}))


def test_learning_rate_from_the_tuning_digests(rv, tmp_path):
    design = rv.read_design()
    folder = tmp_path / "cpu"
    folder.mkdir()
    for lr, values in ((1e-5, (0.30, 0.40)), (3e-5, (0.50, 0.30)), (1e-4, (0.36, 0.34))):
        for seed, value in zip((100, 101), values):
            _tuning_digest(folder, "gdpo", lr, seed, value, rv)
    digests = rv.read_digests(folder)
    # means: 1e-5 -> 0.35, 3e-5 -> 0.40, 1e-4 -> 0.35
    assert rv.chosen_lr(design, "baseline", digests) == 3e-5
    assert rv.chosen_lr(design, "treatment", digests) is None  # no mrtpo tuning digest yet
    for lr in (1e-5, 3e-5, 1e-4):
        for seed in (100, 101):
            _tuning_digest(folder, "mrtpo", lr, seed, 0.5 if lr != 3e-5 else 0.2, rv)
    digests = rv.read_digests(folder)
    assert rv.chosen_lr(design, "treatment", digests) == 1e-5  # a tie between 1e-5 and 1e-4: the smaller
    assert rv.chosen_lr(design, "control", digests) == 1e-5  # the control takes the treatment's rate

    rows = {r["name"]: r for r in rv.status({**design, "oracle": "no-such-method"}, "cpu", {}, tmp_path)}
    assert all(r["state"] == "done" for n, r in rows.items() if n.startswith("tune-"))
    assert rows["verdict-gdpo-seed0"]["state"] == "pending" and rows["verdict-gdpo-seed0"]["learning_rate"] == 3e-5
    assert rows["verdict-mrtpo-shuffled-seed3"]["learning_rate"] == 1e-5
    assert rows["verdict-no-such-method-seed0"]["state"] == "blocked"
    assert "verdict-mrtpo-shuffled-seed4" not in rows  # the control runs on 4 seeds only


def test_dry_run_prints_the_pending_runs_and_writes_nothing(tmp_path):
    digests, runs = tmp_path / "digests", tmp_path / "runs"
    (digests / "cpu").mkdir(parents=True)
    (digests / "cpu" / "tune-gdpo-lr1e-5-seed100.json").write_text(json.dumps({"learning_rate": 1e-5}))
    command = [sys.executable, str(SCRIPT), "run", "--dry-run", "--digests", str(digests), "--runs", str(runs)]
    r = subprocess.run(
        command,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env={"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin"},
    )
    assert r.returncode == 0, r.stderr
    lines = [line for line in r.stdout.splitlines() if "bench learn" in line]
    assert len(lines) == 11  # the 12 tuning runs less the one whose digest exists; verdict runs wait
    assert "tune-gdpo-lr1e-5-seed100" not in r.stdout and "tune-gdpo-lr1e-5-seed101" in lines[0]
    assert "--methods gdpo --seeds 101" in lines[0] and "learning_rate=1e-05" in lines[0]
    assert not runs.exists()
    assert sorted(p.name for p in (digests / "cpu").iterdir()) == ["tune-gdpo-lr1e-5-seed100.json"]


def test_digest_of_a_run_folder(rv, tmp_path):
    from mrtpo.tasks.instructions.task import InstructionsTask

    classes = ["keywords:existence", "keywords:forbidden_words", "detectable_content:postscript"]
    task = InstructionsTask(train_size=4, min_constraints=3, max_constraints=3, classes=classes)
    held = task.load("eval", limit=2)
    examples = {e.id: e for e in held}
    inner = tmp_path / "gdpo-seed3"
    inner.mkdir()
    (inner / "finished.json").write_text(
        json.dumps(
            {
                "steps": 2,
                "wall_s": 9.0,
                "train_s": 7.0,
                "eval_s": 1.0,
                "date": "2026-12-07",
                "settings": {"max_steps": 2},
            }
        )
    )
    (inner / "metrics.jsonl").write_text(
        "\n".join(
            json.dumps(r)
            for r in (
                {"step": 1, "reward": 1.0, "rewards/constraint_1/mean": 0.5, "time/update": 2.0, "loss": 0.1},
                {"step": 2, "reward": 2.0, "rewards/constraint_1/mean": 1.0, "time/update": 3.0},
                {"train_runtime": 5.0},
            )
        )
        + "\n"
    )

    def kw(e, cid, key):
        return next(c["kwargs"][key] for c in e.gold["constraints"] if c["id"] == cid)

    def meets_all(e):
        words = " ".join(kw(e, "keywords:existence", "keywords"))
        return f"{words}.\n\n{kw(e, 'detectable_content:postscript', 'postscript_marker')} ok"

    forbidden = kw(held[1], "keywords:forbidden_words", "forbidden_words")[0]
    outputs = [
        {"step": 0, "id": held[0].id, "output": "nothing"},  # only the forbidden-word constraint
        {"step": 0, "id": held[1].id, "output": "nothing"},
        {"step": 2, "id": held[0].id, "output": meets_all(held[0])},  # all three
        {"step": 2, "id": held[1].id, "output": f"{forbidden} {meets_all(held[1])}"},
    ]  # two of three
    (inner / "eval_outputs.jsonl").write_text("\n".join(json.dumps(o) for o in outputs) + "\n")
    run = {
        "name": "verdict-gdpo-seed3",
        "phase": "verdict",
        "role": "baseline",
        "method": "gdpo",
        "seed": 3,
        "learning_rate": 3e-5,
    }
    d = rv.digest(run, tmp_path, examples, {"summary": "a CPU", "cpu": "Xeon", "cpu_flags": ["amx_bf16"]})
    assert d["train"]["step"] == [1, 2] and d["train"]["reward"] == [1.0, 2.0]
    assert d["train"]["time/update"] == [2.0, 3.0] and "loss" not in d["train"]
    assert [h["step"] for h in d["held_out"]] == [0, 2]
    assert d["held_out"][0]["satisfaction"] == pytest.approx(2 / 6) and d["held_out"][0]["prompt_all"] == 0.0
    assert d["held_out"][1]["satisfaction"] == pytest.approx(5 / 6) and d["held_out"][1]["prompt_all"] == 0.5
    assert d["held_out"][1]["per_class"] == {
        "detectable_content:postscript": 1.0,
        "keywords:existence": 1.0,
        "keywords:forbidden_words": 0.5,
    }
    assert d["held_out_auc"] == pytest.approx((2 / 6 + 5 / 6) / 2)
    assert d["machine"]["cpu"] == "Xeon" and d["cpu_flags"] == ["amx_bf16"] and d["learning_rate"] == 3e-5


@pytest.mark.parametrize("machine", ["cpu", "gpu"])
def test_presets_resolve_to_the_designs_shape(rv, machine):
    """Each machine's preset is a valid training config for the task (the GPU one with use_cpu and
    bf16 turned off here, the only keys a CPU cannot check), and the task it builds has three
    constraints per prompt from the preset's classes."""
    from mrtpo.bench.learn.plan import read_preset
    from mrtpo.config import load_config
    from mrtpo.tasks import get_task

    design = rv.read_design()
    train, bench = read_preset(design["presets"][machine], design["task"])
    cpu_only = {"use_cpu": True, "bf16": False} if machine == "gpu" else {}
    config = load_config([], {**train, **cpu_only, "task": design["task"], "method": "gdpo", "seed": 0})
    shape = (
        config.args.per_device_train_batch_size // config.args.num_generations,
        config.args.num_generations,
        config.args.max_completion_length,
        config.args.max_steps,
    )
    assert shape == {"cpu": (2, 8, 64, 120), "gpu": (4, 8, 128, 100)}[machine]
    assert config.run.lora_r == 16 and config.run.model == "qwen2.5-coder-0.5b"
    # held-out at 4 points: 0, every eval_every, and the end
    points = sorted({0, *range(bench["eval_every"], shape[3] + 1, bench["eval_every"]), shape[3]})
    assert len(points) == 4 and bench["eval_size"] == 128
    task = get_task(design["task"], **train["task_args"])
    examples = task.load("train", limit=6)
    assert all({c["id"] for c in e.gold["constraints"]} == set(train["task_args"]["classes"]) for e in examples)


def test_gpu_check_runs_the_verdict_on_the_gpu_preset(tmp_path):
    """``scripts/gpu_check.sh --verdict`` hands its arguments to the script with the GPU preset."""
    r = subprocess.run(
        [
            "bash",
            str(ROOT / "scripts" / "gpu_check.sh"),
            "--verdict",
            "--dry-run",
            "--limit",
            "2",
            "--digests",
            str(tmp_path / "d"),
            "--runs",
            str(tmp_path / "r"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env={"PYTHON": sys.executable, "PATH": "/usr/bin:/bin"},
    )
    assert r.returncode == 0, r.stderr
    lines = [line for line in r.stdout.splitlines() if "bench learn" in line]
    assert len(lines) == 2 and all("real-verdict-gpu.yaml" in line for line in lines)
    assert "--output-dir " + str(tmp_path / "r" / "gpu" / "tune-gdpo-lr1e-5-seed100") in lines[0]


def test_compare_pairs_by_seed_and_applies_the_rule(rv):
    design = rv.read_design()

    def d(role, seed, auc, final):
        return {
            "phase": "verdict",
            "role": role,
            "seed": seed,
            "held_out_auc": auc,
            "held_out": [{"satisfaction": 0.0}, {"satisfaction": final}],
        }

    digests = {}
    for seed, (g, t) in enumerate(((0.30, 0.40), (0.20, 0.26), (0.25, 0.33))):  # differences 0.10, 0.06, 0.08
        digests[f"g{seed}"], digests[f"t{seed}"] = d("baseline", seed, g, g), d("treatment", seed, t, t)
    digests["t9"] = d("treatment", 9, 0.9, 0.9)  # no GDPO partner: left out
    result = rv.compare(design, digests)
    auc = result["treatment-gdpo"]["auc"]
    assert auc["n"] == 3 and auc["mean_difference"] == pytest.approx(0.08)
    half = 4.302653 * 0.02 / 3**0.5  # t(0.975, 2) x sd 0.02 / sqrt(3)
    assert auc["ci95"] == pytest.approx([0.08 - half, 0.08 + half], rel=1e-4)
    assert result["verdict"] == "token credit wins (provisional: 3 of 8 pairs)"
    assert result["treatment-control"]["auc"]["n"] == 0
    digests["t1"] = d("treatment", 1, 0.05, 0.05)  # differences 0.10, -0.15, 0.08: the interval spans 0
    assert rv.compare(design, digests)["verdict"].startswith("tie: the gains the seeds do not rule out lie in [")
