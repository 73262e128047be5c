"""The two tool-calling rewards (docs/design.md#tasks), each with the evidence it checks.

``format`` ∈ {0, 1}
    Calls expected: 1 iff the completion is ``<tool_call>`` blocks and whitespace only, every line
    of every block a JSON object ``{"name": str, "arguments": {...}}``. Parallel calls may be
    several lines of one block (ToolRL's form) or several blocks (Qwen's and BFCL's FC form): the
    instruction allows both, and the parser, ``correctness`` and BFCL evaluation read both alike.
    No call expected (irrelevance): 1 iff the completion is non-empty plain text with no
    ``<tool_call>`` tag and no parsable call in any form.
    Evidence: :data:`~mrtpo.tasks.toolcall.prompt.FORMAT_INSTRUCTION`, in the prompt.

``correctness`` ∈ [−3, 3] (ToolRL, Qian et al. 2025)
    For gold calls ``G`` and predicted calls ``P``::

        r_name  = |names(G) ∩ names(P)| / |names(G) ∪ names(P)|        (multiset Jaccard)
        pair(g, p) = 0 if the names differ, else
                     Jaccard(param names of g, of p) + Σ_{k in g} [value of k matches]
        r_match = r_name + max over one-to-one pairings of Σ pair(g, p)
        S_max   = 1 + Σ_g (1 + |params of g|)
        R       = 6 · r_match / S_max − 3

    Values match when they are in BFCL's acceptable set for the parameter, compared the way BFCL's
    checker compares them (strings case-folded with spaces and ``,./-_*^`` removed; ints equal
    floats; lists element-wise; dicts key by key against their own acceptable sets). A parameter
    whose acceptable set contains ``""`` is optional: omitting it counts as a value match and does
    not enter the parameter-name Jaccard. The answers are first reconciled with the function
    schemas the way BFCL's checker applies them (:func:`effective_ground_truth`). No parsable call: −3.
    No call expected (BFCL irrelevance rows): as ToolRL defines it, 0 whatever the completion
    (ToolRL's reward returns 0 for rows whose answer holds no ``<tool_call>``; whether the model
    refrained is the ``format`` reward's business there). ``call_when_none_expected`` (default 0)
    sets the score of a completion that does call on such a row, for those who want it penalised.
    Reference values: gold ``get_weather(city=Paris, unit=C)``: exact 3.0, ``unit=F`` 1.5, ``unit``
    missing 0.75, wrong function name −3.0.
    Evidence: the gold call(s) as JSON (privileged): one correct answer in the instructed format
    (first acceptable value of each parameter) and, when some parameter has several acceptable
    values, BFCL's full acceptable sets on a second line.
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from typing import Any

from mrtpo.tasks.toolcall.parse import (
    CLOSE_TAG,
    MAX_CHARS,
    OPEN_TAG,
    ParseResult,
    ToolCall,
    completion_text,
    parse_completion,
)
from mrtpo.tasks.toolcall.prompt import FORMAT_INSTRUCTION
from mrtpo.verifiers import Evidence, Example

OPTIONAL = ""  # BFCL's marker, inside an acceptable-value list, for "may be omitted"
NO_CALL_EVIDENCE = "No function call is expected: none of the provided functions fits the request."
_MAX_EXACT_MATCHING = 10  # calls per function name up to which the pairing is searched exhaustively
_STANDARDIZE = re.compile(r"[ ,./\-_*^]")


# ----------------------------------------------------------------------------- value matching
def _standardize(text: str) -> str:
    """BFCL's string comparison: no spaces or ``,./-_*^``, lower case, ``'`` read as ``"``."""
    return _STANDARDIZE.sub("", text).lower().replace("'", '"')


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _as_list(acceptable: Any) -> list[Any]:
    return acceptable if isinstance(acceptable, list) else [acceptable]


def _match_literal(pred: Any, accepted: Any) -> bool:
    """A concrete value against one concrete acceptable value (BFCL normalisation for strings)."""
    if isinstance(accepted, bool) or isinstance(pred, bool):
        return isinstance(pred, bool) and isinstance(accepted, bool) and pred == accepted
    if _is_number(accepted):
        return _is_number(pred) and math.isfinite(float(pred)) and float(pred) == float(accepted)
    if isinstance(accepted, str):
        return isinstance(pred, str) and _standardize(pred) == _standardize(accepted)
    if isinstance(accepted, (list, tuple)):
        return (
            isinstance(pred, (list, tuple))
            and len(pred) == len(accepted)
            and all(_match_literal(p, a) for p, a in zip(pred, accepted))
        )
    if isinstance(accepted, dict):
        return (
            isinstance(pred, dict)
            and set(pred) == set(accepted)
            and all(_match_literal(pred[k], accepted[k]) for k in accepted)
        )
    return pred == accepted


