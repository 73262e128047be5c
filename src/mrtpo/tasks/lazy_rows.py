"""A task file's examples over its Arrow dataset, each built when asked for (issue 41: large task files).

``datasets`` memory-maps a loaded file from its cache, so a split of a task file is a
:class:`LazyExamples`: the ``datasets.Dataset``, the split's row numbers (all rows, or one side of
``eval_fraction``'s shuffle) and how an :class:`~mrtpo.verifiers.Example` is made of a row. Nothing
per row exists until a row is read. What must see every row before a model loads reads Arrow
columns: the prompt column's format (:func:`prompt_is_chat`), the ids' uniqueness
(:func:`examples_by_id`, a sorted Arrow array of the ids), the trainer's dataset
(:meth:`LazyExamples.trainer_dataset`, columns renamed and added, no rows copied); the in-prompt evidence
check reads the columns it compares, a batch at a time, and builds no row it need not
(:func:`check_evidence`).
A row comes out as ``dataset[i]`` gives it: the eager path's ``Dataset.to_list()`` row for every column
that is not an image, audio or video feature (those ``datasets`` decodes on access).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from mrtpo.tasks.reward_refs import TaskFileError
from mrtpo.verifiers import Example

#: Rows read per batch where a pass goes over every row.
BATCH = 4096


def as_messages(value: Any, where: str) -> list[dict[str, Any]]:
    """A prompt cell as chat messages: text is one user turn; a list of {role, content} passes as is."""
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    if isinstance(value, list) and value and all(isinstance(m, dict) and "role" in m and "content" in m for m in value):
        return [dict(m) for m in value]
    raise TaskFileError(f"{where}: the prompt must be text or a list of {{role, content}} messages, got {value!r:.80}")


def _rows_of(batch: dict[str, list]) -> list[dict[str, Any]]:
    """``datasets``' column batch as rows."""
    names = list(batch)
    return [dict(zip(names, values)) for values in zip(*batch.values())]


def _read(dataset: Any, rows: Any) -> dict[str, list]:
    """The columns of rows ``rows`` (ascending: a range or an array of row numbers) of ``dataset``, in one
    read: a slice where they are contiguous or dense (``datasets`` gathers scattered rows one by one)."""
    if isinstance(rows, range) and rows.step == 1:
        return dataset[rows.start : rows.stop]
    if not len(rows):
        return dataset[0:0]
    first, last = int(rows[0]), int(rows[-1])
    if last - first < 2 * len(rows):
        span = dataset[first : last + 1]
        return {name: [values[int(i) - first] for i in rows] for name, values in span.items()}
    return dataset[[int(i) for i in rows]]


class LazyExamples(Sequence[Example]):
    """A split's examples over ``dataset`` (a ``datasets.Dataset``): ``rows`` are its row numbers (a range
    or a sorted numpy array); example ``k`` is row ``rows[k]``, id ``<split>-<row>`` or the row's
    ``id_column``, built on access. A slice is another :class:`LazyExamples` over the same dataset."""

    def __init__(self, dataset: Any, split: str, rows: Any, prompt: str, id_column: str | None):
        self.dataset, self.split, self.rows = dataset, split, rows
        self.prompt, self.id_column = prompt, id_column

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, key: Any) -> Any:
        if isinstance(key, slice):
            return LazyExamples(self.dataset, self.split, self.rows[key], self.prompt, self.id_column)
        row = int(self.rows[key])
        return self._example(row, self.dataset[row])

    def __iter__(self) -> Iterator[Example]:
        for chunk, batch in self.batches():
            yield from (self._example(int(i), row) for i, row in zip(chunk, _rows_of(batch)))

    def __repr__(self) -> str:
        return f"LazyExamples(split={self.split!r}, {len(self)} rows)"

    def _example(self, row: int, record: dict[str, Any]) -> Example:
        messages = as_messages(record[self.prompt], f"row {row} of split {self.split!r}")
        return Example(id=self._id(row, record), split=self.split, messages=messages, gold=record, meta={"row": row})

    def _id(self, row: int, record: dict[str, Any]) -> str:
        return str(record[self.id_column]) if self.id_column else f"{self.split}-{row}"

    def batches(self, columns: list[str] | None = None) -> Iterator[tuple[Any, dict[str, list]]]:
        """``(row numbers, {column: values})`` a batch of examples at a time; ``columns``: only those (and the
        id column) are read."""
        dataset = self.dataset
        if columns is not None:
            dataset = dataset.select_columns(list(dict.fromkeys([*columns, *filter(None, [self.id_column])])))
        for start in range(0, len(self.rows), BATCH):
            chunk = self.rows[start : start + BATCH]
            yield chunk, _read(dataset, chunk)

    def ids(self) -> Any:
        """The examples' ids as an Arrow string array, computed on the columns (Python's ``str`` only for an
        id column of another type than text or integers, or with empty cells)."""
        import numpy as np
        import pyarrow as pa
        import pyarrow.compute as pc

        rows = pa.array(np.asarray(self.rows, dtype=np.int64))
        if self.id_column is None:
            return pc.binary_join_element_wise(f"{self.split}-", pc.cast(rows, pa.string()), "")
        column = self.dataset.with_format("arrow")[self.id_column].take(rows)
        dtype = getattr(self.dataset.features[self.id_column], "dtype", None)
        plain = isinstance(dtype, str) and (dtype in ("string", "large_string") or dtype.startswith(("int", "uint")))
        if plain and not column.null_count:
            return pc.cast(column, pa.string()).combine_chunks()  # Arrow writes them as str() does
        return pa.array([str(v) for _, batch in self.batches([self.id_column]) for v in batch[self.id_column]])

    def trainer_dataset(self) -> Any:
        """The trainer's ``datasets.Dataset`` of these examples: the prompt column as ``prompt`` (first), the
        other columns, and ``example_id``; Arrow columns renamed and added, and the split's rows selected
        (an index, no copy)."""
        import pyarrow as pa

        every = LazyExamples(self.dataset, self.split, range(len(self.dataset)), self.prompt, self.id_column)
        columns = self.dataset.column_names
        full = self.dataset.select_columns([self.prompt, *(c for c in columns if c != self.prompt)])
        if self.prompt != "prompt":
            full = full.rename_column(self.prompt, "prompt")
        if "example_id" in columns:  # the id column itself (the task's checks allow no other)
            column = full.with_format("arrow")["example_id"]
            if column.type == pa.string() and not column.null_count:
                return _select(full, self.rows)  # already the ids, as text
            full = full.remove_columns("example_id")
        return _select(full.add_column("example_id", every.ids()), self.rows)


