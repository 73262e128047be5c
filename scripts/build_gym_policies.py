"""Build the gym's shipped warm-started policies and pin them (sha256) in the package.

Every family's default settings, warm-start seeds 0, 1, 2 (``task_args={policy: {seed: s}}``), each
built by :func:`mrtpo.gym.policy.warm_start` in a scratch cache and copied to
``src/mrtpo/gym/policies/<task>-<digest>/`` (the folder name the cache would give it), with every
file's sha256 in ``MANIFEST.json``. Afterwards set ``SHIPPED_MANIFEST_SHA256`` in
``mrtpo/gym/shipped.py`` to the manifest's sha256, which this script prints.

    OMP_NUM_THREADS=1 .venv/bin/python scripts/build_gym_policies.py --jobs 2
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import tempfile
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

FAMILIES = ("gym-constraints", "gym-answer", "gym-call", "gym-overlap", "gym-tradeoff", "gym-long")
SEEDS = (0, 1, 2)
POLICIES = Path(__file__).resolve().parents[1] / "src" / "mrtpo" / "gym" / "policies"


def _build(family: str, seed: int, cache: str) -> str:
    import torch

    torch.set_num_threads(1)
    from mrtpo.gym.policy import ensure_warm_start
    from mrtpo.tasks import get_task

    task = get_task(family, policy={"seed": seed})
    return str(ensure_warm_start(task, cache_dir=cache))


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=2, help="warm starts built at once (one thread each)")
    parser.add_argument("--families", default=",".join(FAMILIES))
    parser.add_argument("--seeds", default=",".join(map(str, SEEDS)))
    args = parser.parse_args()
    from mrtpo.machine import machine_info

    cache = tempfile.mkdtemp(prefix="mrtpo-gym-policies-")
    jobs = [(f, int(s)) for f in args.families.split(",") for s in args.seeds.split(",")]
    with ProcessPoolExecutor(args.jobs) as pool:
        built = list(pool.map(_build, *zip(*jobs), [cache] * len(jobs)))
    manifest_path = POLICIES / "MANIFEST.json"
    manifest = json.loads(manifest_path.read_text()) if manifest_path.exists() else {"policies": {}}
    for (family, seed), folder in zip(jobs, built):
        source = Path(folder)
        target = POLICIES / source.name
        shutil.rmtree(target, ignore_errors=True)
        shutil.copytree(source, target)
        record = json.loads((target / "gym_warm_start.json").read_text())
        manifest["policies"][source.name] = {
            "task": family,
            "policy_seed": seed,
            "seconds": record["seconds"],
            "final_loss": record["final_loss"],
            "files": {p.name: _sha256(p) for p in sorted(target.iterdir()) if p.is_file()},
        }
        print(f"{source.name}: {family} seed {seed}, loss {record['final_loss']:.3f}, {record['seconds']} s")
    manifest["built_on"] = machine_info()["summary"]
    manifest_path.write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    shutil.rmtree(cache, ignore_errors=True)
    print(f"MANIFEST.json sha256: {_sha256(manifest_path)}")


if __name__ == "__main__":
    main()
