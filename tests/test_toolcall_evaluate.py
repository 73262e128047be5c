"""End-to-end evaluation with BFCL's own AST checker on the real eval files."""

from __future__ import annotations

import copy
import json
import sys

import pytest

from mrtpo.tasks.toolcall import (
    EVAL_CATEGORIES,
    ToolCallTask,
    canonical_gold,
    render_tool_calls,
)
from mrtpo.tasks.toolcall.bfcl_shim import CHECKER_MODEL_NAME, load_ast_checker
from mrtpo.tasks.toolcall.evaluate import check_item

REFUSAL = "None of the provided functions can answer this."


@pytest.fixture(scope="module")
def task():
    return ToolCallTask()


@pytest.fixture(scope="module")
def evals(task):
    return task.load("eval")


def gold_output(e) -> str:
    if not e.gold["expects_call"]:
        return REFUSAL
    return render_tool_calls(canonical_gold(e.gold["ground_truth"], e.meta["functions"]))


def by_id(evals, item_id):
    return next(e for e in evals if e.id == item_id)


def gold_calls(e):
    return canonical_gold(e.gold["ground_truth"], e.meta["functions"])


def test_gold_answers_score_100_percent_on_every_category(task, evals):
    result = task.evaluate([gold_output(e) for e in evals], evals)
    json.dumps(result)  # JSON-serialisable
    assert set(result["per_category"]) == set(EVAL_CATEGORIES)
    for category, stats in result["per_category"].items():
        assert stats["accuracy"] == 1.0 and stats["format_rate"] == 1.0, category
    assert result["accuracy"] == result["accuracy_macro"] == result["format_rate"] == 1.0
    assert result["n"] == result["correct"] == 1240
    assert [i["id"] for i in result["items"]] == [e.id for e in evals]


def test_python_syntax_gold_also_passes_but_fails_format(task, evals):
    subset = [e for e in evals if e.gold["expects_call"]][:80]
    outs = []
    for e in subset:
        calls = ", ".join(
            f"{c['name']}(" + ", ".join(f"{k}={v!r}" for k, v in c["arguments"].items()) + ")" for c in gold_calls(e)
        )
        outs.append(f"[{calls}]")
    result = task.evaluate(outs, subset)
    assert result["accuracy"] == 1.0 and result["format_rate"] == 0.0


def _verdict(evals, item_id, mutate):
    e = by_id(evals, item_id)
    calls = copy.deepcopy(gold_calls(e))
    changed = mutate(calls)  # mutates in place, or returns a new list
    calls = changed if isinstance(changed, list) else calls
    return check_item(render_tool_calls(calls), e)


def test_changed_value_is_wrong_with_reason(evals):
    v = _verdict(evals, "simple_python_0", lambda c: c[0]["arguments"].update(base=11))
    assert not v["valid"] and v["error_type"] == "value_error:others"
    assert "Invalid value for parameter 'base': 11" in v["error"][0]
    v = _verdict(evals, "parallel_0", lambda c: c[1]["arguments"].update(artist="Adele"))
    assert not v["valid"] and v["error_type"] == "parallel_function_checker_no_order:cannot_find_match"
    assert "value_error:string" in json.dumps(v["error"])


def test_missing_required_parameter_is_wrong_with_reason(evals):
    v = _verdict(evals, "simple_python_0", lambda c: c[0]["arguments"].pop("height"))
    assert not v["valid"] and v["error_type"] == "simple_function_checker:missing_required"
    assert v["error"] == ["Missing required parameter: 'height'."]
    v = _verdict(evals, "multiple_0", lambda c: c[0]["arguments"].pop("side1"))
    assert v["error_type"] == "simple_function_checker:missing_required"


def test_wrong_function_name_is_wrong_with_reason(evals):
    v = _verdict(evals, "simple_python_1", lambda c: c[0].update(name="math.gamma"))
    assert not v["valid"] and v["error_type"] == "simple_function_checker:wrong_func_name"
    assert "'math.factorial' not found" in v["error"][0]
    # multiple: a sibling function offered in the prompt is still the wrong one
    e = by_id(evals, "multiple_0")
    other = next(f["name"] for f in e.meta["functions"] if f["name"] != gold_calls(e)[0]["name"])
    v = _verdict(evals, "multiple_0", lambda c: c[0].update(name=other))
    assert v["error_type"] == "simple_function_checker:wrong_func_name"


def test_extra_call_is_wrong_with_reason(evals):
    for item_id, kind in (
        ("simple_python_0", "simple_function_checker"),
        ("multiple_0", "multiple_function_checker"),
        ("parallel_0", "parallel_function_checker_no_order"),
        ("parallel_multiple_0", "parallel_function_checker_no_order"),
    ):
        v = _verdict(evals, item_id, lambda c: c + [copy.deepcopy(c[0])])
        assert not v["valid"] and v["error_type"] == f"{kind}:wrong_count", item_id
        assert v["error"] == ["Wrong number of functions."]


def test_parallel_is_order_free_and_irrelevance_rules(evals):
    assert _verdict(evals, "parallel_0", lambda c: c[::-1])["valid"]
    e = by_id(evals, "irrelevance_0")
    v = check_item(render_tool_calls([{"name": e.meta["functions"][0]["name"], "arguments": {}}]), e)
    assert not v["valid"] and v["error_type"] == "irrelevance_error:decoder_success"
    assert check_item("<tool_call>{not json</tool_call>", e)["valid"]  # BFCL: no decodable call
    assert check_item("", e)["valid"]


def test_undecodable_output_is_wrong_with_reason(evals):
    e = by_id(evals, "simple_python_0")
    v = check_item("The area is 25.", e)
    assert not v["valid"] and v["error_type"] == "ast_decoder:decoder_failed"
    assert "no tool call found" in v["error"][0]
    v = check_item("x" * (10 << 20), e)
    assert v["error_type"] == "ast_decoder:decoder_failed"


def test_report_shape_and_length_check(task, evals):
    subset = evals[:10]
    outs = [gold_output(e) for e in subset]
    outs[0] = "nothing"
    result = task.evaluate(outs, subset)
    assert result["n"] == 10 and result["correct"] == 9 and result["accuracy"] == 0.9
    assert result["items"][0]["valid"] is False and result["items"][0]["format"] is False
    json.dumps(result)
    with pytest.raises(ValueError, match="one output per example"):
        task.evaluate(outs[:3], subset)


def test_shim_is_scoped_to_the_checker_import():
    checker = load_ast_checker()
    assert checker.model_name == CHECKER_MODEL_NAME
    assert "bfcl_eval.constants.model_config" not in sys.modules  # the stub was removed again
    module = sys.modules["bfcl_eval.eval_checker.ast_eval.ast_checker"]
    assert module.MODEL_CONFIG_MAPPING[CHECKER_MODEL_NAME].underscore_to_dot is False
    # dotted names stay dotted: BFCL compares them as they are
    assert module.convert_func_name("math.factorial", CHECKER_MODEL_NAME) == "math.factorial"
