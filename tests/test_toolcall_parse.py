"""The completion parser: accepted forms, precise errors, and hostile input (never raises)."""

from __future__ import annotations

import json
import time

import pytest
from hypothesis import given, settings, strategies as st

from mrtpo.tasks.toolcall.parse import MAX_CALLS, MAX_CHARS, parse_completion, to_bfcl


def calls(text):
    r = parse_completion(text)
    assert r.ok, r.error
    return [(c.name, c.arguments) for c in r.calls]


def test_tool_call_block_one_json_per_line():
    r = parse_completion(
        '<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n{"name": "g.h", "arguments": {"b": [1, "x"]}}\n</tool_call>'
    )
    assert r.ok and r.form == "tool_call" and r.n_blocks == 1 and not r.extra_text
    assert [(c.name, c.arguments, c.canonical) for c in r.calls] == [
        ("f", {"a": 1}, True),
        ("g.h", {"b": [1, "x"]}, True),
    ]
    assert to_bfcl(r.calls) == [{"f": {"a": 1}}, {"g.h": {"b": [1, "x"]}}]


def test_several_blocks_pretty_json_and_aliases():
    r = parse_completion(
        '<tool_call>{"name": "f", "arguments": {}}</tool_call>\n<tool_call>{"name": "g", "arguments": {}}</tool_call>'
    )
    assert r.ok and r.n_blocks == 2 and [c.name for c in r.calls] == ["f", "g"]
    assert calls('<tool_call>\n{\n  "name": "f",\n  "arguments": {"a": 1}\n}\n</tool_call>') == [("f", {"a": 1})]
    r = parse_completion('<tool_call>\n{"name": "f", "parameters": {"a": 1}}\n</tool_call>')
    assert r.ok and r.calls[0].arguments == {"a": 1} and not r.calls[0].canonical
    r = parse_completion(
        '<tool_call>{"type": "function", "function": {"name": "f", "arguments": "{\\"a\\": 2}"}}</tool_call>'
    )
    assert r.ok and r.calls[0].arguments == {"a": 2} and not r.calls[0].canonical
    r = parse_completion('Sure.\n<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>')
    assert r.ok and r.extra_text


def test_json_fences_bare_json_and_python_syntax():
    assert calls('```json\n[{"name": "f", "arguments": {"a": 1}}]\n```') == [("f", {"a": 1})]
    assert calls('```\n{"name": "f", "arguments": {"a": 1}}\n```') == [("f", {"a": 1})]
    assert calls('{"name": "f", "arguments": {"a": 1}} and some words') == [("f", {"a": 1})]
    assert calls('[{"name": "f", "arguments": {}}, {"name": "g", "arguments": {"x": null}}]') == [
        ("f", {}),
        ("g", {"x": None}),
    ]
    assert calls("f(a=1)") == [("f", {"a": 1})]
    assert calls("math.factorial(number=5)") == [("math.factorial", {"number": 5})]
    assert calls("[f(a=1), g(b=[1, 2], c={'x': None}, d=-2.5, e=True)]") == [
        ("f", {"a": 1}),
        ("g", {"b": [1, 2], "c": {"x": None}, "d": -2.5, "e": True}),
    ]
    assert calls("f(a=1)\ng(b='two')") == [("f", {"a": 1}), ("g", {"b": "two"})]
    assert calls("```python\nf(a=(1, 2))\n```") == [("f", {"a": (1, 2)})]
    assert parse_completion("f(a=1)").form == "python"


@pytest.mark.parametrize(
    "text, fragment",
    [
        ("", "empty completion"),
        ("The weather is nice.", "no tool call found"),
        ('<tool_call>{"name": "f", "arguments": {"a": 1}</tool_call>', "block 1 line 1: invalid JSON"),
        ('<tool_call>{"name": "f", "arguments": {}}', "never closed"),
        ('{"name": "f"}</tool_call>', "without a matching <tool_call>"),
        ("<tool_call>\n\n</tool_call>", "block 1 is empty"),
        ('<tool_call>{"arguments": {}}</tool_call>', 'no non-empty string "name"'),
        ('<tool_call>{"name": "f"}</tool_call>', 'has no "arguments" object'),
        ('<tool_call>{"name": "f", "arguments": [1]}</tool_call>', "must be a JSON object, got list"),
        ('<tool_call>["f"]</tool_call>', "expected a JSON object"),
        ("f(1, 2)", "positional arguments"),
        ("f(**kw)", "**kwargs"),
        ("f(a=g(1))", "not a literal value"),
        ("f(a=1", "not valid Python-call syntax"),
        ("[1, 2]", "expected a JSON object"),
    ],
)
def test_precise_errors(text, fragment):
    r = parse_completion(text)
    assert not r.ok and r.calls == ()
    assert fragment in r.error


