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
        [
            sys.executable,
            "-c",
            "from mrtpo import MRTPOConfig, MRTPOTrainer, evidence, Evidence, VerifierReward; "
            "import mrtpo.credit as c; print(c.gdpo_advantages, c.js_distance, c.token_advantages)",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    import mrtpo

    try:
        mrtpo.NotAThing  # noqa: B018
    except AttributeError as exc:
        assert "NotAThing" in str(exc)
    else:
        raise AssertionError("unknown attribute did not raise")


# --------------------------------------------------------------------------------------------
# Conventions shared by every command (issue 32, item 5).
# --------------------------------------------------------------------------------------------
import argparse  # noqa: E402
import logging  # noqa: E402

import pytest  # noqa: E402

from mrtpo import cli  # noqa: E402
from mrtpo.bench import BENCHMARKS, describe  # noqa: E402

COMMAND_HELPS = [["train"], ["sft"], ["eval"], ["explain"], ["demo"], *(["bench", name] for name in BENCHMARKS)]
#: Commands that write a folder: all of them name it --output-dir.
FOLDER_COMMANDS = [["train"], ["sft"], ["eval"], ["demo"], ["bench", "learn"], ["bench", "gpu"]]


@pytest.fixture(autouse=True)
def _restore_mrtpo_logger():
    """``cli.main`` configures the ``mrtpo`` logger; put it back so other tests see Python's defaults."""
    logger = logging.getLogger("mrtpo")
    level, handlers = logger.level, list(logger.handlers)
    yield
    logger.setLevel(level)
    logger.handlers[:] = handlers


def _help(argv, monkeypatch, capsys):
    """``mrtpo <argv> --help`` in this process: the parser it built and what it printed."""
    parsers = []
    parse = argparse.ArgumentParser.parse_known_args

    def spy(self, *args, **kwargs):
        parsers.append(self)
        return parse(self, *args, **kwargs)

    monkeypatch.setattr(argparse.ArgumentParser, "parse_known_args", spy)
    with pytest.raises(SystemExit) as done:
        cli.main([*argv, "--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: mrtpo {' '.join(argv)}")
    return parsers[-1], out


@pytest.mark.parametrize("argv", COMMAND_HELPS, ids=" ".join)
def test_help_shows_every_set_default(argv, monkeypatch, capsys):
    parser, _ = _help(argv, monkeypatch, capsys)
    formatter = parser._get_formatter()
    checked = 0
    for action in parser._actions:
        default = action.default
        unset = default is None or default is False or default is argparse.SUPPRESS or default in ([], "")
        if not action.option_strings or action.help == argparse.SUPPRESS or unset:
            continue
        assert f"(default: {default})" in formatter._expand_help(action), action.option_strings
        checked += 1
    unset = [a for a in parser._actions if a.option_strings and a.default is None and a.nargs != 0]
    assert checked or unset  # a parser with nothing to check would make this test vacuous


def test_train_help_names_the_values_a_run_gets(monkeypatch, capsys):
    """``mrtpo train``'s flags default to unset (a --config file must win over a flag left out), so the
    help states the configured defaults itself; they must be the ones the config applies."""
    from mrtpo.config import TRAIN_DEFAULTS, RunSettings

    _, out = _help(["train"], monkeypatch, capsys)
    text = " ".join(out.split())
    run = RunSettings()
    for flag, value in [
        ("--task", run.task),
        ("--model", run.model),
        ("--lora-r", run.lora_r),
        *(
            (f"--{k.replace('_', '-')}", TRAIN_DEFAULTS[k])
            for k in ("method", "max_steps", "seed", "learning_rate", "report_to")
        ),
    ]:
        entry = text.split(f" {flag} ", 1)[1].split(" --", 1)[0]
        assert f"(default: {value}" in entry, (flag, entry)


@pytest.mark.parametrize("argv", FOLDER_COMMANDS, ids=" ".join)
def test_output_folder_is_output_dir_everywhere(argv, monkeypatch, capsys):
    parser, out = _help(argv, monkeypatch, capsys)
    assert "--output-dir" in out
    if "--out" in parser._option_string_actions:  # the older spelling still works, as an alias
        assert parser._option_string_actions["--out"] is parser._option_string_actions["--output-dir"]


def test_out_alias_parses_like_output_dir():
    from mrtpo import demo, evaluate
    from mrtpo.bench import gpu
    from mrtpo.bench.learn import cli as learn_cli

    for parse in (
        lambda a: evaluate._parser().parse_args(["--task", "sql", *a]),
        demo._parse,
        lambda a: learn_cli._parser().parse_args(["--task", "sql", *a]),
        gpu._parse,
    ):
        assert str(parse(["--output-dir", "d1"]).out) == "d1" and str(parse(["--out", "d2"]).out) == "d2"


def test_version_flag():
    import mrtpo

    done = run("--version")
    assert (done.returncode, done.stdout, done.stderr) == (0, mrtpo.__version__ + "\n", "")


def test_mistyped_command_suggests_the_closest():
    assert "unknown command 'trian'; did you mean 'train'?" in run("trian").stderr
    assert "did you mean '--version'" in run("--verison").stderr
    done = run("xyzzy")
    assert done.returncode == 2 and "unknown command 'xyzzy'\n" in done.stderr  # nothing close: no guess


@pytest.mark.parametrize("args", [["bench"], ["bench", "--help"]], ids=" ".join)
def test_bench_help_lists_each_benchmark_on_stdout(args):
    done = run(*args)
    assert done.returncode == 0 and done.stderr == ""
    lines = done.stdout.splitlines()
    for name, module in BENCHMARKS.items():
        description = describe(module)
        assert description and not description.startswith("``")
        assert sum(line.split()[:1] == [name] for line in lines) == 1
        assert f"  {name}" in done.stdout and description in done.stdout


def test_unknown_benchmark_exits_2_with_the_list():
    done = run("bench", "lern")
    assert done.returncode == 2 and done.stdout == ""
    assert "unknown benchmark 'lern'; did you mean 'learn'?" in done.stderr
    assert all(name in done.stderr for name in BENCHMARKS)


def test_library_messages_are_logging_the_cli_prints(capsys, caplog, monkeypatch):
    """Library modules log; ``mrtpo`` shows their INFO lines on stdout unchanged, and a script that
    imports mrtpo can silence them through the ``mrtpo`` logger."""
    root = logging.getLogger("mrtpo")  # as a fresh process has it (an earlier test may have run a command in-process)
    monkeypatch.setattr(root, "handlers", [h for h in root.handlers if not isinstance(h, cli._StdoutHandler)])
    monkeypatch.setattr(root, "level", logging.NOTSET)
    logger = logging.getLogger("mrtpo.warm_start")
    logger.info("before the CLI configures logging")
    assert capsys.readouterr().out == ""
    cli.configure_logging()
    cli.configure_logging()  # idempotent: one line per message
    logger.info("warm start: %s steps", 7)
    assert capsys.readouterr().out == "warm start: 7 steps\n"
    assert "warm start: 7 steps" in caplog.text  # still a log record a handler can route
    logging.getLogger("mrtpo").setLevel(logging.WARNING)
    logger.info("silenced")
    assert capsys.readouterr().out == ""


def test_no_library_function_defaults_to_print():
    """A ``log=print`` default writes to stdout past ``logging``; library defaults log instead."""
    import ast
    from pathlib import Path

    import mrtpo

    found = []
    for path in Path(mrtpo.__file__).parent.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                defaults = node.args.defaults + [d for d in node.args.kw_defaults if d is not None]
                found += [f"{path.name}:{node.name}" for d in defaults if isinstance(d, ast.Name) and d.id == "print"]
    assert found == []
