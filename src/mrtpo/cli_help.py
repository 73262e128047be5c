"""Help and error text shared by every ``mrtpo`` command.

:class:`HelpFormatter` ends each option's help with its default. ``argparse``'s own
``ArgumentDefaultsHelpFormatter`` also writes ``(default: None)`` and ``(default: False)``, which say
nothing; here an option whose default is unset shows none, and its help says in words what happens
when it is left out. :func:`did_you_mean` suggests the closest name for a mistyped one.
"""

from __future__ import annotations

import argparse
import difflib
from collections.abc import Iterable


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """``(default: X)`` after an option's help, unless X is unset or the help already places it."""

    def _get_help_string(self, action: argparse.Action) -> str:
        default = action.default
        if default is None or default is False or default is argparse.SUPPRESS or default in ([], ""):
            return action.help or ""
        return super()._get_help_string(action)


def did_you_mean(name: str, choices: Iterable[str]) -> str:
    """``"; did you mean 'x'?"`` for the closest of ``choices`` to a mistyped ``name``, else ``""``."""
    close = difflib.get_close_matches(name, list(choices), n=1)
    return f"; did you mean {close[0]!r}?" if close else ""


__all__ = ["HelpFormatter", "did_you_mean"]
