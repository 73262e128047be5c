"""Access to the offline BFCL v4 package (``bfcl-eval==2026.3.23``, installed with ``--no-deps``).

Two jobs: locate the package's data folder without importing it, and import BFCL's own AST checker.

Why a shim: ``bfcl_eval/eval_checker/ast_eval/ast_checker.py`` does
``from bfcl_eval.constants.model_config import MODEL_CONFIG_MAPPING``, and ``model_config`` imports
every vendor handler (anthropic, openai, cohere, mistral, google-genai, boto3, ...), none of which
are installed here (and none of which the checker needs). The checker reads the mapping for exactly
one thing: ``MODEL_CONFIG_MAPPING[model_name].underscore_to_dot``, used when a function name contains
a dot, to undo the ``.``→``_`` renaming some API vendors force on tool names. We keep dotted names
as they are, so the answer is ``False``.

So :func:`load_ast_checker` puts a stub module under that one name in ``sys.modules`` (a mapping with
a single model, :data:`CHECKER_MODEL_NAME`, whose ``underscore_to_dot`` is ``False``), imports the
checker, then removes the stub again, so a later real import of ``model_config`` (on a machine with
the SDKs) is not affected. Nothing in site-packages is edited. If the real module is already
imported, it is used as is and a model name with ``underscore_to_dot=False`` is picked from it.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

BFCL_REQUIREMENT = "bfcl-eval==2026.3.23"
# The model name passed to BFCL's checker; only its ``underscore_to_dot`` flag is ever read.
CHECKER_MODEL_NAME = "mrtpo-local"
_MODEL_CONFIG = "bfcl_eval.constants.model_config"
_CHECKER = "bfcl_eval.eval_checker.ast_eval.ast_checker"

_INSTALL_HINT = (
    f"the BFCL data package is missing: install it with `pip install --no-deps {BFCL_REQUIREMENT}` "
    "(or run `bash scripts/setup.sh`, which installs requirements/nodeps-toolcall.txt)"
)


class BFCLUnavailable(RuntimeError):
    """``bfcl-eval`` is not installed, or its checker cannot be imported even with the shim."""


def data_dir() -> Path:
    """The installed package's ``data`` folder (questions; answers under ``possible_answer/``)."""
    spec = importlib.util.find_spec("bfcl_eval")  # locates the package without running it
    if spec is None or not spec.submodule_search_locations:
        raise BFCLUnavailable(_INSTALL_HINT)
    folder = Path(next(iter(spec.submodule_search_locations))) / "data"
    if not folder.is_dir():
        raise BFCLUnavailable(f"{folder} does not exist; {_INSTALL_HINT}")
    return folder


@dataclass(frozen=True)
class _StubModelConfig:
    """The one field of BFCL's ``ModelConfig`` that the AST checker reads."""

    underscore_to_dot: bool = False


@dataclass(frozen=True)
class Checker:
    """BFCL's ``ast_checker`` with the arguments it needs besides the item itself."""

    ast_checker: Callable[..., dict[str, Any]]
    python_language: Any  # bfcl_eval.constants.enums.Language.PYTHON
    model_name: str

    def check(
        self, functions: list[dict], decoded: list[dict], ground_truth: list[dict], category: str
    ) -> dict[str, Any]:
        """Run BFCL's checker on one decoded output ``[{name: {param: value}}, ...]``."""
        return self.ast_checker(functions, decoded, ground_truth, self.python_language, category, self.model_name)


def _pick_real_model_name(mapping: Any) -> str:
    # convert_func_name looks up model_name.replace("_", "/"): pick a key without underscores.
    for key in sorted(mapping):
        if "_" not in key and not getattr(mapping[key], "underscore_to_dot", True):
            return key
    raise BFCLUnavailable("bfcl_eval.constants.model_config is loaded but has no model with underscore_to_dot=False")


@lru_cache(maxsize=1)
def load_ast_checker() -> Checker:
    """Import BFCL's AST checker through the stub described in the module docstring."""
    data_dir()  # clear error first if the package is absent
    injected = False
    if _MODEL_CONFIG in sys.modules:
        model_name = _pick_real_model_name(sys.modules[_MODEL_CONFIG].MODEL_CONFIG_MAPPING)
    else:
        stub = types.ModuleType(_MODEL_CONFIG)
        stub.__doc__ = "mrtpo stub (see mrtpo.tasks.toolcall.bfcl_shim): no vendor SDKs needed."
        stub.MODEL_CONFIG_MAPPING = {CHECKER_MODEL_NAME: _StubModelConfig(underscore_to_dot=False)}
        sys.modules[_MODEL_CONFIG] = stub
        injected = True
        model_name = CHECKER_MODEL_NAME
    try:
        module = importlib.import_module(_CHECKER)
        enums = importlib.import_module("bfcl_eval.constants.enums")
    except ImportError as exc:  # a dependency other than the vendor SDKs is missing
        raise BFCLUnavailable(f"cannot import BFCL's AST checker even with the shim: {exc}") from exc
    finally:
        if injected:
            sys.modules.pop(_MODEL_CONFIG, None)
    return Checker(module.ast_checker, enums.Language.PYTHON, model_name)


__all__ = [
    "BFCL_REQUIREMENT",
    "CHECKER_MODEL_NAME",
    "BFCLUnavailable",
    "Checker",
    "data_dir",
    "load_ast_checker",
]
