"""The ``mrtpo`` command line. Each command lives in its own module with a ``main(argv)``::

    mrtpo train    --task <name|task.yaml> --method <name>  (`mrtpo train --help` lists both registries)
    mrtpo sft      --task toolcall | --data pairs.jsonl    (supervised warm start, saved as a model folder)
    mrtpo eval     --task <...> --model <preset|dir|checkpoint>
    mrtpo explain  --task <...> --completion <text>      (token-credit view of one pair)
    mrtpo demo                                             (one credit step, printed + HTML)
    mrtpo bench    <name>                                  (`mrtpo bench` lists them)
    mrtpo --version

Options that name a folder are ``--output-dir`` (``--out`` still works where a command had it);
``--out`` names a single file (a benchmark's JSON record, ``explain``'s HTML page).
"""

from __future__ import annotations

import importlib
import logging
import sys

from mrtpo.cli_help import did_you_mean

#: command → (module with ``main(argv)``, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "train": ("mrtpo.train", "train a policy with MRTPO or a baseline method"),
    "sft": ("mrtpo.warm_start.cli", "supervised LoRA warm start (TRL SFTTrainer) on a task's or your own pairs"),
    "eval": ("mrtpo.evaluate", "score a model or checkpoint on a task's held-out split"),
    "explain": ("mrtpo.explain", "render the token-credit view for a prompt/completion pair"),
    "demo": ("mrtpo.demo", "one MRTPO credit-assignment step on the default model, printed and as HTML"),
    "bench": ("mrtpo.bench", "benchmarks (`mrtpo bench` lists them)"),
    "report": (
        "mrtpo.report.command",
        "rebuild a run folder's report (after a crash or report: false), or "
        "draw several runs on one figure (--compare)",
    ),
    "export": ("mrtpo.export", "write a run's final model as one folder (a LoRA adapter merged into its base)"),
    "version": ("mrtpo", "print the version"),
}


def _usage() -> str:
    width = max(map(len, COMMANDS))
    lines = ["usage: mrtpo <command> [options]   |   mrtpo --version", "", "commands:"]
    lines += [f"  {name:<{width}}  {help_}" for name, (_, help_) in COMMANDS.items()]
    lines += ["", "Run `mrtpo <command> --help` for a command's options."]
    return "\n".join(lines)


class _StdoutHandler(logging.StreamHandler):
    """Plain message lines on whatever ``sys.stdout`` is when a record is written (a test may swap it)."""

    def __init__(self) -> None:
        super().__init__()
        self.setFormatter(logging.Formatter("%(message)s"))

    @property
    def stream(self):
        return sys.stdout

    @stream.setter
    def stream(self, _value) -> None:
        pass


def configure_logging() -> None:
    """Show the library's ``mrtpo.*`` log messages (INFO and up) as plain lines on stdout, as the
    commands printed them before. Only the CLI does this: a script importing mrtpo keeps Python's
    logging setup, so ``logging.getLogger("mrtpo").setLevel(logging.WARNING)`` silences them."""
    logger = logging.getLogger("mrtpo")
    logger.setLevel(logging.INFO)
    if not any(isinstance(h, _StdoutHandler) for h in logger.handlers):
        logger.addHandler(_StdoutHandler())


def import_plugins() -> None:
    """Import the modules named in ``MRTPO_PLUGINS`` (comma-separated), e.g. ones that register a
    credit method or a task, so every command (and every ``bench learn --jobs`` worker) knows them.
    A module that cannot be found or raises while importing is one line naming it, not a traceback."""
    import os

    for name in filter(None, (n.strip() for n in os.environ.get("MRTPO_PLUGINS", "").split(","))):
        try:
            importlib.import_module(name)
        except ImportError as exc:
            raise SystemExit(
                f"mrtpo: error: MRTPO_PLUGINS names {name!r}, which does not import ({exc}); "
                "put its folder on PYTHONPATH or fix the name"
            ) from None
        except Exception as exc:  # noqa: BLE001 -- a plugin may raise anything; say which one
            raise SystemExit(
                f"mrtpo: error: MRTPO_PLUGINS module {name!r} raised {type(exc).__name__} while importing: {exc}"
            ) from None


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(_usage())
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command in ("version", "--version"):
        import mrtpo

        print(mrtpo.__version__)
        return 0
    if command not in COMMANDS:
        hint = did_you_mean(command, [*COMMANDS, "--version"])
        print(f"mrtpo: unknown command {command!r}{hint}\n\n{_usage()}", file=sys.stderr)
        return 2
    from mrtpo.warning_filters import filter_dependency_warnings

    filter_dependency_warnings()
    configure_logging()
    import_plugins()
    module = importlib.import_module(COMMANDS[command][0])
    return int(module.main(rest) or 0)


if __name__ == "__main__":
    sys.exit(main())
