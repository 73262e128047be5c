"""Parse a model completion into tool calls. Never raises; the work done is bounded.

Accepted forms, tried in this order:

1. ``<tool_call>`` blocks (the instructed form): each block holds one JSON call object per line,
   or a single JSON object / list of objects (pretty-printed JSON is fine). Several blocks are
   accepted and their calls concatenated (``n_blocks`` tells how many there were).
2. Markdown fences (```` ```json ```` / ```` ``` ```` / ```` ```python ````) holding JSON as above,
   or Python-call syntax.
3. A bare JSON object or list at the start of the text (trailing text is ignored).
4. Python-call syntax: ``f(a=1)``, ``pkg.f(a=1)``, ``[f(a=1), g(b=2)]`` or one call per line.
   Parsed with :mod:`ast` and evaluated with :func:`ast.literal_eval` only (never ``eval``):
   keyword arguments with literal values; positional arguments are rejected.

A call object is ``{"name": str, "arguments": {...}}``; the parser also accepts ``"parameters"`` or
``"args"`` for the arguments, arguments given as a JSON string, ``{"function": name, ...}``, and the
OpenAI wrapper ``{"type": "function", "function": {...}}``. A call written exactly as instructed
(keys ``name`` and ``arguments`` only, arguments an object) has ``canonical=True``.

Limits: completions over :data:`MAX_CHARS` characters are rejected unparsed; at most
:data:`MAX_CALLS` calls; Python-call syntax is only tried on texts up to :data:`MAX_PYTHON_CHARS`.
Deep nesting, NUL bytes, invalid surrogates, huge integers and similar input give a parse error.
"""

from __future__ import annotations

import ast
import json
import re
from dataclasses import dataclass, field
from typing import Any

MAX_CHARS = 100_000
MAX_PYTHON_CHARS = 20_000
MAX_CALLS = 64

OPEN_TAG = "<tool_call>"
CLOSE_TAG = "</tool_call>"
_FENCE = "```"
_NAME_KEYS = ("name", "function")
_ARG_KEYS = ("arguments", "parameters", "args")
_PY_CALL_START = re.compile(r"\[?\s*[A-Za-z_][A-Za-z0-9_]*(\s*\.\s*[A-Za-z_][A-Za-z0-9_]*)*\s*\(")


@dataclass(frozen=True)
class ToolCall:
    """One parsed call. ``canonical``: written exactly in the instructed JSON shape."""

    name: str
    arguments: dict[str, Any]
    canonical: bool = True


@dataclass(frozen=True)
class ParseResult:
    """Outcome of :func:`parse_completion`.

    ``form``: ``"tool_call"``, ``"json_fence"``, ``"json"``, ``"python"`` or ``"none"`` (nothing
    call-like found). ``error`` is ``None`` on success, else a message saying what is wrong.
    ``n_blocks``: number of ``<tool_call>`` blocks. ``extra_text``: non-whitespace text outside the
    ``<tool_call>`` blocks.
    """

    calls: tuple[ToolCall, ...] = ()
    form: str = "none"
    error: str | None = None
    n_blocks: int = 0
    extra_text: bool = False
    notes: tuple[str, ...] = field(default=())

    @property
    def ok(self) -> bool:
        """At least one call, and no error."""
        return self.error is None and len(self.calls) > 0


class _ParseError(Exception):
    """Internal: a precise reason, turned into ``ParseResult.error``."""


