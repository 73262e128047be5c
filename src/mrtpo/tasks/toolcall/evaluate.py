"""Held-out scoring with BFCL's own AST checker (``bfcl-eval==2026.3.23``).

Per item, mirroring BFCL's ``eval_runner``:

* call categories (``simple_python``, ``multiple``, ``parallel``, ``parallel_multiple``, and the live
  ones): the completion is decoded by :func:`~mrtpo.tasks.toolcall.parse.parse_completion` into
  BFCL's decoded shape ``[{name: {param: value}}]`` (the role a BFCL model handler's ``decode_ast``
  plays); a decoding failure is ``ast_decoder:decoder_failed``. Otherwise BFCL's ``ast_checker``
  decides, on the original BFCL function docs and possible answers, with the category routing
  (simple / multiple / parallel, order-free) and error types it defines.
* irrelevance categories: correct iff no call is decoded (BFCL: a failed or empty decode means no
  call); a decoded call is ``irrelevance_error:decoder_success``.

Also reported: the ``format`` reward's mean (the "format rate"), overall and per category.
"""

from __future__ import annotations

import copy
import json
from typing import Any

from mrtpo.tasks.toolcall.bfcl_shim import BFCL_REQUIREMENT, load_ast_checker
from mrtpo.tasks.toolcall.data import expects_no_call
from mrtpo.tasks.toolcall.parse import parse_completion, to_bfcl
from mrtpo.tasks.toolcall.verifiers import FormatVerifier
from mrtpo.verifiers import Example


def _jsonable(value: Any) -> Any:
    """BFCL error payloads may hold model outputs; make them JSON-safe."""
    return json.loads(json.dumps(value, default=repr, ensure_ascii=False))


def check_item(output: str, example: Example) -> dict[str, Any]:
    """BFCL's verdict on one output: ``{"valid": bool, "error_type": str|None, "error": list}``."""
    category = example.meta.get("category", "")
    parsed = parse_completion(output)
    if expects_no_call(category):
        if parsed.ok:
            return {
                "valid": False,
                "error_type": "irrelevance_error:decoder_success",
                "error": ["Valid syntax. Successfully decode AST when it should not."],
            }
        return {"valid": True, "error_type": None, "error": []}
    if not parsed.ok:
        return {
            "valid": False,
            "error_type": "ast_decoder:decoder_failed",
            "error": [f"Invalid syntax. Failed to decode AST. {parsed.error}"],
        }
    checker = load_ast_checker()
    try:
        verdict = checker.check(
            copy.deepcopy(example.meta["functions"]),
            to_bfcl(parsed.calls),
            copy.deepcopy(example.gold["ground_truth"]),
            category,
        )
    except Exception as exc:  # noqa: BLE001 - BFCL's checker trips on some malformed values
        return {
            "valid": False,
            "error_type": "checker_exception",
            "error": [f"BFCL's checker raised {type(exc).__name__}: {exc}"],
        }
    return {
        "valid": bool(verdict.get("valid")),
        "error_type": None if verdict.get("valid") else verdict.get("error_type"),
        "error": _jsonable(verdict.get("error", [])),
    }


def evaluate_outputs(outputs: list[str], examples: list[Example]) -> dict[str, Any]:
    """Accuracy per category and overall (micro and category-macro), and the format rate.

    The result is JSON-serialisable; ``items`` lists every item's verdict in input order.
    """
    if len(outputs) != len(examples):
        raise ValueError(
            f"evaluate needs one output per example: got {len(outputs)} outputs for {len(examples)} examples"
        )
    fmt = FormatVerifier()
    items = []
    per_cat: dict[str, dict[str, float]] = {}
    for output, example in zip(outputs, examples):
        category = str(example.meta.get("category", "unknown"))
        verdict = check_item(output, example)
        format_ok = fmt(output, example) == 1.0
        items.append({"id": example.id, "category": category, "format": format_ok, **verdict})
        stats = per_cat.setdefault(category, {"correct": 0, "total": 0, "format_ok": 0})
        stats["total"] += 1
        stats["correct"] += int(verdict["valid"])
        stats["format_ok"] += int(format_ok)
    for stats in per_cat.values():
        stats["accuracy"] = stats["correct"] / stats["total"]
        stats["format_rate"] = stats["format_ok"] / stats["total"]
    n = len(items)
    correct = sum(s["correct"] for s in per_cat.values())
    return {
        "checker": f"{BFCL_REQUIREMENT} ast_checker",
        "n": n,
        "correct": correct,
        "accuracy": correct / n if n else 0.0,
        "accuracy_macro": (sum(s["accuracy"] for s in per_cat.values()) / len(per_cat) if per_cat else 0.0),
        "format_rate": sum(s["format_ok"] for s in per_cat.values()) / n if n else 0.0,
        "per_category": per_cat,
        "items": items,
    }


__all__ = ["check_item", "evaluate_outputs"]
