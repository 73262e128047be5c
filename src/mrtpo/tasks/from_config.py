"""A task from a dataset and reward functions, declared in YAML: no package code.

A ``task:`` block in a training config (or a task file of its own, ``mrtpo train --task task.yaml``)::

    task:
      dataset: prompts.jsonl          # json/jsonl/csv/parquet file(s), a saved dataset folder, or a hub id
      prompt: instruction             # the prompt column: plain text or a list of chat messages
      eval_fraction: 0.2              # or eval_split: test (a split of the dataset)
      rewards:                        # file.py:function (next to this file) or package.module:function
        rewards.py:no_commas: 1.0     #   -> its weight
        rewards.py:short: 0.5

Each reward is an ordinary TRL reward function ``fn(prompts, completions, **columns) -> list[float]``
(it may carry :func:`mrtpo.rewards.evidence`); the task calls it once per completion with that row's
columns. Paths are relative to the YAML file's folder. The file's path is the task's name in the
registry (:func:`mrtpo.tasks.get_task` registers it on first use), so a run's saved ``config.yaml``
names it and the report, ``mrtpo eval`` and ``mrtpo explain`` find it again. Every mistake (a missing
file or column, a reward that does not import, an unknown key) is a :class:`TaskFileError` that says
the fix.
"""

from __future__ import annotations

import copy
import difflib
import hashlib
import importlib
import importlib.util
import math
import random
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mrtpo.tasks.data_files import DataFileError, check_data_file
from mrtpo.verifiers import Evidence, Example

#: Data-file suffix -> the ``datasets`` builder that reads it.
_BUILDERS = {".json": "json", ".jsonl": "json", ".csv": "csv", ".parquet": "parquet"}


class TaskFileError(ValueError):
    """A task block that cannot work as written (the message names the key, file or column and the fix)."""


@dataclass
class TaskSpec:
    """The keys of a ``task:`` block (one-line docs: what each means)."""

    dataset: Any = None
    """a data file, a list of them, a mapping split -> file(s), a saved dataset folder, or a hub id"""
    prompt: str = "prompt"
    """the prompt column: text (one user turn) or a list of {role, content} messages"""
    rewards: Any = None
    """reward functions: a list of paths, or a mapping path -> weight (path: file.py:fn or pkg.module:fn)"""
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