def completion_text(completion: Any) -> str:
    """Accept str, bytes, or TRL's conversational ``[{"role":..., "content":...}]`` lists."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, (bytes, bytearray)):
        return bytes(completion[: MAX_CHARS * 4 + 4]).decode("utf-8", errors="replace")
    if isinstance(completion, list) and completion and isinstance(completion[-1], dict):
        content = completion[-1].get("content", "")
        return content if isinstance(content, str) else ""
    if isinstance(completion, dict):
        content = completion.get("content", "")
        return content if isinstance(content, str) else ""
    return ""


def _json_loads(text: str, where: str) -> Any:
    try:
        return json.loads(text)
    except RecursionError:
        raise _ParseError(f"{where}: JSON is nested too deeply") from None
    except ValueError as exc:  # JSONDecodeError, and int-digit limits
        raise _ParseError(f"{where}: invalid JSON: {exc}") from None


def _to_call(obj: Any, where: str) -> ToolCall:
    if not isinstance(obj, dict):
        raise _ParseError(
            f'{where}: expected a JSON object {{"name": ..., "arguments": {{...}}}}, got {type(obj).__name__}'
        )
    canonical = set(obj) == {"name", "arguments"} and isinstance(obj.get("arguments"), dict)
    if isinstance(obj.get("function"), dict):  # OpenAI wrapper {"type": "function", "function": {...}}
        obj = obj["function"]
    name = next((obj[k] for k in _NAME_KEYS if isinstance(obj.get(k), str)), None)
    if not name or not name.strip():
        raise _ParseError(f'{where}: the call has no non-empty string "name"')
    key = next((k for k in _ARG_KEYS if k in obj), None)
    if key is None:
        raise _ParseError(f'{where}: call {name!r} has no "arguments" object')
    args = obj[key]
    if isinstance(args, str):  # OpenAI style: arguments as a JSON string
        try:
            args = _json_loads(args, f"{where}: call {name!r} has string arguments, but")
        except _ParseError as exc:
            raise exc from None
    if not isinstance(args, dict):
        raise _ParseError(f'{where}: call {name!r}: "{key}" must be a JSON object, got {type(args).__name__}')
    if not all(isinstance(k, str) for k in args):
        raise _ParseError(f"{where}: call {name!r}: argument names must be strings")
    return ToolCall(name=name.strip(), arguments=args, canonical=canonical)


def _calls_from_value(value: Any, where: str) -> list[ToolCall]:
    items = value if isinstance(value, list) else [value]
    if not items:
        raise _ParseError(f"{where}: empty list of calls")
    if len(items) > MAX_CALLS:
        raise _ParseError(f"{where}: more than {MAX_CALLS} calls")
    return [_to_call(item, f"{where} call {i + 1}" if len(items) > 1 else where) for i, item in enumerate(items)]


def _json_calls(content: str, where: str) -> list[ToolCall]:
    """JSON call objects, one per non-empty line; else the content as one JSON value."""
    lines = [line.strip() for line in content.splitlines() if line.strip()]
    if not lines:
        raise _ParseError(f"{where} is empty")
    if len(lines) > MAX_CALLS * 4:
        raise _ParseError(f"{where}: too many lines ({len(lines)})")
    line_error = None
    calls: list[ToolCall] = []
    for i, line in enumerate(lines):
        try:
            calls.extend(_calls_from_value(_json_loads(line, f"{where} line {i + 1}"), f"{where} line {i + 1}"))
        except _ParseError as exc:
            line_error = exc
            break
        if len(calls) > MAX_CALLS:
            raise _ParseError(f"{where}: more than {MAX_CALLS} calls")
    if line_error is None:
        return calls
    if len(lines) == 1:
        raise line_error
    try:
        value = _json_loads(content.strip(), "as a whole")
    except _ParseError as exc:
        raise _ParseError(
            f"{where} is neither one JSON object per line ({line_error}) nor a single JSON value ({exc})"
        ) from None
    return _calls_from_value(value, where)


def _dotted_name(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_dotted_name(node.value)}.{node.attr}"
    raise _ParseError(f"call target must be a (dotted) name, got {type(node).__name__}")


def _python_call(node: ast.AST, where: str) -> ToolCall:
    if not isinstance(node, ast.Call):
        raise _ParseError(f"{where}: expected a function call, got {type(node).__name__}")
    name = _dotted_name(node.func)
    if node.args:
        raise _ParseError(f"{where}: call {name!r} uses positional arguments; use keyword arguments")
    args: dict[str, Any] = {}
    for kw in node.keywords:
        if kw.arg is None:
            raise _ParseError(f"{where}: call {name!r} uses **kwargs unpacking")
        try:
            args[kw.arg] = ast.literal_eval(kw.value)
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError) as exc:
            raise _ParseError(f"{where}: argument {kw.arg!r} of {name!r} is not a literal value ({exc})") from None
    return ToolCall(name=name, arguments=args, canonical=False)


def _python_calls(source: str, where: str) -> list[ToolCall]:
    """Python-call syntax, parsed with ``ast`` (no evaluation beyond literals)."""
    source = source.strip()
    if len(source) > MAX_PYTHON_CHARS:
        raise _ParseError(f"{where}: too long for Python-call parsing ({len(source)} characters)")
    try:
        tree = ast.parse(source, mode="exec")
    except (SyntaxError, ValueError, MemoryError, RecursionError) as exc:
        raise _ParseError(f"{where}: not valid Python-call syntax ({type(exc).__name__}: {exc})") from None
    nodes: list[ast.AST] = []
    for stmt in tree.body:
        if not isinstance(stmt, ast.Expr):
            raise _ParseError(f"{where}: expected only function calls, got a {type(stmt).__name__} statement")
        value = stmt.value
        nodes.extend(value.elts if isinstance(value, (ast.List, ast.Tuple)) else [value])
    if not nodes:
        raise _ParseError(f"{where}: no function call")
    if len(nodes) > MAX_CALLS:
        raise _ParseError(f"{where}: more than {MAX_CALLS} calls")
    return [_python_call(n, f"{where} call {i + 1}" if len(nodes) > 1 else where) for i, n in enumerate(nodes)]


def _tool_call_blocks(text: str) -> tuple[list[str], str]:
    """Contents of the ``<tool_call>`` blocks, and the text outside them. Linear time."""
    blocks: list[str] = []
    outside: list[str] = []
    pos = 0
    while True:
        start = text.find(OPEN_TAG, pos)
        if start < 0:
            tail = text[pos:]
            if CLOSE_TAG in tail:
                raise _ParseError(f"{CLOSE_TAG} without a matching {OPEN_TAG}")
            outside.append(tail)
            break
        before = text[pos:start]
        if CLOSE_TAG in before:
            raise _ParseError(f"{CLOSE_TAG} without a matching {OPEN_TAG}")
        outside.append(before)
        end = text.find(CLOSE_TAG, start + len(OPEN_TAG))
        if end < 0:
            raise _ParseError(f"block {len(blocks) + 1}: {OPEN_TAG} is never closed by {CLOSE_TAG}")
        content = text[start + len(OPEN_TAG) : end]
        if OPEN_TAG in content:
            raise _ParseError(f"block {len(blocks) + 1}: {OPEN_TAG} opened again before {CLOSE_TAG}")
        blocks.append(content)
        if len(blocks) > MAX_CALLS:
            raise _ParseError(f"more than {MAX_CALLS} {OPEN_TAG} blocks")
        pos = end + len(CLOSE_TAG)
    return blocks, "".join(outside)


def _fences(text: str) -> list[tuple[str, str]]:
    """``(language, content)`` of each closed markdown fence. Linear time."""
    out = []
    pos = 0
    while len(out) <= MAX_CALLS:
        start = text.find(_FENCE, pos)
        if start < 0:
            break
        end = text.find(_FENCE, start + 3)
        if end < 0:
            break
        body = text[start + 3 : end]
        first, _, rest = body.partition("\n")
        if first.strip() and re.fullmatch(r"[A-Za-z0-9_+-]{1,20}", first.strip()):
            lang, content = first.strip().lower(), rest
        else:
            lang, content = "", body
        out.append((lang, content))
        pos = end + 3
    return out


def _parse_fenced(fences: list[tuple[str, str]]) -> list[ToolCall]:
    calls: list[ToolCall] = []
    for i, (lang, content) in enumerate(fences):
        where = f"fence {i + 1}"
        if lang in ("python", "py"):
            calls.extend(_python_calls(content, where))
            continue
        try:
            calls.extend(_json_calls(content, where))
        except _ParseError as json_error:
            if lang in ("json", "jsonl"):
                raise
            try:
                calls.extend(_python_calls(content, where))
            except _ParseError:
                raise json_error from None
        if len(calls) > MAX_CALLS:
            raise _ParseError(f"more than {MAX_CALLS} calls")
    return calls


def _parse_bare_json(text: str) -> list[ToolCall]:
    try:
        value, _ = json.JSONDecoder().raw_decode(text)
    except RecursionError:
        raise _ParseError("JSON: nested too deeply") from None
    except ValueError as exc:
        raise _ParseError(f"JSON: invalid JSON: {exc}") from None
    return _calls_from_value(value, "JSON")


def _looks_like_python_call(text: str) -> bool:
    # Only the head is matched: a function name is short, and this bounds the regex work.
    return _PY_CALL_START.match(text[:256]) is not None


def _parse(text: str) -> ParseResult:
    if len(text) > MAX_CHARS:
        return ParseResult(
            form="none", error=(f"completion has {len(text)} characters, more than the parser's limit of {MAX_CHARS}")
        )
    if OPEN_TAG in text or CLOSE_TAG in text:
        n_blocks = text.count(OPEN_TAG)
        try:
            blocks, outside = _tool_call_blocks(text)
            calls: list[ToolCall] = []
            for i, block in enumerate(blocks):
                calls.extend(_json_calls(block, f"<tool_call> block {i + 1}"))
            if len(calls) > MAX_CALLS:
                raise _ParseError(f"more than {MAX_CALLS} calls")
        except _ParseError as exc:
            return ParseResult(form="tool_call", error=str(exc), n_blocks=n_blocks)
        return ParseResult(tuple(calls), "tool_call", None, len(blocks), bool(outside.strip()))

    stripped = text.strip()
    if not stripped:
        return ParseResult(form="none", error="empty completion: no tool call found")
    fences = _fences(text) if _FENCE in text else []
    if fences:
        try:
            return ParseResult(tuple(_parse_fenced(fences)), "json_fence")
        except _ParseError as exc:
            return ParseResult(form="json_fence", error=str(exc))
    if stripped[0] in "{[":
        try:
            return ParseResult(tuple(_parse_bare_json(stripped)), "json")
        except _ParseError as json_error:
            if stripped[0] == "[" and _looks_like_python_call(stripped):
                try:
                    return ParseResult(tuple(_python_calls(stripped, "text")), "python")
                except _ParseError as exc:
                    return ParseResult(form="python", error=str(exc))
            return ParseResult(form="json", error=str(json_error))
    if _looks_like_python_call(stripped):
        try:
            return ParseResult(tuple(_python_calls(stripped, "text")), "python")
        except _ParseError as exc:
            return ParseResult(form="python", error=str(exc))
    return ParseResult(
        form="none",
        error=(
            f"no tool call found: expected {OPEN_TAG}...{CLOSE_TAG} with one JSON object per line, "
            "a JSON object or list, or Python-call syntax like f(a=1)"
        ),
    )


def parse_completion(completion: Any) -> ParseResult:
    """Parse ``completion`` into tool calls; never raises (see the module docstring)."""
    try:
        return _parse(completion_text(completion))
    except Exception as exc:  # noqa: BLE001 - a parser bug must never reach the trainer
        return ParseResult(form="none", error=f"parser failure ({type(exc).__name__}: {exc})")


def to_bfcl(calls: tuple[ToolCall, ...] | list[ToolCall]) -> list[dict[str, dict[str, Any]]]:
    """Calls in the decoded shape BFCL's checker takes: ``[{name: {param: value}}, ...]``."""
    return [{c.name: dict(c.arguments)} for c in calls]


__all__ = [
    "MAX_CALLS",
    "MAX_CHARS",
    "ParseResult",
    "ToolCall",
    "completion_text",
    "parse_completion",
    "to_bfcl",
]
