"""A task from a dataset and reward functions, declared in YAML: no package code.

A ``task:`` block in a training config (or a task file of its own, ``mrtpo train --task task.yaml``)::

    task:
      dataset: prompts.jsonl          # json/jsonl/csv/parquet file(s), a saved dataset folder, or a hub id
      prompt: instruction             # the prompt column: chat messages, or raw text (see below)
      eval_fraction: 0.2              # or eval_split: test (a split of the dataset)
      rewards:                        # file.py:function (next to this file), package.module:function,
        rewards.py:no_commas: 1.0     #   or package.module.function -> its weight
        trl.rewards.think_format_reward: 0.5
        trl.rewards.get_soft_overlong_punishment:    # a factory: called with args, gives the reward
          weight: 1.0
          args: {max_completion_len: 64, soft_punish_cache: 16}

Each reward is an ordinary TRL reward function (it may carry :func:`mrtpo.rewards.evidence`), and
training calls it exactly as TRL's GRPOTrainer does, because the trainer is TRL's: once per batch,
with ``prompts``, ``completions``, ``completion_ids``, ``trainer_state``, ``log_extra``,
``log_metric`` and every dataset column as keywords (:mod:`mrtpo.reward_calls`; the prompt column
comes as ``prompts``, and ``example_id`` is added). The prompt rule is TRL's, for the command line
and the library alike: a prompt that is a list of ``{role, content}`` messages is rendered with the
chat template and its completions reach the rewards as ``[{"role": "assistant", "content": ...}]``;
a text prompt is a raw continuation (no chat template) and its completions are text. For a chat
model, give the prompt column as messages. ``mrtpo eval`` and ``mrtpo explain`` make the same call
outside training (``trainer_state`` None, no token ids in ``explain``).

Paths are relative to the YAML file's folder. The file's path is the task's name in the registry
(:func:`mrtpo.tasks.get_task` registers it on first use), so a run's saved ``config.yaml`` names it
and the report, ``mrtpo eval`` and ``mrtpo explain`` find it again. Every mistake (a missing file or
column, a reward that does not import, an argument a reward needs that no column gives, an unknown
key) is a :class:`TaskFileError`, raised before any model loads, that says the fix.
"""

from __future__ import annotations

import copy
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mrtpo.task_base import Task
from mrtpo.tasks.data_files import DataFileError, check_data_file
from mrtpo.tasks.lazy_rows import LazyExamples, as_messages, check_evidence, prompt_is_chat
from mrtpo.tasks.reward_refs import TaskFileError, close_match_hint, load_reward, reward_list
from mrtpo.verifiers import Evidence, Example

#: Data-file suffix -> the ``datasets`` builder that reads it.
_BUILDERS = {".json": "json", ".jsonl": "json", ".csv": "csv", ".parquet": "parquet"}


@dataclass
class TaskSpec:
    """The keys of a ``task:`` block (one-line docs: what each means)."""

    dataset: Any = None
    """a data file, a list of them, a mapping split -> file(s), a saved dataset folder, or a hub id"""
    prompt: str = "prompt"
    """the prompt column: a list of {role, content} messages (chat template), or text (raw continuation), as in TRL"""
    rewards: Any = None
    (
        "reward functions: a list of paths, or a mapping path -> weight or {weight, args} (path: file.py:fn, "
        "pkg.module:fn or pkg.module.fn; args: a factory's keyword arguments)"
    )
    name: str | None = None
    """the task's short name (run folder names, messages); default: the YAML file's folder name"""
    subset: str | None = None
    """the dataset's configuration (hub datasets with several)"""
    train_split: str = "train"
    """split trained on"""
    eval_split: str | None = None
    """held-out split (eval_size, mrtpo eval); or set eval_fraction"""
    eval_fraction: float = 0.0
    """share of the train split held out (a fixed shuffle by split_seed) when there is no eval_split"""
    split_seed: int = 0
    """seed of the eval_fraction shuffle"""
    id_column: str | None = None
    """column of unique example ids (default: <split>-<row number>)"""
    max_new_tokens: int | None = None
    """mrtpo eval's generation cap for this task"""
    folder: Path = field(default=Path("."), repr=False)
    """(set by the loader) the YAML file's folder, against which paths resolve"""


