"""Execution-result equality for text-to-SQL, after Spider's execution-accuracy semantics.

Two results match when (all of):

* they have the same number of columns and the same number of rows;
* some permutation of the predicted columns makes the rows equal. Column *names* never matter
  and column *order* does not either: "name and age" answered as ``SELECT age, name`` is right.
  This follows Spider's official execution evaluation (test-suite-sql-eval), which also accepts
  column permutations. The identity permutation is tried first; at most ``max_permutations``
  candidate permutations are tried, and only those in which every column's values match as a
  multiset;
* rows are compared as a **multiset** (duplicates count) unless ``ordered`` is true, which the
  caller sets when the *gold* query has a top-level ``ORDER BY``; then row order must match too;
* values are equal when both are NULL, both are numbers within ``rel_tol``/``abs_tol``
  (an INTEGER and a REAL compare numerically: ``3 == 3.0``), or both are identical strings or
  blobs. A number never equals a string (``1`` vs ``'1'``), and NULL equals only NULL.

Two empty results match when their column counts match.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

Row = Sequence[Any]

REL_TOL = 1e-6
ABS_TOL = 1e-9


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def values_equal(a: Any, b: Any, rel_tol: float = REL_TOL, abs_tol: float = ABS_TOL) -> bool:
    """Equality of two SQLite values with a small tolerance for numbers."""
    if a is None or b is None:
        return a is None and b is None
    if _is_number(a) and _is_number(b):
        if isinstance(a, int) and isinstance(b, int):
            return a == b
        return math.isclose(float(a), float(b), rel_tol=rel_tol, abs_tol=abs_tol)
    if _is_number(a) or _is_number(b):
        return False
    return type(a) is type(b) and a == b


def _sort_key(v: Any) -> tuple[int, Any]:
    # A total order across storage classes. Numbers are quantised to 9 significant digits so
    # values within tolerance sort next to each other (then values_equal decides).
    if v is None:
        return (0, 0)
    if _is_number(v):
        f = float(v)
        if math.isnan(f):
            return (1, float("inf"))
        return (1, float(f"{f:.9g}"))
    if isinstance(v, str):
        return (2, v)
    if isinstance(v, (bytes, bytearray)):
        return (3, bytes(v))
    return (4, repr(v))


def _rows_equal(a: Row, b: Row, rel_tol: float, abs_tol: float) -> bool:
    return len(a) == len(b) and all(values_equal(x, y, rel_tol, abs_tol) for x, y in zip(a, b))


def _lists_equal(a: Sequence[Row], b: Sequence[Row], rel_tol: float, abs_tol: float) -> bool:
    return len(a) == len(b) and all(_rows_equal(x, y, rel_tol, abs_tol) for x, y in zip(a, b))


def _sorted_rows(rows: Sequence[Row]) -> list[Row]:
    return sorted(rows, key=lambda r: tuple(_sort_key(v) for v in r))


def _column_multiset_equal(a: list[Any], b: list[Any], rel_tol: float, abs_tol: float) -> bool:
    sa = sorted(a, key=_sort_key)
    sb = sorted(b, key=_sort_key)
    return all(values_equal(x, y, rel_tol, abs_tol) for x, y in zip(sa, sb))


def results_match(
    pred_rows: Sequence[Row],
    gold_rows: Sequence[Row],
    *,
    pred_ncols: int | None = None,
    gold_ncols: int | None = None,
    ordered: bool = False,
    rel_tol: float = REL_TOL,
    abs_tol: float = ABS_TOL,
    max_permutations: int = 5_000,
) -> bool:
    """Whether a predicted result equals the gold result (rules in the module docstring).

    ``pred_ncols``/``gold_ncols`` give the column counts (needed when a result has no rows);
    they default to the width of the first row.
    """
    pred_rows = [tuple(r) for r in pred_rows]
    gold_rows = [tuple(r) for r in gold_rows]
    if pred_ncols is None:
        pred_ncols = len(pred_rows[0]) if pred_rows else 0
    if gold_ncols is None:
        gold_ncols = len(gold_rows[0]) if gold_rows else 0
    if pred_ncols != gold_ncols or len(pred_rows) != len(gold_rows):
        return False
    if any(len(r) != pred_ncols for r in pred_rows) or any(len(r) != gold_ncols for r in gold_rows):
        return False
    if not gold_rows:
        return True
    n = gold_ncols

    def matches(perm: Sequence[int]) -> bool:
        permuted = [tuple(r[j] for j in perm) for r in pred_rows]
        if ordered:
            return _lists_equal(permuted, gold_rows, rel_tol, abs_tol)
        return _lists_equal(_sorted_rows(permuted), gold_sorted, rel_tol, abs_tol)

    gold_sorted = _sorted_rows(gold_rows) if not ordered else gold_rows
    identity = list(range(n))
    if matches(identity):
        return True
    if n == 1:
        return False

    # candidates[i] = predicted columns whose values equal gold column i as a multiset.
    pred_cols = [[r[j] for r in pred_rows] for j in range(n)]
    gold_cols = [[r[i] for r in gold_rows] for i in range(n)]
    candidates = [
        [j for j in range(n) if _column_multiset_equal(pred_cols[j], gold_cols[i], rel_tol, abs_tol)] for i in range(n)
    ]
    if any(not c for c in candidates):
        return False

    tried = 0
    perm: list[int] = []
    used: set[int] = set()

    def search(i: int) -> bool:
        nonlocal tried
        if i == n:
            tried += 1
            return perm != identity and matches(perm)
        for j in candidates[i]:
            if j in used:
                continue
            if tried >= max_permutations:
                return False
            perm.append(j)
            used.add(j)
            if search(i + 1):
                return True
            perm.pop()
            used.discard(j)
        return False

    return search(0)


__all__ = ["ABS_TOL", "REL_TOL", "results_match", "values_equal"]
