"""Text-to-SQL on Spider dev with real SQLite databases (docs/design.md#tasks; docs/tasks/sql.md).

``get_task("sql")`` returns :class:`SqlTask`. Modules, one job each: :mod:`.loader` (find and
validate the data, the split), :mod:`.prompt` (schema block and messages), :mod:`.sandbox` (the
hardened read-only executor, with :mod:`.printf_cap` and its killable :mod:`.workers`),
:mod:`.sqltext` (SQL lexing), :mod:`.parse` (SQL out of a completion), :mod:`.compare` (result
equality), :mod:`.verifiers` (the three rewards) and :mod:`.evaluate` (execution accuracy).
"""

from __future__ import annotations

import os
from typing import Any

from mrtpo.task_base import Task
from mrtpo.tasks import register_task
from mrtpo.tasks.sql import spans as _spans
from mrtpo.tasks.sql.evaluate import evaluate as _evaluate
from mrtpo.tasks.sql.loader import EVAL_DBS, SPLITS, TRAIN_DBS, SpiderDataError, load_items
from mrtpo.tasks.sql.prompt import FORMAT_INSTRUCTION, build_messages, schema_block
from mrtpo.tasks.sql.sandbox import DEFAULT_LIMITS, ErrorKind, QueryResult, SandboxLimits, execute
from mrtpo.tasks.sql.sqltext import has_top_level_order_by
from mrtpo.tasks.sql.verifiers import ExecutesVerifier, ExecutionCache, FormatVerifier, ResultVerifier
from mrtpo.verifiers import Example, Verifier


@register_task("sql")
class SqlTask(Task):
    """Spider text-to-SQL: train = 9 databases (399 questions), eval = 10 databases (573).

    ``data_dir``: the Spider folder (else ``$MRTPO_SPIDER_DIR``, else ``../shared/data/spider``);
    ``sample_rows``: example rows per table in the schema block (0 for DDL only);
    ``verify``: "sha256" (the README's exact files) or "schema" (any genuine Spider copy);
    ``limits``: the sandbox limits used by rewards and evaluation.
    """

    name = "sql"

    def __init__(
        self,
        data_dir: str | os.PathLike[str] | None = None,
        sample_rows: int = 3,
        verify: str = "sha256",
        limits: SandboxLimits = DEFAULT_LIMITS,
    ) -> None:
        self.data_dir = data_dir
        self.sample_rows = int(sample_rows)
        self.verify = verify
        self.limits = limits
        self.cache = ExecutionCache(limits)

    def load(self, split: str, limit: int | None = None) -> list[Example]:
        """Examples of ``split`` in dev.json order (``limit``: the first ``limit`` of them)."""
        items = load_items(split, self.data_dir, self.verify)
        if limit is not None:
            items = items[: max(0, int(limit))]
        out = []
        for it in items:
            schema = schema_block(str(it.db_path), self.sample_rows)
            out.append(
                Example(
                    id=f"spider-dev-{it.index}",
                    split=split,
                    messages=build_messages(schema, it.question),
                    gold={
                        "sql": it.query,
                        "db_id": it.db_id,
                        "db_path": str(it.db_path),
                        "ordered": has_top_level_order_by(it.query),
                        "schema": schema,
                        "format_instruction": FORMAT_INSTRUCTION,
                    },
                    meta={"source": "spider/dev.json", "index": it.index, "question": it.question},
                )
            )
        return out

    def verifiers(self) -> list[Verifier]:
        """[format, executes, result], sharing one execution cache."""
        return [FormatVerifier(), ExecutesVerifier(self.cache), ResultVerifier(self.cache)]

    def evaluate(self, outputs: list[str], examples: list[Example]) -> dict[str, Any]:
        """Execution accuracy per database and overall, executable and format rates."""
        return _evaluate(outputs, examples, self.cache)

    def may_have_checked_spans(self, example: Example) -> bool:
        """Every question: its completions can have fences and a query (``mrtpo bench lift``)."""
        return True

    def checked_spans(self, example: Example, text: str) -> list[tuple[str, str, list[tuple[int, int]]]]:
        """Where each reward's checker reads ``text`` (:mod:`.spans`), for ``mrtpo bench lift``."""
        return _spans.checked_spans(example, text, [v.name for v in self.verifiers()])


__all__ = [
    "EVAL_DBS",
    "ErrorKind",
    "ExecutesVerifier",
    "ExecutionCache",
    "FORMAT_INSTRUCTION",
    "FormatVerifier",
    "QueryResult",
    "ResultVerifier",
    "SPLITS",
    "SandboxLimits",
    "SpiderDataError",
    "SqlTask",
    "TRAIN_DBS",
    "execute",
]