def read_spec(path: str | Path) -> TaskSpec:
    """The :class:`TaskSpec` in ``path``: its ``task:`` mapping (a training config) or the whole file."""
    import yaml

    path = Path(path)
    if not path.is_file():
        raise TaskFileError(f"task file {path} does not exist")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise TaskFileError(f"task file {path} is not valid YAML: {exc}") from None
    block = data.get("task", data) if isinstance(data, dict) else data
    if not isinstance(block, dict):
        raise TaskFileError(f"{path} holds no task block: give `task:` a mapping with dataset, prompt and rewards")
    return spec_from_mapping(block, path.resolve().parent, str(path))


def spec_from_mapping(block: dict[str, Any], folder: Path, source: str) -> TaskSpec:
    """Check a ``task:`` mapping's keys and value types; unknown keys get the closest valid one."""
    known = [n for n in TaskSpec.__dataclass_fields__ if n != "folder"]
    for key in block:
        if key not in known:
            hint = close_match_hint(str(key), known)
            raise TaskFileError(
                f"unknown key {key!r} in the task block of {source}{hint}; valid keys: {', '.join(known)}"
            )
    spec = TaskSpec(**block, folder=folder)
    if spec.dataset in (None, "", [], {}):
        raise TaskFileError(
            f"the task block of {source} names no dataset: add `dataset: data.jsonl` "
            "(a file, a saved dataset folder or a hub id)"
        )
    if not spec.rewards:
        raise TaskFileError(f"the task block of {source} names no rewards: add `rewards: [rewards.py:my_reward]`")
    if isinstance(spec.rewards, str):  # one reward
        spec.rewards = [spec.rewards]
    if not isinstance(spec.rewards, (list, dict)):
        raise TaskFileError(
            f"rewards in {source} must be a list of paths or a mapping path -> weight, got {spec.rewards!r}"
        )
    if not isinstance(spec.prompt, str):
        raise TaskFileError(f"prompt in {source} must be a column name, got {spec.prompt!r}")
    if not (isinstance(spec.eval_fraction, (int, float)) and 0 <= spec.eval_fraction < 1):
        raise TaskFileError(f"eval_fraction in {source} must be in [0, 1), got {spec.eval_fraction!r}")
    if spec.eval_split is not None and spec.eval_fraction:
        raise TaskFileError(f"{source}: set eval_split or eval_fraction, not both")
    return spec


# --------------------------------------------------------------------------------------------
# The dataset.
# --------------------------------------------------------------------------------------------
def _data_files(value: Any, folder: Path) -> list[Path]:
    files = [value] if isinstance(value, str) else list(value)
    paths = [(folder / str(f)).resolve() for f in files]
    for p in paths:
        if not p.is_file():
            raise TaskFileError(
                f"dataset file {p} does not exist (paths are relative to the folder of the task's YAML file)"
            )
        if p.suffix.lower() not in _BUILDERS:
            raise TaskFileError(f"dataset file {p}: unknown format {p.suffix!r}; use one of {', '.join(_BUILDERS)}")
    return paths


def load_splits(spec: TaskSpec) -> dict[str, Any]:
    """The dataset's splits (name -> ``datasets.Dataset``), loaded offline from local files or a folder
    (without ``datasets``' progress bars)."""
    from datasets import utils as bars

    quiet = bars.are_progress_bars_disabled()
    bars.disable_progress_bars()
    try:
        return _load_splits(spec)
    finally:
        if not quiet:
            bars.enable_progress_bars()


def _quietly(load: Any, *args: Any, **kwargs: Any) -> Any:
    """``load(*args, **kwargs)`` with ``datasets``' log below errors (a file it rejects is explained after)."""
    from datasets.utils import logging as ds_logging

    level = ds_logging.get_verbosity()
    ds_logging.set_verbosity(ds_logging.CRITICAL)
    try:
        return load(*args, **kwargs)
    finally:
        ds_logging.set_verbosity(level)


