"""Result comparison edge cases: column order, duplicates, NULLs, floats, ORDER BY, types."""

from __future__ import annotations

import pytest

from mrtpo.tasks.sql.compare import results_match, values_equal

GOLD = [("Kabul", 1780000), ("Herat", 186800), ("Qandahar", 237500)]


def test_identical_and_reordered_rows() -> None:
    assert results_match(GOLD, GOLD)
    assert results_match(list(reversed(GOLD)), GOLD)  # multiset: row order free
    assert not results_match(list(reversed(GOLD)), GOLD, ordered=True)  # gold has ORDER BY
    assert results_match(GOLD, GOLD, ordered=True)


def test_column_permutation_is_accepted() -> None:
    swapped = [(p, n) for n, p in GOLD]
    assert results_match(swapped, GOLD)
    assert results_match(list(reversed(swapped)), GOLD)
    assert results_match(swapped, GOLD, ordered=True)
    assert not results_match(list(reversed(swapped)), GOLD, ordered=True)


def test_column_permutation_must_be_consistent_across_rows() -> None:
    # Each column matches some gold column as a multiset, but no single permutation works.
    gold = [(1, 2), (3, 4)]
    pred = [(1, 2), (4, 3)]
    assert not results_match(pred, gold)
    # Same multiset per column (both {1,2}), pairing differs.
    assert not results_match([(1, 1), (2, 2)], [(1, 2), (2, 1)])


def test_column_count_and_row_count_must_match() -> None:
    assert not results_match([("Kabul",)], [("Kabul", 1780000)])
    assert not results_match([("Kabul", 1780000, "AFG")], [("Kabul", 1780000)])
    assert not results_match(GOLD[:2], GOLD)
    # empty results: equal only with the same column count
    assert results_match([], [], pred_ncols=2, gold_ncols=2)
    assert not results_match([], [], pred_ncols=1, gold_ncols=2)
    assert not results_match([], [(1,)], pred_ncols=1, gold_ncols=1)


def test_duplicates_count() -> None:
    assert not results_match([("a",), ("b",)], [("a",), ("a",), ("b",)])
    assert not results_match([("a",), ("b",), ("b",)], [("a",), ("a",), ("b",)])
    assert results_match([("b",), ("a",), ("a",)], [("a",), ("a",), ("b",)])


def test_nulls() -> None:
    assert results_match([(None, 1), ("x", 2)], [("x", 2), (None, 1)])
    assert not results_match([(None,)], [(0,)])
    assert not results_match([(None,)], [("",)])
    assert not results_match([("NULL",)], [(None,)])


def test_numbers_with_tolerance() -> None:
    assert results_match([(0.1 + 0.2,)], [(0.3,)])
    assert results_match([(3,)], [(3.0,)])
    assert results_match([(66.48610599647264,)], [(66.4861059964726,)])
    assert not results_match([(66.49,)], [(66.48610599647264,)])  # rounding changes the answer
    assert not results_match([(3,)], [(4,)])
    assert not results_match([(1e-3,)], [(1.1e-3,)])
    # big integers compare exactly, not through float
    assert not results_match([(2**62 + 1,)], [(2**62,)])


def test_types_do_not_coerce() -> None:
    assert not results_match([("1",)], [(1,)])
    assert not results_match([(b"a",)], [("a",)])
    assert not results_match([("Kabul",)], [("kabul",)])  # strings are case-sensitive
    assert not results_match([("Kabul ",)], [("Kabul",)])


def test_values_equal_table() -> None:
    assert values_equal(None, None)
    assert not values_equal(None, 0)
    assert values_equal(1, 1.0000000001)
    assert not values_equal(True, 1)  # bool is never produced by SQLite; treat as foreign
    assert values_equal(b"\x00", b"\x00")


def test_mixed_types_in_one_column_sort_safely() -> None:
    gold = [(None,), (1,), ("a",), (b"z",), (2.5,)]
    assert results_match(list(reversed(gold)), gold)


def test_wide_results_with_repeated_columns() -> None:
    # 8 identical columns: many permutations are candidates; the identity matches at once.
    row = tuple([7] * 8)
    assert results_match([row] * 3, [row] * 3)
    gold = [tuple(range(i, i + 6)) for i in range(5)]
    pred = [tuple(reversed(r)) for r in gold]
    assert results_match(pred, gold)


@pytest.mark.parametrize("ordered", [False, True])
def test_large_results_compare_fast(ordered: bool) -> None:
    import time

    gold = [(i, f"name{i}", i * 0.5) for i in range(10_000)]
    pred = [(r[2], r[0], r[1]) for r in gold]
    t0 = time.monotonic()
    assert results_match(pred, gold, ordered=ordered)
    assert time.monotonic() - t0 < 2.0
