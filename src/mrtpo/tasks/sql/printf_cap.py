"""SQLite's ``printf``/``format`` with a cap on field width and precision.

SQLite's built-in ``printf('%.*c', 1000000000, 'x')`` loops once per unit of precision inside a
single function call, where neither the progress handler nor an interrupt can stop it (its cost:
docs/tasks/sql.md); other huge widths and precisions only yield NULL, after allocating. The sandbox
therefore registers :func:`capped_printf` over both names: it reads every width and precision the
format asks for, the ``*`` ones from their arguments, exactly as SQLite's ``sqlite3_str_vappendf``
consumes them, refuses any above the cap, and otherwise returns what the built-in returns (run on
a private in-memory connection with the same length limit), so normal formats are unchanged.
"""

from __future__ import annotations

import re
import sqlite3
import threading
from typing import Any

# One conversion as SQLite parses it: flags, width (digits or *), precision (. then digits or *),
# the l/ll size, then the type character. A leading 0 is a flag, so widths start at 1-9.
_SPEC = re.compile(r"%[-+ #!0,]*(\*|[1-9][0-9]*)?(?:\.(\*|[0-9]*))?(?:ll?)?(.?)", re.DOTALL)
# Types that take no argument from the list ("%%" prints '%', "%n" stores nothing in SQL).
_NO_ARGUMENT = frozenset("%n")

_local = threading.local()


class PrintfTooLarge(ValueError):
    """A width or precision above the cap (raised inside the SQL function, reported as TOO_LARGE)."""


def _star_value(value: Any) -> int | None:
    """The width or precision a ``*`` argument gives, or None when it is not a plain number.

    SQLite converts text and blobs to integers too; refusing them (a sandbox has no use for a
    width written as text) keeps the check exact without re-implementing that conversion.
    """
    if value is None:
        return 0
    if isinstance(value, (int, float)) and abs(value) < 2**31:
        return abs(int(value))
    return None


def printf_overflow(args: tuple[Any, ...], cap: int) -> str | None:
    """Why ``printf(*args)`` would be refused (a width or precision above ``cap``), else None.

    Walks the conversions of the format (``args[0]``) in order, taking an argument for each ``*``
    and for each conversion but ``%%`` and ``%n``, as SQLite does. Scanning past a conversion at
    which SQLite would stop (an unknown type) can only refuse more, never less.
    """
    if not args or not isinstance(args[0], (str, bytes)):
        return None  # a NULL or numeric format holds no conversion
    # SQLite reads a blob format as text; latin-1 keeps every ASCII byte where it was.
    fmt = args[0] if isinstance(args[0], str) else args[0].decode("latin-1")
    rest = iter(args[1:])
    for spec in _SPEC.finditer(fmt):
        width, precision, kind = spec.groups()
        for part, name in ((width, "width"), (precision, "precision")):
            if part == "*":
                value = _star_value(next(rest, None))
                if value is None or value > cap:
                    return f"printf {name} from an argument must be a number up to {cap}"
            elif part and int(part) > cap:
                return f"printf {name} {int(part)} is above the cap of {cap}"
        if kind not in _NO_ARGUMENT:
            next(rest, None)
    return None


def _builtin(args: tuple[Any, ...], cap: int) -> Any:
    """SQLite's own printf of ``args`` on this thread's in-memory connection, values limited to ``cap``."""
    con = getattr(_local, "con", None)
    if con is None:
        con = _local.con = sqlite3.connect(":memory:")
    con.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, cap)
    placeholders = ", ".join("?" * len(args))
    return con.execute(f"SELECT printf({placeholders})", args).fetchone()[0]


def capped_printf(cap: int, *args: Any) -> Any:
    """``printf(*args)`` as SQLite computes it; raises :class:`PrintfTooLarge` above ``cap``."""
    reason = printf_overflow(args, cap)
    if reason is not None:
        raise PrintfTooLarge(reason)
    return _builtin(args, cap)


__all__ = ["PrintfTooLarge", "capped_printf", "printf_overflow"]