def _load_splits(spec: TaskSpec) -> dict[str, Any]:
    import datasets

    ref, folder = spec.dataset, spec.folder
    if isinstance(ref, (dict, list)) or (
        isinstance(ref, str) and (Path(ref).suffix.lower() in _BUILDERS or (folder / ref).is_file())
    ):
        by_split = ref if isinstance(ref, dict) else {"train": ref}
        files = {str(s): [str(p) for p in _data_files(f, folder)] for s, f in by_split.items()}
        builders = {_BUILDERS[Path(f).suffix.lower()] for fs in files.values() for f in fs}
        if len(builders) > 1:
            raise TaskFileError(f"dataset files mix formats ({', '.join(sorted(builders))}); use one format")
        try:
            return dict(_quietly(datasets.load_dataset, builders.pop(), data_files=files))
        except Exception as exc:  # noqa: BLE001 -- one line naming the file and the line (mrtpo.tasks.data_files)
            try:  # read line by line only now: a large file that loads is not read twice
                for f in sorted({f for fs in files.values() for f in fs}):
                    check_data_file(Path(f))
            except DataFileError as named:
                raise TaskFileError(str(named)) from None
            cause = exc.__cause__ or exc  # what the check cannot foresee (a corrupt parquet file, ...)
            raise TaskFileError(
                f"datasets could not read the dataset files {', '.join(sorted(builders or files))}: "
                f"{type(cause).__name__}: {str(cause).splitlines()[0][:200] if str(cause) else ''}"
            ) from None
    if not isinstance(ref, str):
        raise TaskFileError(
            f"dataset must be a path, a list of files, a split -> file mapping or a hub id, got {ref!r}"
        )
    local = (folder / ref).resolve()
    if local.is_dir():
        if (local / "dataset_dict.json").is_file() or (local / "state.json").is_file():
            loaded = datasets.load_from_disk(str(local))
            return dict(loaded) if isinstance(loaded, datasets.DatasetDict) else {"train": loaded}
        return dict(datasets.load_dataset(str(local), spec.subset))
    if ref.startswith((".", "/", "~")) or ref.count("/") > 1:
        raise TaskFileError(
            f"dataset {local} does not exist (paths are relative to the folder of the task's YAML file)"
        )
    try:
        return dict(datasets.load_dataset(ref, spec.subset))
    except Exception as exc:  # noqa: BLE001 -- offline, unknown id, gated: say which and how to lift it
        raise TaskFileError(
            f"dataset {ref!r} is neither a local file or folder (none at {local}) nor loadable from "
            f"the hub ({type(exc).__name__}: {str(exc)[:200]}); where the hub is reachable, unset "
            "HF_HUB_OFFLINE"
        ) from None


# --------------------------------------------------------------------------------------------
# The task.
# --------------------------------------------------------------------------------------------
class FunctionVerifier:
    """A TRL reward function as a :class:`~mrtpo.verifiers.Verifier` for one completion at a time
    (``mrtpo explain``, the report): TRL's call on a batch of one, with its example's row
    (``example.gold``); its evidence is the one its ``@evidence`` declares for that row."""

    def __init__(self, fn: Any, prompt_column: str, name: str | None = None):
        self.fn, self.prompt_column = fn, prompt_column
        self.name = name or reward_name(fn)

    def __call__(self, completion: str, example: Example) -> float | None:
        values = score(self.fn, self.name, [completion], [example], self.prompt_column)
        return None if values[0] is None else float(values[0])

    def evidence(self, example: Example) -> Evidence | None:
        from mrtpo.rewards import evidence_for

        return evidence_for(self.fn, example.gold)


def reward_name(fn: Any) -> str:
    """A reward function's name, as TRL names it (``__name__``, else its class's name)."""
    return getattr(fn, "__name__", type(fn).__name__)


def score(
    fn: Any,
    name: str,
    texts: list[str],
    examples: list[Example],
    prompt_column: str,
    completion_ids: list[list[int]] | None = None,
) -> list[Any]:
    """Reward ``fn``'s values for ``texts`` (one per example), from one call made as TRL makes it
    (:func:`mrtpo.reward_calls.call_reward`), checked as the trainer checks them."""
    from mrtpo.reward_calls import call_reward
    from mrtpo.rewards import RewardValueError, check_reward_values

    rows = [copy.deepcopy(ex.gold) for ex in examples]  # a reward that changes a list cell changes its own copy
    prompts = [row.pop(prompt_column) for row in rows]
    columns = {key: [row.get(key) for row in rows] for key in (rows[0] if rows else {})}
    columns["example_id"] = [ex.id for ex in examples]
    values = call_reward(fn, prompts, texts, columns, completion_ids=completion_ids)
    values = check_reward_values(name, values, [ex.id for ex in examples])
    if len(values) != len(texts):
        raise RewardValueError(f"reward function {name!r} returned {len(values)} values for {len(texts)} completions")
    return list(values)