def _match_one(pred: Any, accepted: Any) -> bool:
    """``pred`` against one entry of a parameter's acceptable list.

    As in BFCL's checker: a dict entry is a nested possible answer (key -> acceptable list); a list
    entry is matched element-wise, its dict elements being nested possible answers (a list of
    dicts); everything below a nested possible answer is compared as a concrete value.
    """
    if isinstance(accepted, dict):
        return isinstance(pred, dict) and dict_matches(pred, accepted)
    if isinstance(accepted, (list, tuple)):
        return (
            isinstance(pred, (list, tuple))
            and len(pred) == len(accepted)
            and all(
                (isinstance(p, dict) and dict_matches(p, a)) if isinstance(a, dict) else _match_literal(p, a)
                for p, a in zip(pred, accepted)
            )
        )
    return _match_literal(pred, accepted)


def value_matches(pred: Any, acceptable: list[Any]) -> bool:
    """Is ``pred`` one of BFCL's acceptable values (``""``, "omitted", never matches a value)?"""
    return any(_match_one(pred, a) for a in _as_list(acceptable) if not (isinstance(a, str) and a == OPTIONAL))


def is_optional(acceptable: list[Any]) -> bool:
    """BFCL marks a parameter that may be omitted with ``""`` in its acceptable list."""
    return any(isinstance(a, str) and a == OPTIONAL for a in _as_list(acceptable))


def dict_matches(pred: dict[str, Any], accepted: dict[str, list[Any]]) -> bool:
    """A dict value against a nested possible answer (BFCL's ``dict_checker`` rule); the values
    inside are compared as concrete values."""
    for key, value in pred.items():
        if key not in accepted:
            return False
        options = [a for a in _as_list(accepted[key]) if not (isinstance(a, str) and a == OPTIONAL)]
        if not any(_match_literal(value, a) for a in options):
            return False
    return all(key in pred or is_optional(acc) for key, acc in accepted.items())


# ----------------------------------------------------------------------------- ToolRL scoring
def _multiset_jaccard(a: list[str], b: list[str]) -> float:
    if not a and not b:
        return 1.0
    ca, cb = Counter(a), Counter(b)
    inter = sum((ca & cb).values())
    return inter / (len(a) + len(b) - inter)


def _pair_score(gold_params: dict[str, list[Any]], pred_args: dict[str, Any]) -> float:
    """Parameter-name Jaccard plus the number of gold parameters whose value matches."""
    expected = {k for k, acc in gold_params.items() if not is_optional(acc) or k in pred_args}
    given = set(pred_args)
    union = expected | given
    jaccard = len(expected & given) / len(union) if union else 1.0
    values = 0
    for key, acc in gold_params.items():
        if key in pred_args:
            values += value_matches(pred_args[key], acc)
        else:
            values += is_optional(acc)
    return jaccard + values


def _best_pairing(scores: list[list[float]]) -> float:
    """Maximum total of a one-to-one pairing (rows: gold calls, columns: predicted calls)."""
    n_gold = len(scores)
    n_pred = len(scores[0]) if scores else 0
    if n_gold == 0 or n_pred == 0:
        return 0.0
    if n_pred <= _MAX_EXACT_MATCHING and n_gold <= _MAX_EXACT_MATCHING:
        best = {0: 0.0}  # mask of used predicted calls -> best total so far
        for row in scores:
            nxt: dict[int, float] = {}
            for mask, total in best.items():
                if nxt.get(mask, -1.0) < total:  # leave this gold call unpaired
                    nxt[mask] = total
                for j, s in enumerate(row):
                    if not mask & (1 << j):
                        m2 = mask | (1 << j)
                        if nxt.get(m2, -1.0) < total + s:
                            nxt[m2] = total + s
            best = nxt
        return max(best.values())
    used: set[int] = set()  # larger groups: ToolRL's greedy pairing, in gold order
    total = 0.0
    for row in scores:
        j = max((j for j in range(n_pred) if j not in used), key=lambda j: row[j], default=None)
        if j is not None:
            used.add(j)
            total += row[j]
    return total