def _select(dataset: Any, rows: Any) -> Any:
    """``dataset``'s rows ``rows`` (a range: a slice; an array: an index over the same table)."""
    import numpy as np

    if isinstance(rows, range) and rows == range(len(dataset)):
        return dataset
    return dataset.select(rows if isinstance(rows, range) else np.asarray(rows))


class DuplicateIdError(ValueError):
    """Two examples share an id (:attr:`id`)."""

    def __init__(self, example_id: str):
        super().__init__(f"two examples with id {example_id!r}")
        self.id = example_id


class _Sorted(Sequence[str]):
    """An Arrow string array seen as a Python sequence (for :mod:`bisect`)."""

    def __init__(self, array: Any):
        self.array = array

    def __len__(self) -> int:
        return len(self.array)

    def __getitem__(self, k: Any) -> Any:
        return self.array[k].as_py()


class ExamplesById(Mapping[str, Example]):
    """id -> example over :class:`LazyExamples` parts: their ids sorted once as an Arrow array (which shows a
    duplicate: :class:`DuplicateIdError`), found by bisection, the example built on access."""

    def __init__(self, parts: list[LazyExamples]):
        import pyarrow as pa
        import pyarrow.compute as pc

        self.parts = [p for p in parts if len(p)]
        self.starts = [0]
        for part in self.parts:
            self.starts.append(self.starts[-1] + len(part))
        ids = pa.chunked_array([p.ids() for p in self.parts], pa.string()).combine_chunks()
        self.order = pc.sort_indices(ids)
        self.sorted = _Sorted(ids.take(self.order))
        if len(ids) > 1:
            same = pc.equal(self.sorted.array[1:], self.sorted.array[:-1])
            if pc.any(same).as_py():
                raise DuplicateIdError(self.sorted[pc.index(same, True).as_py()])

    def __getitem__(self, key: Any) -> Example:
        k = bisect.bisect_left(self.sorted, key) if isinstance(key, str) else len(self.sorted)
        if k == len(self.sorted) or self.sorted[k] != key:
            raise KeyError(key)
        at = self.order[k].as_py()
        part = bisect.bisect_right(self.starts, at) - 1
        return self.parts[part][at - self.starts[part]]

    def __iter__(self) -> Iterator[str]:
        for part in self.parts:
            ids = part.ids()
            for start in range(0, len(ids), BATCH):
                yield from ids[start : start + BATCH].to_pylist()

    def __len__(self) -> int:
        return self.starts[-1]


