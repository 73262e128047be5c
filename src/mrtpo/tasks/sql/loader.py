"""Find, validate and read the Spider dev data (questions, gold SQL, SQLite databases).

Where the data is looked for, first hit wins:

1. the ``data_dir`` argument;
2. the environment variable ``MRTPO_SPIDER_DIR``;
3. ``<project root>/../shared/data/spider`` (the project root holds ``pyproject.toml``).

The folder must hold ``dev.json``, ``tables.json`` and ``database/<db_id>/<db_id>.sqlite`` for
the 19 databases used here (Spider's layout). It is only read, never written or copied.

Validation (``verify``): ``"sha256"`` (default) checks ``dev.json``, ``tables.json`` and every
database file against the hashes published in the data folder's README, so reported numbers
refer to exactly those files; ``"schema"`` accepts another genuine copy of Spider (e.g. the
official download) and checks instead that each database's tables and columns equal
``tables.json``. Both check that the splits have their documented sizes.

The split is **by database** (Spider is cross-database: no eval schema is seen in training), in
``dev.json`` order within each split.
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mrtpo.model_presets import sha256_file

ENV_VAR = "MRTPO_SPIDER_DIR"

TRAIN_DBS: tuple[str, ...] = (
    "cre_Doc_Template_Mgt",
    "flight_2",
    "tvshow",
    "concert_singer",
    "poker_player",
    "employee_hire_evaluation",
    "singer",
    "battle_death",
    "real_estate_properties",
)
EVAL_DBS: tuple[str, ...] = (
    "world_1",
    "car_1",
    "dog_kennels",
    "student_transcripts_tracking",
    "network_1",
    "pets_1",
    "orchestra",
    "course_teach",
    "museum_visit",
    "voter_1",
)
SPLITS: dict[str, tuple[str, ...]] = {"train": TRAIN_DBS, "eval": EVAL_DBS}
SPLIT_SIZES: dict[str, int] = {"train": 399, "eval": 573}

# From ../shared/data/spider/README.md (the rebuilt databases with the original values).
SHA256: dict[str, str] = {
    "dev.json": "30d64a3fccde493226df79687aed9e4a1c0129525baf44f29c0573d914d758a4",
    "tables.json": "61bb20aa401f03164e2d7f3b16509b7b5f79cc9c943ca7bd159046df1159e2ed",
    "database/battle_death/battle_death.sqlite": "3fd74e007c3e07fd9cd2cff9b4045741c9148cbc1228f66f205ed74bcd49204c",
    "database/car_1/car_1.sqlite": "38a0c4801f153762ceb25b96c5b1e4331ee89a90f31d8cc9d33e3f17a880f7a2",
    "database/concert_singer/concert_singer.sqlite": "af417951fea269a7b464bbe20c62d6cf1ce63aecd1010aa2be77f41034374e27",
    "database/course_teach/course_teach.sqlite": "e4e4aa7615bdbdf1b2dc74bfb6ee5191dcc4a7069ceacca4842c8da80019cddf",
    "database/cre_Doc_Template_Mgt/cre_Doc_Template_Mgt.sqlite": "36f6253907ea710ee2624f404d6bdc04d989d70d5ab6bd30d41d5fe0769bc41e",  # noqa: E501 (a path and its hash, unsplittable)
    "database/dog_kennels/dog_kennels.sqlite": "d61ef53b3e2381847a869feaf5338d4125affb92994d96a9ca74bb8c6044d4f9",
    "database/employee_hire_evaluation/employee_hire_evaluation.sqlite": "9db9165d487ce96e36a9532ba70210266a27bc2c1c916ddaf6647c5b2941ecb1",  # noqa: E501 (a path and its hash, unsplittable)
    "database/flight_2/flight_2.sqlite": "bc1556436a224795f7b69082d4428f1a23ad0e1f406370850bd8831f1566e4fa",
    "database/museum_visit/museum_visit.sqlite": "e8f199b578f0bd69a70d2ecae3b50dd3405ce25ea6983afb6b5649df8d499a61",
    "database/network_1/network_1.sqlite": "70f3cf2c0113f99eafd3ff2e38fb1f9e2bb3c399949ad4c766f7549bd7c6bd60",
    "database/orchestra/orchestra.sqlite": "19bb9f9a4b57a1a734459e9d9042a70f7340526ea563352f1e8d9b5c7a1c58b8",
    "database/pets_1/pets_1.sqlite": "77f11b0456b6799313ddbf5672f63356e6f66fc74238b7d6ef281631863cd7c9",
    "database/poker_player/poker_player.sqlite": "cf3a506278c980b5c0b39939b307599a66224807ba0747892a5d288aaa1409a1",
    "database/real_estate_properties/real_estate_properties.sqlite": "557fe06e83b886a7babaed3fa2b93f18b87f8064837b56fef41e0d14dfa2170d",  # noqa: E501 (a path and its hash, unsplittable)
    "database/singer/singer.sqlite": "d9c2257263547274d76a7a5f5d389af0501ed119f34b9f4d609f64da1b167e3a",
    "database/student_transcripts_tracking/student_transcripts_tracking.sqlite": "cf86d6f3e030d76b86f773a27f980b53261a71aaf1103a429f8f1f6e8a7c33c6",  # noqa: E501 (a path and its hash, unsplittable)
    "database/tvshow/tvshow.sqlite": "ae97a36fade7c957d29c13b0e0c67ff678acb1d641d58779aa014ae3a777018c",
    "database/voter_1/voter_1.sqlite": "1218208b8a30d6920fbb5d7dd5ce31e10069ccae749fd08b5c5364c646a7edbe",
    "database/world_1/world_1.sqlite": "42f3380ce1e3fbe59e2498237458e0e69089c4c7ff9f57d0d943de25b8072b3d",
}

HOW_TO_GET = (
    "Spider (CC BY-SA 4.0) is at https://yale-lily.github.io/spider: the download holds dev.json, "
    "tables.json and database/<db_id>/<db_id>.sqlite. This project expects the copy described in "
    "../shared/data/spider/README.md (19 dev databases with their original values). Point "
    f"${ENV_VAR} at the folder (or pass data_dir=...); for a copy other than that one, also pass "
    "verify='schema' since its file hashes differ."
)


class SpiderDataError(RuntimeError):
    """The Spider folder is missing, incomplete or not the expected files."""


@dataclass(frozen=True)
class SpiderItem:
    """One dev question: its index in dev.json, database, question and gold SQL."""

    index: int
    db_id: str
    question: str
    query: str
    db_path: Path


def project_root() -> Path:
    """The folder holding pyproject.toml above this file, else the current directory."""
    here = Path(__file__).resolve()
    for parent in here.parents:
        if (parent / "pyproject.toml").is_file() and (parent / "src" / "mrtpo").is_dir():
            return parent
    return Path.cwd()


def default_data_dir() -> Path:
    return project_root().parent / "shared" / "data" / "spider"


def find_spider_dir(data_dir: str | os.PathLike[str] | None = None) -> Path:
    """Resolve the Spider folder (argument, then ``$MRTPO_SPIDER_DIR``, then the default)."""
    env = os.environ.get(ENV_VAR)
    candidates: list[tuple[str, Path | None]] = [
        ("data_dir argument", Path(data_dir) if data_dir is not None else None),
        (f"${ENV_VAR}", Path(env) if env else None),
        ("default <project root>/../shared/data/spider", default_data_dir()),
    ]
    for _, path in candidates:
        if path is not None:
            # The first location that is given is the one used; a wrong explicit path is an
            # error rather than a silent fall-through to another copy.
            if (path / "dev.json").is_file():
                return path.resolve()
            break
    tried = "; ".join(f"{label}: {path if path is not None else '(not set)'}" for label, path in candidates)
    raise SpiderDataError(f"Spider data not found (no dev.json). Looked at {tried}. {HOW_TO_GET}")


def db_path(root: Path, db_id: str) -> Path:
    return root / "database" / db_id / f"{db_id}.sqlite"


def _db_tables(path: Path) -> dict[str, list[str]]:
    """Table -> column names, read over a plain read-only connection (trusted, no model SQL)."""
    con = sqlite3.connect(path.resolve().as_uri() + "?mode=ro", uri=True)
    try:
        names = [r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table' ORDER BY rowid")]
        return {t: [r[1] for r in con.execute(f'PRAGMA table_info("{t}")')] for t in names}
    finally:
        con.close()


_validated: set[tuple[Any, ...]] = set()
_lock = threading.Lock()


def validate(root: Path, db_ids: tuple[str, ...], verify: str = "sha256") -> None:
    """Check that ``root`` holds the expected files for ``db_ids``; raise SpiderDataError if not."""
    if verify not in ("sha256", "schema"):
        raise ValueError(f"verify must be 'sha256' or 'schema', got {verify!r}")
    # Memoised per process, keyed by the files' identity (inode, size, mtime) so that a changed
    # or replaced file is checked again.
    files = [root / "dev.json", root / "tables.json"] + [db_path(root, d) for d in db_ids]
    try:
        ident = tuple((str(f), (st := f.stat()).st_ino, st.st_size, st.st_mtime_ns) for f in files)
    except OSError:
        ident = None
    key = (str(root), verify, tuple(sorted(db_ids)), ident)
    with _lock:
        if key in _validated:
            return
    missing = [p for p in ("dev.json", "tables.json") if not (root / p).is_file()]
    missing += [str(db_path(root, d).relative_to(root)) for d in db_ids if not db_path(root, d).is_file()]
    if missing:
        raise SpiderDataError(f"Spider folder {root} is incomplete, missing: {', '.join(missing)}. {HOW_TO_GET}")
    if verify == "sha256":
        rels = ["dev.json", "tables.json"] + [str(db_path(root, d).relative_to(root)) for d in db_ids]
        bad = [r for r in rels if sha256_file(root / r) != SHA256[r]]
        if bad:
            raise SpiderDataError(
                f"sha256 mismatch in {root} for: {', '.join(bad)}. These are not the files described in "
                f"../shared/data/spider/README.md. If this is another genuine copy of Spider, pass "
                f"verify='schema'. {HOW_TO_GET}"
            )
    # Schema check in both modes (cheap): tables and columns equal tables.json.
    schemas = {s["db_id"]: s for s in json.loads((root / "tables.json").read_text(encoding="utf-8"))}
    for d in db_ids:
        if d not in schemas:
            raise SpiderDataError(f"tables.json in {root} has no schema for {d!r}")
        s = schemas[d]
        expected: dict[str, list[str]] = {t: [] for t in s["table_names_original"]}
        for t_idx, col in s["column_names_original"]:
            if t_idx >= 0:
                expected[s["table_names_original"][t_idx]].append(col)
        actual = _db_tables(db_path(root, d))
        norm_e = {t.lower(): [c.lower() for c in cs] for t, cs in expected.items()}
        norm_a = {t.lower(): [c.lower() for c in cs] for t, cs in actual.items()}
        if norm_e != norm_a:
            raise SpiderDataError(
                f"database {d} does not match tables.json: tables {sorted(actual)} vs {sorted(expected)} "
                f"(or their columns differ). {HOW_TO_GET}"
            )
    with _lock:
        _validated.add(key)


def load_items(split: str, data_dir: str | os.PathLike[str] | None = None, verify: str = "sha256") -> list[SpiderItem]:
    """The questions of ``split`` ("train" or "eval") in dev.json order, validated."""
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; use 'train' or 'eval'")
    root = find_spider_dir(data_dir)
    dbs = SPLITS[split]
    validate(root, dbs, verify)
    raw: list[dict[str, Any]] = json.loads((root / "dev.json").read_text(encoding="utf-8"))
    wanted = set(dbs)
    items = [
        SpiderItem(i, x["db_id"], x["question"], x["query"], db_path(root, x["db_id"]))
        for i, x in enumerate(raw)
        if x["db_id"] in wanted
    ]
    if len(items) != SPLIT_SIZES[split]:
        raise SpiderDataError(
            f"split {split!r} has {len(items)} questions in {root / 'dev.json'}, expected {SPLIT_SIZES[split]}. "
            f"Is this Spider's (corrected, 2020-06-08) dev.json? {HOW_TO_GET}"
        )
    return items


__all__ = [
    "ENV_VAR",
    "EVAL_DBS",
    "SHA256",
    "SPLITS",
    "SPLIT_SIZES",
    "SpiderDataError",
    "SpiderItem",
    "TRAIN_DBS",
    "db_path",
    "default_data_dir",
    "find_spider_dir",
    "load_items",
    "validate",
]