def gold_calls(ground_truth: list[dict[str, Any]]) -> list[tuple[str, dict[str, list[Any]]]]:
    """BFCL ``ground_truth`` ``[{name: {param: [acceptable]}}]`` as ``(name, params)`` pairs."""
    return [(name, params) for item in ground_truth for name, params in item.items()]


def toolrl_score(pred: list[ToolCall] | tuple[ToolCall, ...], ground_truth: list[dict]) -> float:
    """ToolRL correctness of ``pred`` against BFCL gold calls (at least one), in [−3, 3]."""
    gold = gold_calls(ground_truth)
    if not gold:
        raise ValueError("toolrl_score needs at least one gold call")
    if not pred:
        return -3.0
    r_name = _multiset_jaccard([g for g, _ in gold], [p.name for p in pred])
    s_max = 1.0 + sum(1.0 + len(params) for _, params in gold)
    total = r_name
    for name in {g for g, _ in gold}:
        rows = [params for g, params in gold if g == name]
        cols = [p.arguments for p in pred if p.name == name]
        if cols:
            total += _best_pairing([[_pair_score(r, c) for c in cols] for r in rows])
    return max(-3.0, min(3.0, 6.0 * total / s_max - 3.0))


# ----------------------------------------------------------------------------- gold answers
def effective_ground_truth(
    ground_truth: list[dict[str, Any]], functions: list[dict[str, Any]] | None
) -> list[dict[str, Any]]:
    """BFCL's possible answers reconciled with the function schemas, as BFCL's checker applies them.

    A few BFCL answers disagree with their own schema (e.g. ``simple_python_200`` marks the
    schema-required ``fuel_efficiency`` as omittable; ``parallel_multiple_26`` lists a ``type``
    parameter the function does not have). BFCL's checker enforces the schema first, so here a
    schema-required parameter loses its ``""`` (omission) option and a parameter absent from the
    schema may only be omitted. Without ``functions`` the answers are returned unchanged.
    """
    if not functions:
        return ground_truth
    docs = {f.get("name"): f.get("parameters", {}) for f in functions if isinstance(f, dict)}
    out = []
    for item in ground_truth:
        fixed_item = {}
        for name, params in item.items():
            schema = docs.get(name)
            if schema is None:
                fixed_item[name] = params
                continue
            props = schema.get("properties", {}) or {}
            required = set(schema.get("required", []) or [])
            fixed = {}
            for key, acc in params.items():
                if key not in props and is_optional(acc):
                    fixed[key] = [OPTIONAL]
                elif key in required and is_optional(acc):
                    values = [a for a in acc if not (isinstance(a, str) and a == OPTIONAL)]
                    fixed[key] = values or acc
                else:
                    fixed[key] = acc
            fixed_item[name] = fixed
        out.append(fixed_item)
    return out


def _first_value(acceptable: Any, nested: bool = True) -> tuple[bool, Any]:
    """``(present, value)``: the first acceptable value; ``present=False`` when it is ``""``.

    ``nested``: at parameter level dict entries are nested possible answers (rendered by taking
    their own first values); below that, values are concrete and copied as they are.
    """
    options = _as_list(acceptable)
    if not options:
        return False, None
    first = options[0]
    if isinstance(first, str) and first == OPTIONAL:
        return False, None
    if not nested:
        return True, first
    if isinstance(first, dict):
        return True, _render_nested(first)
    if isinstance(first, list):
        return True, [_render_nested(v) if isinstance(v, dict) else v for v in first]
    return True, first


def _render_nested(possible: dict[str, Any]) -> dict[str, Any]:
    out = {}
    for key, acc in possible.items():
        present, v = _first_value(acc, nested=False)
        if present:
            out[key] = v
    return out


def canonical_gold(
    ground_truth: list[dict[str, Any]], functions: list[dict[str, Any]] | None = None
) -> list[dict[str, Any]]:
    """One concrete correct answer: the first acceptable value of every parameter (omitted when
    that is ``""``), after :func:`effective_ground_truth` when ``functions`` are given."""
    calls = []
    for name, params in gold_calls(effective_ground_truth(ground_truth, functions)):
        args = {}
        for key, acc in params.items():
            present, v = _first_value(acc)
            if present:
                args[key] = v
        calls.append({"name": name, "arguments": args})
    return calls