class ConfigTask(Task):
    """A :class:`~mrtpo.tasks.Task` over a :class:`TaskSpec`'s dataset and reward functions.

    The trainer gets the functions themselves (:meth:`reward_funcs`) and the dataset's rows
    (:meth:`trainer_rows`), so TRL calls them as it calls any reward. An example's ``messages`` hold
    a text prompt as one user turn (the counterfactual prompts cut evidence from it); whether it is
    rendered raw or with the chat template is :attr:`chat` (:meth:`render_prompt`).
    """

    splits = ("train", "eval")

    def __init__(self, spec: TaskSpec, name: str):
        self.spec, self.name = spec, name
        self.max_new_tokens = spec.max_new_tokens
        self.rewards = reward_list(spec.rewards, spec.folder)
        self.reward_weights = [w for _, _, w in self.rewards]
        names = [reward_name(fn) for _, fn, _ in self.rewards]
        if len(set(names)) != len(names):
            raise TaskFileError(f"two rewards share a function name ({', '.join(names)}); rename one")
        self.chat = False
        self._examples = self._build()
        self._verifiers = [FunctionVerifier(fn, spec.prompt, n) for (_, fn, _), n in zip(self.rewards, names)]

    def _build(self) -> dict[str, LazyExamples]:
        spec = self.spec
        splits = load_splits(spec)
        for wanted in filter(None, (spec.train_split, spec.eval_split)):
            if wanted not in splits:
                raise TaskFileError(
                    f"dataset {spec.dataset!r} has no split {wanted!r}"
                    f"{close_match_hint(wanted, list(splits))}; its splits: {', '.join(splits)}"
                )
        columns = list(splits[spec.train_split].column_names)
        needed = [spec.prompt, *filter(None, [spec.id_column])]
        needed += [
            fn.mrtpo_evidence.source
            for _, fn, _ in self.rewards
            if isinstance(getattr(getattr(fn, "mrtpo_evidence", None), "source", None), str)
        ]
        for col in needed:
            if col not in columns:
                raise TaskFileError(
                    f"dataset {spec.dataset!r} has no column {col!r}{close_match_hint(col, columns)}; "
                    f"its columns: {', '.join(columns)}"
                )
        self._check_calls(columns)
        train = splits[spec.train_split]
        self.chat = prompt_is_chat(train, spec.prompt, spec.train_split)  # every row's prompt, from its Arrow type

        def lazy(split: str, rows: Any) -> LazyExamples:
            return LazyExamples(splits[split], split, rows, spec.prompt, spec.id_column)

        if spec.eval_split is not None:
            evals = splits[spec.eval_split]
            prompt_is_chat(evals, spec.prompt, spec.eval_split)  # its rows checked; the format is the train split's
            return {
                "train": lazy(spec.train_split, range(len(train))),
                "eval": lazy(spec.eval_split, range(len(evals))),
            }
        kept, held = held_out(len(train), spec.eval_fraction, spec.split_seed)
        return {"train": lazy(spec.train_split, kept), "eval": lazy(spec.train_split, held)}

    def _check_calls(self, columns: list[str]) -> None:
        """The trainer's dataset (the prompt column as ``prompt``, plus ``example_id``) must not clash with
        the task's columns, and TRL's call of each reward on it must bind (:func:`~mrtpo.reward_calls.call_problem`)."""
        from mrtpo.reward_calls import call_problem

        spec = self.spec
        for clash in ("prompt", "example_id"):
            if clash in columns and clash != spec.prompt and not (clash == "example_id" == spec.id_column):
                raise TaskFileError(
                    f"dataset {spec.dataset!r} has a column {clash!r} besides the prompt column "
                    f"{spec.prompt!r}; the trainer's dataset uses that name ("
                    + (
                        "TRL's prompt column): rename the column, or set prompt: prompt"
                        if clash == "prompt"
                        else "the example ids): set id_column: example_id"
                    )
                    + ")"
                )
        renamed = ["prompt" if c == spec.prompt else c for c in columns]
        trainer_columns = [*renamed, *([] if "example_id" in renamed else ["example_id"])]
        for ref, fn, _ in self.rewards:
            problem = call_problem(fn, reward_name(fn), trainer_columns)
            if problem is not None:
                raise TaskFileError(f"{problem} (reward {ref!r} of {spec.dataset!r})")

    def load(self, split: str, limit: int | None = None) -> Sequence[Example]:
        """The split's examples, each built when read (:class:`~mrtpo.tasks.lazy_rows.LazyExamples`)."""
        if split not in self.splits:
            raise ValueError(f"unknown split {split!r}; this task's splits are train and eval")
        examples = self._examples[split]
        return examples if limit is None else examples[:limit]

    def check_evidence(self, parts: list[Sequence[Example]]) -> None:
        """Each ``in_prompt`` evidence text a reward declares for an example of ``parts`` (this task's
        :meth:`load` results) occurs in its prompt, read from the columns before a model loads
        (:func:`~mrtpo.tasks.lazy_rows.check_evidence`)."""
        from mrtpo.rewards import EVIDENCE_ATTR

        declared = [(v.name, v.fn) for v in self._verifiers if getattr(v.fn, EVIDENCE_ATTR, None) is not None]
        for part in parts:
            if declared and isinstance(part, LazyExamples):
                check_evidence(part, declared)

    def verifiers(self) -> list[FunctionVerifier]:
        return list(self._verifiers)

    def reward_funcs(self, examples: Any = None) -> list[Any]:
        """The reward functions themselves, for the trainer (TRL calls them; their ``@evidence`` reads the rows)."""
        return [fn for _, fn, _ in self.rewards]

    def trainer_rows(self, examples: Sequence[Example]) -> Any:
        """The trainer's dataset rows: each example's columns, the prompt column as ``prompt`` (as given:
        text or messages), and ``example_id``; for this task's own (lazy) examples, a ``datasets.Dataset``
        over the same Arrow table (:meth:`~mrtpo.tasks.lazy_rows.LazyExamples.trainer_dataset`)."""
        if isinstance(examples, LazyExamples):
            return examples.trainer_dataset()
        rows = []
        for ex in examples:
            row = {k: v for k, v in ex.gold.items() if k != self.spec.prompt}
            rows.append({"prompt": ex.gold[self.spec.prompt], **row, "example_id": ex.id})
        return rows

    def render_prompt(self, example: Example, tokenizer: Any) -> str:
        """The prompt string as TRL renders it: a chat prompt through the chat template, a text prompt as is
        (its one user turn's text: the counterfactuals edit that turn)."""
        if self.chat:
            from mrtpo.counterfactual import default_render_prompt

            return default_render_prompt(example, tokenizer)
        return "".join(str(m["content"]) for m in example.messages)

    def evaluate(
        self, outputs: list[str], examples: list[Example], completion_ids: list[list[int]] | None = None
    ) -> dict[str, Any]:
        """Mean of each reward over the outputs (one call per reward, as TRL makes it), and their weighted
        sum (``reward_total``). A reward's None / NaN ("not applicable") counts as 0."""
        if len(outputs) != len(examples):
            raise ValueError(f"{len(outputs)} outputs for {len(examples)} examples")
        n = max(len(outputs), 1)
        metrics: dict[str, Any] = {}
        for v in self._verifiers:
            values = score(v.fn, v.name, list(outputs), examples, self.spec.prompt, completion_ids) if outputs else []
            metrics[f"reward/{v.name}"] = sum(_finite(x) for x in values) / n
        metrics["reward_total"] = sum(
            w * metrics[f"reward/{v.name}"] for v, w in zip(self._verifiers, self.reward_weights)
        )
        metrics["n"] = len(outputs)
        return metrics


