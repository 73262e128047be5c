"""Plant each bug of issue 42 into a temporary copy of ``src/``, one at a time, and run the tests that guard it.

    OMP_NUM_THREADS=1 python scripts/mutation_check.py              # every bug
    OMP_NUM_THREADS=1 python scripts/mutation_check.py w_max_dropped tool_mask_ignored

Each bug is one textual edit of the trainer or the replay (the old text must occur exactly once, so a
refactor that moves it fails here loudly instead of planting nothing). The copy goes first on
``PYTHONPATH`` (the script checks that ``mrtpo`` is imported from it); the real files are never touched.
Prints, per bug, the default-suite tests that failed (or errored); exits 1 if any bug survives (no test failed).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CORE, REPLAY_STEP, REPLAY = "mrtpo/trainer/core.py", "mrtpo/trainer/replay_step.py", "mrtpo/replay.py"
SETTINGS = "tests/test_trainer_settings.py"
DIRECTIONS = "tests/test_replay_directions.py"
RESUME = "tests/test_trainer_resume_settings.py"

#: name -> (file under src/, text, its replacement, test files to run)
MUTATIONS: dict[str, tuple[str, str, str, list[str]]] = {
    "replay_without_temperature": (
        REPLAY_STEP,
        "            temperature=self.temperature,\n",
        "            temperature=1.0,\n",
        [SETTINGS],
    ),
    "relevance_always_js": (REPLAY_STEP, "kind=self.args.relevance,", 'kind="js",', [SETTINGS]),
    "relevance_top_k_ignored": (REPLAY_STEP, "top_k=self.args.relevance_top_k,", "top_k=None,", [SETTINGS]),
    "w_max_dropped": (CORE, "w_max=self.args.w_max,", "w_max=None,", [SETTINGS]),
    "reward_weights_dropped": (
        CORE,
        "reward_weights=self.reward_weights.tolist(),",
        "reward_weights=None,",
        [SETTINGS],
    ),
    "tool_mask_ignored": (CORE, 'mask = mask * out["tool_mask"].float().cpu()', "mask = mask", [SETTINGS]),
    "replay_contexts_swapped": (
        REPLAY,
        'with_rows.append(reference if placement == "in_prompt" else other)\n'
        '                without_rows.append(other if placement == "in_prompt" else reference)',
        'with_rows.append(other if placement == "in_prompt" else reference)\n'
        '                without_rows.append(reference if placement == "in_prompt" else other)',
        [DIRECTIONS, SETTINGS],
    ),
    # further hops of the same chain
    "lam_dropped": (CORE, "lam=self.args.lam,", "lam=1.0,", [SETTINGS]),
    "reward_lam_dropped": (CORE, "reward_lam=self.args.reward_lam,", "reward_lam=None,", [SETTINGS]),
    "credit_batch_norm_dropped": (CORE, "batch_norm=self.args.credit_batch_norm,", "batch_norm=True,", [SETTINGS]),
    "privileged_header_dropped": (REPLAY_STEP, "            header=self.args.privileged_header,\n", "", [SETTINGS]),
    "method_ignored": (
        CORE,
        "self.credit_method = get_method(self.args.method)",
        'self.credit_method = get_method("mrtpo")',
        [SETTINGS],
    ),
    "kernel_without_temperature": (
        REPLAY,
        "chunk_size, temperature, top_k",
        "chunk_size, 1.0, top_k",
        [DIRECTIONS, SETTINGS],
    ),
    "entropy_without_temperature": (
        REPLAY,
        "                chunk_size,\n                temperature,\n            )",
        "                chunk_size,\n                1.0,\n            )",
        [SETTINGS],
    ),
    # the config hop: a resume that does not read the run folder's config.yaml runs under the defaults
    "resume_ignores_config_yaml": ("mrtpo/train.py", "if saved.is_file():", "if False:", [RESUME]),
}


def planted_copy(name: str, workdir: Path) -> Path:
    """``workdir/src``: a copy of ``src/`` with bug ``name`` planted; returns the copy's root."""
    path, old, new, _ = MUTATIONS[name]
    src = workdir / "src"
    shutil.copytree(ROOT / "src", src, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    target = src / path
    text = target.read_text()
    if text.count(old) != 1:
        raise SystemExit(f"{name}: the text to change occurs {text.count(old)} times in src/{path}, not once")
    target.write_text(text.replace(old, new))
    return src


def run_tests(src: Path, files: list[str]) -> tuple[int, list[str], float]:
    """Run ``files`` (default suite: not slow) against ``src``; the return code, failed test ids and seconds."""
    env = dict(os.environ, PYTHONPATH=str(src), OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
    where = subprocess.run(
        [sys.executable, "-c", "import mrtpo; print(mrtpo.__file__)"],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    if not where.startswith(str(src)):
        raise SystemExit(f"mrtpo is imported from {where}, not from the planted copy {src}")
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rfE", *files],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    failed = re.findall(r"^(?:FAILED|ERROR) (\S+)", proc.stdout, flags=re.MULTILINE)  # a fixture error fails too
    return proc.returncode, failed, time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help=f"bugs to plant (default: all): {', '.join(MUTATIONS)}")
    ns = parser.parse_args(argv)
    names = ns.names or list(MUTATIONS)
    unknown = [n for n in names if n not in MUTATIONS]
    if unknown:
        parser.error(f"unknown bug {unknown}; choose from {', '.join(MUTATIONS)}")
    survived = []
    for name in names:
        path, _, _, files = MUTATIONS[name]
        with tempfile.TemporaryDirectory(prefix=f"mutant-{name}-") as tmp:
            rc, failed, seconds = run_tests(planted_copy(name, Path(tmp)), files)
        caught = rc != 0 and failed
        print(
            f"{name} (src/{path}): {'CAUGHT' if caught else 'SURVIVED'} by {len(failed)} failing test(s) "
            f"in {seconds:.0f} s [{' '.join(files)}]",
            flush=True,
        )
        for test in failed:
            print(f"    {test}")
        if not caught:
            survived.append(name)
            if rc not in (0, 1):
                print(f"    (pytest exit code {rc}: the run itself failed)")
    print(
        f"{len(names) - len(survived)} of {len(names)} planted bugs caught"
        + (f"; survived: {', '.join(survived)}" if survived else "")
    )
    return 1 if survived else 0


if __name__ == "__main__":
    sys.exit(main())
