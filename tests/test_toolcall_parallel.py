"""Parallel calls and "no call expected" rows on real BFCL items, with hand-written completions:
the parser, the two rewards and BFCL's own checker must agree on every form."""

from __future__ import annotations

import json

import pytest

from mrtpo.tasks.toolcall import ToolCallTask, canonical_gold, parse_completion


@pytest.fixture(scope="module")
def task():
    return ToolCallTask()


@pytest.fixture(scope="module")
def evals(task):
    return {e.id: e for e in task.load("eval")}


def _lines(calls):
    return [json.dumps(c) for c in calls]


def _score(task, text, e):
    fmt, corr = task.verifiers()
    verdict = task.evaluate([text], [e])
    return fmt(text, e), corr(text, e), verdict["items"][0]["valid"], verdict["format_rate"]


@pytest.mark.parametrize("item_id", ["parallel_0", "parallel_multiple_0", "parallel_10"])
def test_one_block_with_several_lines_and_several_blocks_read_alike(task, evals, item_id):
    e = evals[item_id]
    calls = canonical_gold(e.gold["ground_truth"], e.meta["functions"])
    assert len(calls) >= 2
    one_block = "<tool_call>\n" + "\n".join(_lines(calls)) + "\n</tool_call>"
    blocks = "\n".join(f"<tool_call>\n{line}\n</tool_call>" for line in _lines(calls))
    reversed_blocks = "\n".join(f"<tool_call>\n{line}\n</tool_call>" for line in _lines(calls[::-1]))
    for text in (one_block, blocks, reversed_blocks):
        parsed = parse_completion(text)
        assert parsed.ok and [c.name for c in parsed.calls] == [
            c["name"]
            for c in json.loads("[" + ",".join(_lines(calls if text != reversed_blocks else calls[::-1])) + "]")
        ]
        # format 1, ToolRL full marks, BFCL correct, and evaluate's format rate is the reward's
        assert _score(task, text, e) == (1.0, 3.0, True, 1.0), text
    # text between blocks: still the right calls (correctness, BFCL), but not the instructed form
    chatty = blocks.replace("</tool_call>\n<tool_call>", "</tool_call>\nand then\n<tool_call>", 1)
    assert _score(task, chatty, e) == (0.0, 3.0, True, 0.0)
    # one call short: both the reward and BFCL see it
    short = "<tool_call>\n" + "\n".join(_lines(calls[:-1])) + "\n</tool_call>"
    f, c, valid, _ = _score(task, short, e)
    assert f == 1.0 and c < 3.0 and not valid


def test_no_call_expected_rows_are_scored_the_bfcl_and_toolrl_way(task, evals):
    e = evals["irrelevance_0"]
    some_function = e.meta["functions"][0]["name"]
    call = f'<tool_call>\n{{"name": "{some_function}", "arguments": {{}}}}\n</tool_call>'
    # (format, correctness, BFCL valid, format rate): BFCL is right iff no call decodes; ToolRL's
    # correctness is 0 on such rows whatever is written; format asks for plain text.
    assert _score(task, "None of the functions can compute this.", e) == (1.0, 0.0, True, 1.0)
    assert _score(task, call, e) == (0.0, 0.0, False, 0.0)
    assert _score(task, f"{some_function}()", e)[2] is False  # a Python-style call is a call too
    assert _score(task, "[]", e)[2] is True  # BFCL: an empty decode is no call
    assert _score(task, "<tool_call>\nnot json\n</tool_call>", e)[:3] == (0.0, 0.0, True)
    assert {x.gold["expects_call"] for x in evals.values() if x.meta["category"] == "irrelevance"} == {False}