def render_tool_calls(calls: list[dict[str, Any]]) -> str:
    """Calls in the instructed output format: one ``<tool_call>`` block, a JSON object per line."""
    lines = [json.dumps(c, ensure_ascii=False) for c in calls]
    return OPEN_TAG + "\n" + "\n".join(lines) + "\n" + CLOSE_TAG


# ----------------------------------------------------------------------------- verifiers
def _expects_call(example: Example) -> bool:
    return bool(gold_calls(example.gold.get("ground_truth", [])))


class FormatVerifier:
    """``format`` ∈ {0, 1}; see the module docstring. Evidence: the format instruction."""

    name = "format"

    def __call__(self, completion: str, example: Example) -> float | None:
        try:
            result = parse_completion(completion)
            if not _expects_call(example):
                text = completion_text(completion)
                plain = (
                    0 < len(text.strip()) and len(text) <= MAX_CHARS and OPEN_TAG not in text and CLOSE_TAG not in text
                )
                return float(plain and not result.ok)
            return float(is_well_formed(result))
        except Exception:  # noqa: BLE001 - a verifier never raises on model output
            return 0.0

    def evidence(self, example: Example) -> Evidence | None:
        """The whole call-format instruction, example included, as it stands in the prompt
        (``meta["format_instruction"]``, else :data:`FORMAT_INSTRUCTION`). It must occur exactly once
        in the example's messages: otherwise a clear ValueError, never a replay that removes nothing."""
        text = example.meta.get("format_instruction", FORMAT_INSTRUCTION)
        count = sum(m["content"].count(text) for m in example.messages if isinstance(m.get("content"), str))
        if count != 1:
            where = "does not occur" if count == 0 else f"occurs {count} times"
            raise ValueError(
                f"example {example.id!r}: the format reward's evidence (the call-format instruction) "
                f"{where} in the example's messages; it must occur exactly once "
                f"(build the messages with mrtpo.tasks.toolcall.build_messages)"
            )
        return Evidence(text, "in_prompt")


def is_well_formed(result: ParseResult) -> bool:
    """``<tool_call>`` block(s) and nothing else, every call in the instructed JSON shape."""
    return (
        result.ok
        and result.form == "tool_call"
        and result.n_blocks >= 1
        and not result.extra_text
        and all(c.canonical for c in result.calls)
    )


class CorrectnessVerifier:
    """``correctness`` ∈ [−3, 3] (ToolRL); see the module docstring. Evidence: the gold calls."""

    name = "correctness"

    def __init__(self, call_when_none_expected: float = 0.0) -> None:
        if not -3.0 <= call_when_none_expected <= 3.0:
            raise ValueError("call_when_none_expected must lie in [-3, 3]")
        self.call_when_none_expected = float(call_when_none_expected)

    def __call__(self, completion: str, example: Example) -> float | None:
        try:
            result = parse_completion(completion)
            if not _expects_call(example):
                return self.call_when_none_expected if result.ok else 0.0
            ground_truth = effective_ground_truth(example.gold.get("ground_truth", []), example.meta.get("functions"))
            return toolrl_score(result.calls if result.ok else (), ground_truth)
        except Exception:  # noqa: BLE001 - a verifier never raises on model output
            return -3.0

    def evidence(self, example: Example) -> Evidence | None:
        ground_truth = example.gold.get("ground_truth", [])
        if not gold_calls(ground_truth):
            return Evidence(NO_CALL_EVIDENCE, "privileged")
        text = render_tool_calls(canonical_gold(ground_truth, example.meta.get("functions")))
        if any(len(acc) > 1 for _, params in gold_calls(ground_truth) for acc in params.values()):
            text += '\nAccepted values per parameter ("" = may be omitted): ' + json.dumps(
                ground_truth, ensure_ascii=False
            )
        return Evidence(text, "privileged")


__all__ = [
    "NO_CALL_EVIDENCE",
    "CorrectnessVerifier",
    "FormatVerifier",
    "canonical_gold",
    "dict_matches",
    "effective_ground_truth",
    "gold_calls",
    "is_well_formed",
    "render_tool_calls",
    "toolrl_score",
    "value_matches",
]