def _did_you_mean(word: str, options: list[str]) -> str:
    close = difflib.get_close_matches(word, options, n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


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
            raise TaskFileError(f"unknown key {key!r} in the task block of {source}{_did_you_mean(str(key), known)}; "
                                f"valid keys: {', '.join(known)}")
    spec = TaskSpec(**block, folder=folder)
    if spec.dataset in (None, "", [], {}):
        raise TaskFileError(f"the task block of {source} names no dataset: add `dataset: data.jsonl` "
                            "(a file, a saved dataset folder or a hub id)")
    if not spec.rewards:
        raise TaskFileError(f"the task block of {source} names no rewards: add `rewards: [rewards.py:my_reward]`")
    if not isinstance(spec.rewards, (list, dict)):
        raise TaskFileError(f"rewards in {source} must be a list of paths or a mapping path -> weight, "
                            f"got {spec.rewards!r}")
    if not isinstance(spec.prompt, str):
        raise TaskFileError(f"prompt in {source} must be a column name, got {spec.prompt!r}")
    if not (isinstance(spec.eval_fraction, (int, float)) and 0 <= spec.eval_fraction < 1):
        raise TaskFileError(f"eval_fraction in {source} must be in [0, 1), got {spec.eval_fraction!r}")
    if spec.eval_split is not None and spec.eval_fraction:
        raise TaskFileError(f"{source}: set eval_split or eval_fraction, not both")
    return spec


# --------------------------------------------------------------------------------------------
# Reward functions by path.
# --------------------------------------------------------------------------------------------
def _module_from_file(path: Path) -> Any:
    """Import a Python file as a module (once per file; registered in sys.modules under a unique name)."""
    name = "mrtpo_task_rewards_" + hashlib.sha1(str(path).encode()).hexdigest()[:12]
    if name in sys.modules:
        return sys.modules[name]
    loader_spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(loader_spec)
    sys.modules[name] = module
    try:
        loader_spec.loader.exec_module(module)
    except Exception:
        del sys.modules[name]
        raise
    return module


def load_reward(ref: Any, folder: Path) -> Any:
    """The function that ``ref`` (``file.py:fn`` relative to ``folder``, or ``pkg.module:fn``) names."""
    if not isinstance(ref, str) or ref.count(":") != 1 or not all(ref.split(":")):
        raise TaskFileError(f"reward {ref!r} must be 'file.py:function' or 'package.module:function'")
    where, attr = ref.split(":")
    try:
        if where.endswith(".py") or "/" in where:
            path = (folder / where).resolve()
            if not path.is_file():
                raise TaskFileError(f"reward {ref!r}: file {path} does not exist (paths are relative to the "
                                    "folder of the task's YAML file)")
            module = _module_from_file(path)
        else:
            module = importlib.import_module(where)
    except TaskFileError:
        raise
    except (Exception, SystemExit) as exc:  # noqa: BLE001 -- the user's module may raise (or exit) while importing
        raise TaskFileError(f"reward {ref!r}: {where} does not import ({type(exc).__name__}: {exc})") from None
    if not hasattr(module, attr):
        defined = sorted(n for n, v in vars(module).items() if callable(v) and not n.startswith("_")
                         and getattr(v, "__module__", None) == module.__name__)
        raise TaskFileError(f"reward {ref!r}: {where} has no {attr!r}{_did_you_mean(attr, defined)}; "
                            f"it defines {', '.join(defined) or 'no functions'}")
    fn = getattr(module, attr)
    if not callable(fn):
        raise TaskFileError(f"reward {ref!r} is a {type(fn).__name__}, not a function "
                            "fn(prompts, completions, **columns) -> list[float]")
    return fn


def reward_list(spec: TaskSpec) -> list[tuple[str, Any, float]]:
    """``(path, function, weight)`` for each reward of ``spec``, in order."""
    items = spec.rewards.items() if isinstance(spec.rewards, dict) else ((r, 1.0) for r in spec.rewards)
    out = []
    for ref, weight in items:
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not math.isfinite(weight):
            raise TaskFileError(f"the weight of reward {ref!r} must be a{' finite' * isinstance(weight, float)} "
                                f"number, got {weight!r}")
        out.append((ref, load_reward(ref, spec.folder), float(weight)))
    return out


# --------------------------------------------------------------------------------------------
# The dataset.
# --------------------------------------------------------------------------------------------
def _data_files(value: Any, folder: Path) -> list[Path]:
    files = [value] if isinstance(value, str) else list(value)
    paths = [(folder / str(f)).resolve() for f in files]
    for p in paths:
        if not p.is_file():
            raise TaskFileError(f"dataset file {p} does not exist (paths are relative to the folder of the task's "
                                "YAML file)")
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


def _load_splits(spec: TaskSpec) -> dict[str, Any]:
    import datasets

    ref, folder = spec.dataset, spec.folder
    if isinstance(ref, (dict, list)) or (isinstance(ref, str) and (Path(ref).suffix.lower() in _BUILDERS
                                                                  or (folder / ref).is_file())):
        by_split = ref if isinstance(ref, dict) else {"train": ref}
        files = {str(s): [str(p) for p in _data_files(f, folder)] for s, f in by_split.items()}
        builders = {_BUILDERS[Path(f).suffix.lower()] for fs in files.values() for f in fs}
        if len(builders) > 1:
            raise TaskFileError(f"dataset files mix formats ({', '.join(sorted(builders))}); use one format")
        try:  # a file datasets would reject: one line naming the file and the line (mrtpo.tasks.data_files)
            for f in {f for fs in files.values() for f in fs}:
                check_data_file(Path(f))
            return dict(datasets.load_dataset(builders.pop(), data_files=files))
        except DataFileError as exc:
            raise TaskFileError(str(exc)) from None
        except Exception as exc:  # noqa: BLE001 -- what the check cannot foresee (a corrupt parquet file, ...)
            cause = exc.__cause__ or exc
            raise TaskFileError(f"datasets could not read the dataset files {', '.join(sorted(builders or files))}: "
                                f"{type(cause).__name__}: {str(cause).splitlines()[0][:200] if str(cause) else ''}"
                                ) from None
    if not isinstance(ref, str):
        raise TaskFileError(f"dataset must be a path, a list of files, a split -> file mapping or a hub id, "
                            f"got {ref!r}")
    local = (folder / ref).resolve()
    if local.is_dir():
        if (local / "dataset_dict.json").is_file() or (local / "state.json").is_file():
            loaded = datasets.load_from_disk(str(local))
            return dict(loaded) if isinstance(loaded, datasets.DatasetDict) else {"train": loaded}
        return dict(datasets.load_dataset(str(local), spec.subset))
    if ref.startswith((".", "/", "~")) or ref.count("/") > 1:
        raise TaskFileError(f"dataset {local} does not exist "
                            "(paths are relative to the folder of the task's YAML file)")
    try:
        return dict(datasets.load_dataset(ref, spec.subset))
    except Exception as exc:  # noqa: BLE001 -- offline, unknown id, gated: say which and how to lift it
        raise TaskFileError(f"dataset {ref!r} is neither a local file or folder (none at {local}) nor loadable from "
                            f"the hub ({type(exc).__name__}: {str(exc)[:200]}); where the hub is reachable, unset "
                            "HF_HUB_OFFLINE") from None


# --------------------------------------------------------------------------------------------
# The task.
# --------------------------------------------------------------------------------------------
class FunctionVerifier:
    """A TRL reward function as a :class:`~mrtpo.verifiers.Verifier`: called on one completion with its
    example's row (``example.gold``); its evidence is the one its ``@evidence`` declares for that row."""

    def __init__(self, fn: Any, prompt_column: str, chat: bool):
        self.fn, self.prompt_column, self.chat = fn, prompt_column, chat
        self.name = getattr(fn, "__name__", type(fn).__name__)

    def __call__(self, completion: str, example: Example) -> float | None:
        from mrtpo.rewards import check_reward_values

        row = copy.deepcopy(example.gold)  # a reward that changes a list cell changes its own copy only
        prompt = row.pop(self.prompt_column)
        shown = [{"role": "assistant", "content": completion}] if self.chat else completion
        values = check_reward_values(self.name, self.fn(prompts=[prompt], completions=[shown],
                                                        **{k: [v] for k, v in row.items()}), [example.id])
        if len(values) != 1:
            from mrtpo.rewards import RewardValueError

            raise RewardValueError(f"reward function {self.name!r} returned {len(values)} values for 1 completion")
        return None if values[0] is None else float(values[0])

    def evidence(self, example: Example) -> Evidence | None:
        from mrtpo.rewards import evidence_for

        return evidence_for(self.fn, example.gold)


def as_messages(value: Any, where: str) -> list[dict[str, Any]]:
    """A prompt cell as chat messages: text is one user turn; a list of {role, content} passes as is."""
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    if isinstance(value, list) and value and all(isinstance(m, dict) and "role" in m and "content" in m for m in value):
        return [dict(m) for m in value]
    raise TaskFileError(f"{where}: the prompt must be text or a list of {{role, content}} messages, got {value!r:.80}")


class ConfigTask:
    """A :class:`~mrtpo.tasks.Task` over a :class:`TaskSpec`'s dataset and reward functions."""

    splits = ("train", "eval")

    def __init__(self, spec: TaskSpec, name: str):
        self.spec, self.name = spec, name
        self.max_new_tokens = spec.max_new_tokens
        self.rewards = reward_list(spec)
        self.reward_weights = [w for _, _, w in self.rewards]
        names = [getattr(fn, "__name__", ref) for ref, fn, _ in self.rewards]
        if len(set(names)) != len(names):
            raise TaskFileError(f"two rewards share a function name ({', '.join(names)}); rename one")
        self._examples = self._build()
        chat = any(not isinstance(ex.gold[spec.prompt], str) for ex in self._examples["train"][:1])
        self._verifiers = [FunctionVerifier(fn, spec.prompt, chat) for _, fn, _ in self.rewards]

    def _build(self) -> dict[str, list[Example]]:
        spec = self.spec
        splits = load_splits(spec)
        for wanted in filter(None, (spec.train_split, spec.eval_split)):
            if wanted not in splits:
                raise TaskFileError(f"dataset {spec.dataset!r} has no split {wanted!r}"
                                    f"{_did_you_mean(wanted, list(splits))}; its splits: {', '.join(splits)}")
        columns = list(splits[spec.train_split].column_names)
        needed = [spec.prompt, *filter(None, [spec.id_column])]
        needed += [fn.mrtpo_evidence.source for _, fn, _ in self.rewards
                   if isinstance(getattr(getattr(fn, "mrtpo_evidence", None), "source", None), str)]
        for col in needed:
            if col not in columns:
                raise TaskFileError(f"dataset {spec.dataset!r} has no column {col!r}{_did_you_mean(col, columns)}; "
                                    f"its columns: {', '.join(columns)}")
        train = self._examples_of(splits[spec.train_split], spec.train_split)
        if spec.eval_split is not None:
            return {"train": train, "eval": self._examples_of(splits[spec.eval_split], spec.eval_split)}
        order = list(range(len(train)))
        random.Random(spec.split_seed).shuffle(order)
        held = set(order[:round(len(train) * spec.eval_fraction)])
        return {"train": [ex for i, ex in enumerate(train) if i not in held],
                "eval": [ex for i, ex in enumerate(train) if i in held]}

    def _examples_of(self, rows: Any, split: str) -> list[Example]:
        out = []
        for i, row in enumerate(rows.to_list() if hasattr(rows, "to_list") else rows):  # one arrow pass, not per row
            ex_id = str(row[self.spec.id_column]) if self.spec.id_column else f"{split}-{i}"
            messages = as_messages(row[self.spec.prompt], f"row {i} of split {split!r}")
            out.append(Example(id=ex_id, split=split, messages=messages, gold=dict(row), meta={"row": i}))
        return out

    def load(self, split: str, limit: int | None = None) -> list[Example]:
        if split not in self.splits:
            raise ValueError(f"unknown split {split!r}; this task's splits are train and eval")
        examples = self._examples[split]
        return examples if limit is None else examples[:limit]

    def verifiers(self) -> list[FunctionVerifier]:
        return list(self._verifiers)

    def evaluate(self, outputs: list[str], examples: list[Example]) -> dict[str, Any]:
        """Mean of each reward over the outputs, and their weighted sum (``reward_total``)."""
        if len(outputs) != len(examples):
            raise ValueError(f"{len(outputs)} outputs for {len(examples)} examples")
        n = max(len(outputs), 1)
        metrics: dict[str, Any] = {}
        for v in self._verifiers:
            metrics[f"reward/{v.name}"] = sum(v(o, ex) or 0.0 for o, ex in zip(outputs, examples)) / n
        metrics["reward_total"] = sum(w * metrics[f"reward/{v.name}"]
                                      for v, w in zip(self._verifiers, self.reward_weights))
        metrics["n"] = len(outputs)
        return metrics


def task_name(path: str | Path, spec: TaskSpec) -> str:
    """The task's short name: its ``name`` key, else the folder its YAML file is in."""
    return spec.name or Path(path).resolve().parent.name or "task"


def load_task_file(path: str | Path) -> ConfigTask:
    """The task a YAML file declares, its data loaded and its rewards imported (or a TaskFileError)."""
    spec = read_spec(path)
    return ConfigTask(spec, task_name(path, spec))


__all__ = ["ConfigTask", "FunctionVerifier", "TaskFileError", "TaskSpec", "as_messages", "load_reward",
           "load_splits", "load_task_file", "read_spec", "reward_list", "spec_from_mapping"]
