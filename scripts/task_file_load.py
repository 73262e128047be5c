"""Start-up cost of a large task file: wall time and peak RSS of loading an N-row task file (issue 41).

    OMP_NUM_THREADS=1 PYTHONPATH=src .venv/bin/python scripts/task_file_load.py --rows 10 100000

Writes a task folder (``data.jsonl`` of N one-line rows, a reward with ``@evidence`` and a plain one,
``eval_fraction: 0.1``), then times a fresh Python process that imports mrtpo, resolves a config naming
the task file and runs everything a run does before its model loads: ``load_task_data`` (the task's
examples, the evidence-in-prompt check, the ids) and the trainer's dataset (``trainer_dataset``). Twice:
with an empty ``datasets`` cache (the first load parses the file into Arrow) and again with that cache.
Peak RSS is the child's ``ru_maxrss`` (the whole process, imports included); a 10-row file shows the
floor every load pays (imports: transformers, TRL, datasets).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REWARDS = """\
from mrtpo import evidence

@evidence("rule")
def no_commas(prompts, completions, **kwargs):
    return [0.0 if "," in c else 1.0 for c in completions]

def length(prompts, completions, **kwargs):
    return [min(len(c), 50) / 50 for c in completions]
"""

TASK = """\
task:
  dataset: data.jsonl
  prompt: prompt
  eval_fraction: 0.1
  rewards:
    rewards.py:no_commas: 1.0
    rewards.py:length: 1.0
"""


def write_task(folder: Path, rows: int) -> Path:
    """A task folder of ``rows`` one-line rows; returns its YAML file."""
    folder.mkdir(parents=True, exist_ok=True)
    with (folder / "data.jsonl").open("w") as f:
        for i in range(rows):
            f.write(
                json.dumps({"prompt": f"Write about item {i}. No commas please.", "rule": "No commas please.", "n": i})
            )
            f.write("\n")
    (folder / "rewards.py").write_text(REWARDS)
    (folder / "task.yaml").write_text(TASK)
    return folder / "task.yaml"


def child(task: str) -> None:
    """Runs in the measured process: prints one JSON line of timings."""
    t0 = time.perf_counter()
    import datasets  # noqa: F401 -- the imports a load pays anyway, timed on their own

    import mrtpo.tasks.from_config  # noqa: F401
    import mrtpo.trainer.config  # noqa: F401
    from mrtpo.config import load_config
    from mrtpo.run_build import load_task_data, trainer_dataset

    t1 = time.perf_counter()
    config = load_config([], {"task": task})  # loads the task (its reward weights and names)
    t2 = time.perf_counter()
    data = load_task_data(config)
    t3 = time.perf_counter()
    rows = trainer_dataset(data.task, data.train)
    t4 = time.perf_counter()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(
        json.dumps(
            {
                "imports_s": round(t1 - t0, 2),
                "load_config_s": round(t2 - t1, 2),
                "load_task_data_s": round(t3 - t2, 2),
                "trainer_dataset_s": round(t4 - t3, 2),
                "train": len(data.train),
                "trainer_rows": len(rows),
                "peak_rss_mb": round(peak),
            }
        )
    )


def measure(task: Path, cache: Path) -> dict:
    env = {**os.environ, "HF_DATASETS_CACHE": str(cache), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    t0 = time.perf_counter()
    done = subprocess.run(
        [sys.executable, __file__, "--child", str(task)], env=env, capture_output=True, text=True, check=False
    )
    wall = time.perf_counter() - t0
    if done.returncode != 0:
        raise SystemExit(done.stderr[-3000:])
    return {"wall_s": round(wall, 2), **json.loads(done.stdout.strip().splitlines()[-1])}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, nargs="+", default=[10, 100_000], help="row counts to measure")
    p.add_argument("--child", metavar="TASK", help=argparse.SUPPRESS)
    ns = p.parse_args()
    if ns.child:
        child(ns.child)
        return
    for rows in ns.rows:
        with tempfile.TemporaryDirectory() as tmp:
            task = write_task(Path(tmp) / "task", rows)
            cache = Path(tmp) / "hf-datasets-cache"
            for run in ("empty datasets cache", "cached"):
                print(json.dumps({"rows": rows, "run": run, **measure(task, cache)}), flush=True)


if __name__ == "__main__":
    main()
