"""The command line as a user runs it (subprocesses, like CleanRL's smoke tests)."""

import subprocess
import sys


def run(*args):
    return subprocess.run([sys.executable, "-m", "mrtpo.cli", *args], capture_output=True, text=True, timeout=120)


def test_usage_lists_every_command():
    done = run("--help")
    assert done.returncode == 0
    for command in ("train", "eval", "explain", "demo", "bench"):
        assert command in done.stdout


def test_unknown_command_is_a_clear_error():
    done = run("trian")
    assert done.returncode == 2 and "unknown command 'trian'" in done.stderr


def test_version_and_bench_usage():
    import mrtpo

    assert run("version").stdout.strip() == mrtpo.__version__
    done = run("bench", "nothing")
    assert done.returncode == 2 and "relevance" in done.stderr


def test_top_level_imports_of_the_user_facing_api():
    done = subprocess.run(
        [sys.executable, "-c", "from mrtpo import MRTPOConfig, MRTPOTrainer, evidence, Evidence, VerifierReward; "
         "import mrtpo.credit as c; print(c.gdpo_advantages, c.js_distance, c.token_advantages)"],
        capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 0, done.stderr
    import mrtpo

    try:
        mrtpo.NotAThing  # noqa: B018
    except AttributeError as exc:
        assert "NotAThing" in str(exc)
    else:
        raise AssertionError("unknown attribute did not raise")