def _finite(value: Any) -> float:
    return 0.0 if value is None or value != value else float(value)


def held_out(rows: int, fraction: float, seed: int) -> tuple[Any, Any]:
    """``(kept, held)`` row numbers (ascending) of an ``eval_fraction`` split: the first ``round(rows *
    fraction)`` of a ``random.Random(seed)`` shuffle of the rows are held out (the one pass over every row
    in Python: its row numbers, not its rows)."""
    import numpy as np

    count = round(rows * fraction)
    if not count:
        return range(rows), range(0)
    order = list(range(rows))
    random.Random(seed).shuffle(order)
    held = np.zeros(rows, dtype=bool)
    held[order[:count]] = True
    return np.flatnonzero(~held), np.flatnonzero(held)


def task_name(path: str | Path, spec: TaskSpec) -> str:
    """The task's short name: its ``name`` key, else the folder its YAML file is in."""
    return spec.name or Path(path).resolve().parent.name or "task"


def load_task_file(path: str | Path) -> ConfigTask:
    """The task a YAML file declares, its data loaded and its rewards imported (or a TaskFileError)."""
    spec = read_spec(path)
    return ConfigTask(spec, task_name(path, spec))


__all__ = [
    "ConfigTask",
    "FunctionVerifier",
    "TaskFileError",
    "TaskSpec",
    "as_messages",
    "held_out",
    "load_reward",
    "load_splits",
    "load_task_file",
    "read_spec",
    "reward_list",
    "reward_name",
    "score",
    "spec_from_mapping",
]
