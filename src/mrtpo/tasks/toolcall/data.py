"""Reading BFCL v4 categories from the installed ``bfcl-eval`` package's data files.

Each question file ``BFCL_v4_<category>.json`` is JSON Lines with ``id``, ``question`` (a list of
turns, each a list of chat messages; every category used here has exactly one turn) and
``function`` (the function docs, in BFCL's Gorilla schema: types ``dict``/``float``/``tuple``/``any``).
``possible_answer/BFCL_v4_<category>.json`` holds, per id, ``ground_truth``: a list of
``{function_name: {param: [acceptable values]}}``, where ``""`` in a list means the parameter may be
omitted. Irrelevance categories have no answer file: no call is the right answer.

The files are read directly (the package's own loaders create result/score folders on import).
"""

from __future__ import annotations

import copy
import json
from functools import cache
from typing import Any

from mrtpo.tasks.toolcall.bfcl_shim import data_dir

# Categories this task can load: single-turn Python ones the AST checker (or the irrelevance rule)
# scores. Java/JavaScript need BFCL's string-typed conversions and are left out.
SUPPORTED_CATEGORIES: tuple[str, ...] = (
    "simple_python",
    "multiple",
    "parallel",
    "parallel_multiple",
    "irrelevance",
    "live_simple",
    "live_multiple",
    "live_parallel",
    "live_parallel_multiple",
    "live_irrelevance",
)
TRAIN_CATEGORIES: tuple[str, ...] = ("live_simple", "live_multiple")
EVAL_CATEGORIES: tuple[str, ...] = (
    "simple_python",
    "multiple",
    "parallel",
    "parallel_multiple",
    "irrelevance",
)
VERSION_PREFIX = "BFCL_v4"

# BFCL (Gorilla) type names -> JSON-schema types, as chat templates and OpenAI tools expect them.
_JSON_SCHEMA_TYPE = {
    "dict": "object",
    "object": "object",
    "float": "number",
    "number": "number",
    "integer": "integer",
    "int": "integer",
    "string": "string",
    "str": "string",
    "boolean": "boolean",
    "bool": "boolean",
    "array": "array",
    "list": "array",
    "tuple": "array",
    "any": "string",
}


def expects_no_call(category: str) -> bool:
    """Irrelevance categories: the right answer is to call nothing (BFCL's relevance rule)."""
    return "irrelevance" in category


def _check_category(category: str) -> None:
    if category not in SUPPORTED_CATEGORIES:
        raise ValueError(f"unknown BFCL category {category!r}; supported: {', '.join(SUPPORTED_CATEGORIES)}")


def _read_jsonl(path) -> list[dict[str, Any]]:
    with open(path, encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


@cache
def _load_category_cached(category: str) -> tuple[dict[str, Any], ...]:
    folder = data_dir()
    entries = _read_jsonl(folder / f"{VERSION_PREFIX}_{category}.json")
    if expects_no_call(category):
        answers: dict[str, Any] = {}
    else:
        answers = {
            a["id"]: a["ground_truth"]
            for a in _read_jsonl(folder / "possible_answer" / f"{VERSION_PREFIX}_{category}.json")
        }
    out = []
    for entry in entries:
        if len(entry["question"]) != 1:
            raise ValueError(f"{entry['id']}: expected a single-turn question")
        if not expects_no_call(category) and entry["id"] not in answers:
            raise ValueError(f"{entry['id']}: no possible answer in the BFCL files")
        out.append(
            {
                "id": entry["id"],
                "category": category,
                "messages": entry["question"][0],
                "functions": entry["function"],
                "ground_truth": answers.get(entry["id"], []),
            }
        )
    return tuple(out)


def load_category(category: str) -> list[dict[str, Any]]:
    """Entries of one category in file order: id, category, messages, functions, ground_truth.

    Returns deep copies, so callers may modify them freely.
    """
    _check_category(category)
    return copy.deepcopy(list(_load_category_cached(category)))


def _schema_to_json_schema(node: Any) -> Any:
    """Copy of a BFCL parameter schema with Gorilla types mapped to JSON-schema types."""
    if not isinstance(node, dict):
        return copy.deepcopy(node)
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key == "type" and isinstance(value, str):
            out[key] = _JSON_SCHEMA_TYPE.get(value, "string")
        elif key == "properties" and isinstance(value, dict):
            out[key] = {name: _schema_to_json_schema(sub) for name, sub in value.items()}
        elif key == "items":
            out[key] = _schema_to_json_schema(value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def to_openai_tools(functions: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """BFCL function docs -> the OpenAI-style ``tools`` list chat templates accept.

    Names are kept as they are (dots included); parameter types become JSON-schema types
    (``dict``→``object``, ``float``→``number``, ``tuple``→``array``, ``any``→``string``, as BFCL's
    own function-calling handlers map them).
    """
    tools = []
    for fn in functions:
        params = _schema_to_json_schema(fn.get("parameters", {"type": "dict", "properties": {}}))
        params["type"] = "object"
        params.setdefault("properties", {})
        tools.append(
            {
                "type": "function",
                "function": {
                    "name": fn["name"],
                    "description": fn.get("description", ""),
                    "parameters": params,
                },
            }
        )
    return tools


def user_text(messages: list[dict[str, Any]]) -> str:
    """The user turn(s) of a question, normalised for duplicate detection across splits."""
    return "\n".join(" ".join(str(m.get("content", "")).split()).lower() for m in messages if m.get("role") == "user")


__all__ = [
    "EVAL_CATEGORIES",
    "SUPPORTED_CATEGORIES",
    "TRAIN_CATEGORIES",
    "expects_no_call",
    "load_category",
    "to_openai_tools",
    "user_text",
]
