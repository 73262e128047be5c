"""Copy each finished run of a `bench learn` folder to a small digest in a docs folder, once.

A digest is the run's finished.json, its per-step rewards (total and per slot) and step times, and its
held-out evaluations: what the results pages' figures are computed from.

    .venv/bin/python scripts/gym_digest.py runs/gym-long docs/results/gym-long-runs
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def digest(run: Path) -> dict:
    steps = [r for r in _jsonl(run / "metrics.jsonl") if "reward" in r and "train_runtime" not in r]
    slots = sorted({k for r in steps for k in r if k.startswith("rewards/") and k.endswith("/mean")})
    per_step = {
        "step": [r["step"] for r in steps],
        "reward": [round(r["reward"], 5) for r in steps],
        "step_time": [round(r.get("step_time", float("nan")), 4) for r in steps],
    }
    per_step.update({k: [round(r.get(k, float("nan")), 5) for r in steps] for k in slots})
    return {
        "finished": json.loads((run / "finished.json").read_text()),
        "per_step": per_step,
        "eval": _jsonl(run / "eval.jsonl"),
    }


def main() -> None:
    src, dst = Path(sys.argv[1]), Path(sys.argv[2])
    dst.mkdir(parents=True, exist_ok=True)
    for run in sorted(src.iterdir()):
        out = dst / f"{run.name}.json"
        if (run / "finished.json").exists() and not out.exists():
            out.write_text(json.dumps(digest(run), separators=(",", ":")))
            print("digest", out)


if __name__ == "__main__":
    main()
