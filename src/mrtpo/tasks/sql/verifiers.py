"""The three text-to-SQL rewards: ``format``, ``executes``, ``result`` (docs/design.md#tasks).

* ``format`` ∈ {0, 1}: exactly one closed ```sql block (see :mod:`.parse`). Evidence: the format
  instruction sentence (in_prompt).
* ``executes`` ∈ {0, 1}: the extracted SQL runs in the sandbox without any error, including the
  sandbox's own ones (timeout, too large, forbidden). An empty result counts as executing.
  Evidence: the schema block (in_prompt).
* ``result`` ∈ {0, 1}: the result equals the gold query's (:mod:`.compare`; row order only when
  the gold query has a top-level ORDER BY). ``None`` if the gold query itself fails (never on
  Spider's 972 usable questions). Evidence: the gold SQL (privileged).

All three never raise: any unexpected exception scores 0.0. Executions are memoised in a small
bounded cache shared by the verifiers of one task, so ``executes`` and ``result`` run a
completion's SQL once, and a gold query runs once per process.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

from mrtpo.tasks.sql.compare import results_match
from mrtpo.tasks.sql.parse import extract_sql, format_ok
from mrtpo.tasks.sql.sandbox import DEFAULT_LIMITS, QueryResult, SandboxLimits, execute
from mrtpo.tasks.sql.sqltext import has_top_level_order_by
from mrtpo.verifiers import Evidence, Example


class ExecutionCache:
    """A thread-safe LRU of sandbox results keyed by (database, SQL).

    Results above ``max_entry_bytes`` are not kept, so the cache stays small (at most
    ``max_entries * max_entry_bytes``); errors (timeouts included) are always kept, which is
    what saves time on a batch where several completions repeat one slow query.
    """

    def __init__(
        self,
        limits: SandboxLimits = DEFAULT_LIMITS,
        max_entries: int = 2048,
        max_entry_bytes: int = 256 * 1024,
    ) -> None:
        self.limits = limits
        self.max_entries = max_entries
        self.max_entry_bytes = max_entry_bytes
        self._data: OrderedDict[tuple[str, str], QueryResult] = OrderedDict()
        self._lock = threading.Lock()

    def run(self, db_path: str, sql: str) -> QueryResult:
        key = (str(db_path), sql)
        with self._lock:
            hit = self._data.get(key)
            if hit is not None:
                self._data.move_to_end(key)
                return hit
        res = execute(db_path, sql, self.limits)
        if res.error is not None or res.result_bytes <= self.max_entry_bytes:
            with self._lock:
                self._data[key] = res
                while len(self._data) > self.max_entries:
                    self._data.popitem(last=False)
        return res


def _gold(example: Example) -> dict[str, Any]:
    return example.gold if isinstance(example.gold, dict) else {}


class FormatVerifier:
    """1.0 iff the completion holds exactly one closed ```sql block."""

    name = "format"

    def __call__(self, completion: str, example: Example) -> float | None:
        try:
            return 1.0 if format_ok(completion) else 0.0
        except Exception:
            return 0.0

    def evidence(self, example: Example) -> Evidence | None:
        return Evidence(_gold(example)["format_instruction"], "in_prompt")


class ExecutesVerifier:
    """1.0 iff the completion's SQL runs in the sandbox without error."""

    name = "executes"

    def __init__(self, cache: ExecutionCache | None = None) -> None:
        self.cache = cache or ExecutionCache()

    def run(self, completion: str, example: Example) -> QueryResult | None:
        """The sandbox result of the completion's SQL, or ``None`` when it holds no SQL."""
        sql = extract_sql(completion)
        if sql is None:
            return None
        return self.cache.run(_gold(example)["db_path"], sql)

    def __call__(self, completion: str, example: Example) -> float | None:
        try:
            res = self.run(completion, example)
            return 1.0 if res is not None and res.ok else 0.0
        except Exception:
            return 0.0

    def evidence(self, example: Example) -> Evidence | None:
        return Evidence(_gold(example)["schema"], "in_prompt")


class ResultVerifier:
    """1.0 iff the completion's result equals the gold query's result."""

    name = "result"

    def __init__(self, cache: ExecutionCache | None = None) -> None:
        self.cache = cache or ExecutionCache()

    def score(self, pred: QueryResult | None, example: Example) -> float | None:
        """Compare an already executed prediction with the gold result."""
        g = _gold(example)
        gold = self.cache.run(g["db_path"], g["sql"])
        if not gold.ok:
            return None
        if pred is None or not pred.ok:
            return 0.0
        ordered = g.get("ordered")
        if ordered is None:
            ordered = has_top_level_order_by(g["sql"])
        same = results_match(
            pred.rows,
            gold.rows,
            pred_ncols=len(pred.columns),
            gold_ncols=len(gold.columns),
            ordered=bool(ordered),
        )
        return 1.0 if same else 0.0

    def __call__(self, completion: str, example: Example) -> float | None:
        try:
            sql = extract_sql(completion)
            pred = None if sql is None else self.cache.run(_gold(example)["db_path"], sql)
            return self.score(pred, example)
        except Exception:
            return 0.0

    def evidence(self, example: Example) -> Evidence | None:
        return Evidence(_gold(example)["sql"], "privileged")


__all__ = ["ExecutesVerifier", "ExecutionCache", "FormatVerifier", "ResultVerifier"]