def test_never_evaluates_code(tmp_path):
    target = tmp_path / "pwned"
    for text in (
        f"f(a=open({str(target)!r}, 'w'))",
        f"__import__('pathlib').Path({str(target)!r}).touch()",
        f"[f(a=1), __import__('os').system('touch {target}')]",
    ):
        r = parse_completion(text)
        assert not r.ok and r.error
    assert not target.exists()


HOSTILE = [
    "x" * (10 * 1024 * 1024),  # 10 MB
    "<tool_call>" * 200_000,  # many unclosed blocks (2.2 MB)
    "<tool_call>" * 9000 + "</tool_call>",  # nesting of tags under the size limit
    "[" * 90_000,  # deep JSON, under the size limit
    '{"a":' * 19_000,
    "<tool_call>" + "[" * 50_000 + "</tool_call>",
    "```json\n" + "[" * 50_000 + "\n```",
    "f(a=" + "[" * 5000 + "]" * 5000 + ")",  # deep Python literal
    "f(a=" + "-" * 19_000 + "1)",  # parser MemoryError territory
    "f(" + "a." * 9000 + "b=1)",
    "a." * 40_000 + "(",  # regex head only
    '{"name": "f", "arguments": {"a": ' + "9" * 5000 + "}}",  # int digit limit
    "f(a=" + "9" * 5000 + ")",
    "\x00" * 1000,
    '<tool_call>\x00{"name": "f"}\x00</tool_call>',
    "\ud800\udfff\ud800 <tool_call>\ud800</tool_call>",
    '\ufeff\u202e{"name": "\u202ef", "arguments": {}}',
    "```" * 30_000,
    "<tool_call>\n" + '{"name": "f", "arguments": {}}\n' * (MAX_CALLS + 1) + "</tool_call>",
    b"\xff\xfe\x00<tool_call>{}</tool_call>",
    None,
    42,
    3.5,
    ["not", "messages"],
    {"content": None},
]


@pytest.mark.parametrize("text", HOSTILE, ids=range(len(HOSTILE)))
def test_hostile_input_never_raises_and_is_bounded(text):
    start = time.perf_counter()
    r = parse_completion(text)
    elapsed = time.perf_counter() - start
    assert elapsed < 2.0
    assert isinstance(r.calls, tuple) and (r.ok or r.error)
    assert len(r.calls) <= MAX_CALLS
    json.dumps(r.error)  # the message is plain, serialisable text


def test_limits_give_precise_errors():
    assert "more than the parser's limit" in parse_completion("x" * (MAX_CHARS + 1)).error
    assert "nested too deeply" in parse_completion("[" * 90_000).error
    many = "<tool_call>\n" + '{"name": "f", "arguments": {}}\n' * (MAX_CALLS + 1) + "</tool_call>"
    assert f"more than {MAX_CALLS} calls" in parse_completion(many).error
    # conversational completions (TRL) are read from the last message's content
    assert calls([{"role": "assistant", "content": "f(a=2)"}]) == [("f", {"a": 2})]


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.sampled_from(list('<>/tool_cal{}[]()":,=.`\n 1aF\x00\\')), max_size=300))
def test_random_text_never_raises(text):
    r = parse_completion(text)
    assert r.ok == (r.error is None and len(r.calls) > 0)


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=200))
def test_random_bytes_never_raise(data):
    parse_completion(data)
    parse_completion(data.decode("latin-1"))


def test_module_never_calls_eval_exec_or_compile():
    import ast

    import mrtpo.tasks.toolcall.parse as mod

    with open(mod.__file__, encoding="utf-8") as fh:
        tree = ast.parse(fh.read())
    called = {n.func.id for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
    assert not called & {"eval", "exec", "compile", "__import__"}
    assert "literal_eval" in {
        n.func.attr for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
    }