def examples_by_id(parts: list[Sequence[Example]]) -> Mapping[str, Example]:
    """id -> example over ``parts`` (a run's train and eval examples): an :class:`ExamplesById` where they
    are lazy, else a dict; a :class:`DuplicateIdError` when two share an id."""
    if all(isinstance(p, LazyExamples) or not p for p in parts):
        return ExamplesById([p for p in parts if isinstance(p, LazyExamples)])
    examples: dict[str, Example] = {}
    for part in parts:
        for ex in part:
            if ex.id in examples:
                raise DuplicateIdError(ex.id)
            examples[ex.id] = ex
    return examples


def prompt_is_chat(dataset: Any, prompt: str, split: str) -> bool:
    """Whether ``dataset``'s prompt column holds chat messages (else text), read from its Arrow type; a
    :class:`TaskFileError` naming the first row that is neither text nor a non-empty list of {role,
    content} messages. A column of no single type (``datasets``' Json feature) is read a batch at a
    time, and must not mix the two formats."""
    import pyarrow as pa
    import pyarrow.compute as pc

    column = dataset.with_format("arrow")[prompt]
    kind = column.type
    if getattr(dataset.features[prompt], "dtype", None) in ("string", "large_string"):
        bad = column.is_null()
        chat = False
    elif (pa.types.is_list(kind) or pa.types.is_large_list(kind)) and pa.types.is_struct(kind.value_type):
        if not {"role", "content"} <= {kind.value_type.field(i).name for i in range(kind.value_type.num_fields)}:
            bad = pa.chunked_array([pa.array([True] * len(column))])
        else:
            bad = pa.chunked_array([_bad_message_lists(chunk) for chunk in column.chunks], pa.bool_())
        chat = True
    else:
        return _prompt_kinds(dataset, prompt, split)
    first = pc.index(bad, True).as_py() if len(bad) else -1
    if first >= 0:
        as_messages(dataset[first][prompt], f"row {first} of split {split!r}")  # raises, naming the row
    return chat


def _bad_message_lists(chunk: Any) -> Any:
    """Per row of a ``list<struct>`` chunk: null, empty, or holding a null message."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    bad = pc.fill_null(pc.or_kleene(chunk.is_null(), pc.equal(pc.list_value_length(chunk), 0)), True)
    flat = pc.list_flatten(chunk)
    if flat.null_count:
        holders = pc.filter(pc.list_parent_indices(chunk), flat.is_null())
        bad = pc.or_(bad, pc.is_in(pa.array(np.arange(len(chunk))), value_set=holders))
    return bad


def _prompt_kinds(dataset: Any, prompt: str, split: str) -> bool:
    kinds = set()
    for start in range(0, len(dataset), BATCH):
        for i, value in enumerate(dataset[start : start + BATCH][prompt], start):
            as_messages(value, f"row {i} of split {split!r}")
            kinds.add(isinstance(value, str))
    if len(kinds) > 1:
        raise TaskFileError(
            f"column {prompt!r} mixes text prompts and chat messages; TRL needs one format "
            "per dataset (messages for a chat model, text for raw continuation)"
        )
    return kinds == {False}


def prompt_text(value: Any) -> str:
    """A prompt cell's text as the evidence check reads it: text as is, messages' contents joined by lines."""
    if isinstance(value, str):
        return value
    return "\n".join(str(m.get("content", "")) for m in value if isinstance(m, dict))


def check_evidence(part: LazyExamples, rewards: list[tuple[str, Any]]) -> None:
    """Each ``in_prompt`` evidence text that ``rewards`` (``(name, function)``, each with ``@evidence``) give
    for an example of ``part`` occurs in its prompt (:func:`~mrtpo.validation.check_evidence_text`), read from
    the prompt and evidence columns a batch at a time (every column when a source is a function). A text cell
    found in its prompt passes as it is read; any other cell goes through the reward's own ``evidence_for``
    with its row, which decides."""
    from mrtpo.rewards import EVIDENCE_ATTR, evidence_for
    from mrtpo.validation import check_evidence_text

    sources = [getattr(fn, EVIDENCE_ATTR).source for _, fn in rewards]
    columns = None if any(callable(s) for s in sources) else [part.prompt, *sources]
    for chunk, batch in part.batches(columns):
        texts = [prompt_text(value) for value in batch[part.prompt]]
        rows = None
        for (name, fn), source in zip(rewards, sources):
            cells = batch[source] if isinstance(source, str) else [False] * len(texts)
            for k, (text, cell) in enumerate(zip(texts, cells)):
                if cell is None or (isinstance(cell, str) and cell in text):
                    continue
                rows = rows or _rows_of(batch)
                check_evidence_text(name, part._id(int(chunk[k]), rows[k]), evidence_for(fn, rows[k]), text)


__all__ = [
    "BATCH",
    "DuplicateIdError",
    "ExamplesById",
    "LazyExamples",
    "as_messages",
    "check_evidence",
    "examples_by_id",
    "prompt_is_chat",
    "prompt_text",
]
