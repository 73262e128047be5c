"""The ``format`` and ``correctness`` rewards: the original spec's numbers (../shared/design/SPEC.md §2),
hand-computed ToolRL scores, BFCL value semantics, evidence, and agreement with BFCL's checker on the real eval
files."""

from __future__ import annotations

import copy
import json
import random

import pytest

from mrtpo.tasks.toolcall import (
    FORMAT_INSTRUCTION,
    ToolCallTask,
    canonical_gold,
    render_tool_calls,
)
from mrtpo.tasks.toolcall.evaluate import check_item
from mrtpo.tasks.toolcall.parse import parse_completion
from mrtpo.tasks.toolcall.verifiers import (
    NO_CALL_EVIDENCE,
    CorrectnessVerifier,
    FormatVerifier,
    effective_ground_truth,
    value_matches,
)
from mrtpo.verifiers import Example, Verifier

FMT, CORR = FormatVerifier(), CorrectnessVerifier()


def example(ground_truth, functions=None, category="simple_python") -> Example:
    return Example(
        id="t",
        split="eval",
        messages=[{"role": "system", "content": FORMAT_INSTRUCTION}],
        gold={"ground_truth": ground_truth, "expects_call": bool(ground_truth)},
        meta={"category": category, "functions": functions or []},
    )


def block(*calls) -> str:
    return render_tool_calls([{"name": n, "arguments": a} for n, a in calls])


WEATHER = example(
    [{"get_weather": {"city": ["Paris"], "unit": ["C"]}}],
    [
        {
            "name": "get_weather",
            "description": "Weather.",
            "parameters": {
                "type": "dict",
                "properties": {"city": {"type": "string"}, "unit": {"type": "string"}},
                "required": ["city", "unit"],
            },
        }
    ],
)


def test_verifiers_follow_the_protocol():
    assert isinstance(FMT, Verifier) and isinstance(CORR, Verifier)
    assert [v.name for v in ToolCallTask().verifiers()] == ["format", "correctness"]


def test_spec_reference_numbers():
    assert CORR(block(("get_weather", {"city": "Paris", "unit": "C"})), WEATHER) == 3.0
    assert CORR(block(("get_weather", {"city": "Paris", "unit": "F"})), WEATHER) == 1.5
    assert CORR(block(("get_weather", {"city": "Paris"})), WEATHER) == 0.75
    assert CORR(block(("get_forecast", {"city": "Paris", "unit": "C"})), WEATHER) == -3.0
    # the score depends on the calls, not on the form they were written in
    assert CORR("get_weather(city='Paris', unit='C')", WEATHER) == 3.0
    assert CORR('{"name": "get_weather", "arguments": {"city": "Paris", "unit": "F"}}', WEATHER) == 1.5


def test_no_parsable_call_scores_minus_three():
    for bad in (
        "",
        "It is sunny in Paris.",
        '<tool_call>{"name": "get_weather"</tool_call>',
        "x" * 200_000,
        None,
        b"\xff\x00",
    ):
        assert CORR(bad, WEATHER) == -3.0
        assert FMT(bad, WEATHER) == 0.0


PLAY = example(
    [
        {"spotify.play": {"artist": ["Taylor Swift"], "duration": [20]}},
        {"spotify.play": {"artist": ["Maroon 5"], "duration": [15]}},
    ],
    category="parallel",
)


def test_hand_computed_parallel_scores():
    a = ("spotify.play", {"artist": "Taylor Swift", "duration": 20})
    b = ("spotify.play", {"artist": "Maroon 5", "duration": 15})
    # S_max = 1 + (1 + 2) + (1 + 2) = 7
    assert CORR(block(a, b), PLAY) == 3.0
    assert CORR(block(b, a), PLAY) == 3.0  # order-free pairing
    assert CORR(block(a), PLAY) == pytest.approx(6 * (0.5 + 3) / 7 - 3)  # = 0.0
    extra = ("spotify.play", {"artist": "Adele", "duration": 5})
    assert CORR(block(a, b, extra), PLAY) == pytest.approx(6 * (2 / 3 + 6) / 7 - 3)
    wrong_value = ("spotify.play", {"artist": "Maroon 5", "duration": 16})
    assert CORR(block(a, wrong_value), PLAY) == pytest.approx(6 * (1 + 3 + 2) / 7 - 3)


TRIANGLE = example([{"calculate_triangle_area": {"base": [10], "height": [5], "unit": ["units", ""]}}])


def test_optional_parameters_and_bfcl_value_rules():
    name = "calculate_triangle_area"
    assert CORR(block((name, {"base": 10, "height": 5})), TRIANGLE) == 3.0  # optional omitted
    assert CORR(block((name, {"base": 10, "height": 5, "unit": "Units"})), TRIANGLE) == 3.0
    assert CORR(block((name, {"base": 10.0, "height": 5, "unit": "units"})), TRIANGLE) == 3.0
    # S_max = 1 + 1 + 3 = 5; wrong optional value: 1 + 1 + 2
    assert CORR(block((name, {"base": 10, "height": 5, "unit": "cm"})), TRIANGLE) == pytest.approx(6 * 4 / 5 - 3)
    # unexpected parameter: Jaccard {base,height} / {base,height,color}
    got = CORR(block((name, {"base": 10, "height": 5, "color": "red"})), TRIANGLE)
    assert got == pytest.approx(6 * (1 + 2 / 3 + 3) / 5 - 3)
    assert CORR(block((name, {"base": "10", "height": 5})), TRIANGLE) == pytest.approx(6 * (1 + 1 + 2) / 5 - 3)


def test_value_matching_mirrors_bfcl():
    assert value_matches("taylor-swift", ["Taylor Swift"])  # BFCL drops spaces and ,./-_*^
    assert value_matches("April 1, 2024", ["april 1 2024"])
    assert not value_matches(True, [1]) and not value_matches(1, [True])
    assert value_matches(5, [5.0]) and not value_matches("5", [5])
    assert not value_matches("", [""]) and not value_matches(None, [""])
    assert value_matches([3, 5], [[3, 5]]) and not value_matches([5, 3], [[3, 5]])
    nested = [{"size": ["large"], "milk": ["coconut", ""]}]
    assert value_matches({"size": "Large"}, nested)
    assert value_matches({"size": "large", "milk": "coconut"}, nested)
    assert not value_matches({"size": "large", "sugar": "none"}, nested)
    assert not value_matches({"milk": "coconut"}, nested)
    assert value_matches([{"x": 60.2, "y": 12.3}], [[{"x": [60.2], "y": [12.3]}]])
    # below a nested possible answer, values are concrete (live_multiple_121-46-0)
    assert value_matches(
        {"position": {"lateral": 10.5, "longitudinal": 50}},
        [{"position": [{"lateral": 10.5, "longitudinal": 50}], "orientation": ["", 30]}],
    )


def test_schema_reconciliation_matches_bfcl():
    """simple_python_200: the answer marks a schema-required parameter omittable; BFCL requires it."""
    e = next(x for x in ToolCallTask().load("eval") if x.id == "simple_python_200")
    gt = effective_ground_truth(e.gold["ground_truth"], e.meta["functions"])
    assert gt[0]["calculate_emissions"]["fuel_efficiency"] == [25.0]
    args = {"distance": 12000, "fuel_type": "gas"}
    out = block(("calculate_emissions", args))
    assert not check_item(out, e)["valid"] and CORR(out, e) < 3.0
    assert CORR(block(("calculate_emissions", {**args, "fuel_efficiency": 25})), e) == 3.0


IRRELEVANT = example([], category="irrelevance")


def test_no_call_expected():
    # ToolRL: a row whose answer holds no call scores 0 on correctness whatever the completion;
    # whether the model refrained is the format reward's business.
    for text in (
        "None of the functions can compute that.",
        block(("f", {"a": 1})),
        "f(a=1)",
        "<tool_call>{broken</tool_call>",
        "",
    ):
        assert CORR(text, IRRELEVANT) == 0.0, text
    assert CorrectnessVerifier(call_when_none_expected=-3.0)(block(("f", {"a": 1})), IRRELEVANT) == -3.0
    assert CorrectnessVerifier(call_when_none_expected=-1.0)("f(a=1)", IRRELEVANT) == -1.0
    assert CorrectnessVerifier(call_when_none_expected=-1.0)("I can't.", IRRELEVANT) == 0.0
    with pytest.raises(ValueError):
        CorrectnessVerifier(call_when_none_expected=-4.0)
    assert FMT("I cannot help with that using these functions.", IRRELEVANT) == 1.0
    for text in (
        "",
        "  ",
        block(("f", {})),
        "f(a=1)",
        '{"name": "f", "arguments": {}}',
        "no <tool_call> here",
        "x" * 200_000,
    ):
        assert FMT(text, IRRELEVANT) == 0.0, text[:40]


def test_format_is_strict_about_the_instructed_shape():
    good = block(("get_weather", {"city": "Paris", "unit": "C"}))
    assert FMT(good, WEATHER) == 1.0
    assert FMT(block(("get_forecast", {})), WEATHER) == 1.0  # format says nothing about content
    assert FMT(block(("a", {}), ("b", {"x": 1})), PLAY) == 1.0
    two_blocks = block(("a", {})) + "\n" + block(("b", {"x": 1}))
    assert FMT(two_blocks, PLAY) == 1.0  # several blocks: the instruction allows it (parallel calls)
    for bad in (
        two_blocks + "\nDone.",
        "Here you go:\n" + good,
        good + "\nDone.",
        '{"name": "get_weather", "arguments": {"city": "Paris", "unit": "C"}}',
        "get_weather(city='Paris', unit='C')",
        "```json\n" + good[11:-12] + "\n```",
        '<tool_call>\n{"name": "get_weather", "parameters": {"city": "Paris"}}\n</tool_call>',
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}, "id": 1}\n</tool_call>',
        "<tool_call>\n{'name': 'get_weather', 'arguments': {}}\n</tool_call>",
        "<tool_call>\n</tool_call>",
    ):
        assert FMT(bad, WEATHER) == 0.0, bad
    assert FMT("\n  " + good + "\n", WEATHER) == 1.0


def test_evidence():
    ev = FMT.evidence(WEATHER)
    assert (ev.text, ev.placement) == (FORMAT_INSTRUCTION, "in_prompt")
    assert "For example:\n<tool_call>\n" in ev.text  # the whole instruction, example included
    mine = "Answer as <tool_call>{json}</tool_call>."
    own = Example(
        "u",
        "train",
        [{"role": "system", "content": "Tools.\n" + mine}, {"role": "user", "content": "q"}],
        WEATHER.gold,
        meta={**WEATHER.meta, "format_instruction": mine},
    )
    assert FMT.evidence(own).text == mine
    for messages in (
        [{"role": "user", "content": "q"}],
        [{"role": "system", "content": mine + mine}, {"role": "user", "content": "q"}],
    ):
        with pytest.raises(ValueError, match="exactly once"):
            FMT.evidence(Example("u", "train", messages, WEATHER.gold, meta=own.meta))
    ev = CORR.evidence(WEATHER)
    assert ev.placement == "privileged"
    assert CORR(ev.text, WEATHER) == 3.0 and FMT(ev.text, WEATHER) == 1.0
    assert json.loads(ev.text.splitlines()[1]) == {"name": "get_weather", "arguments": {"city": "Paris", "unit": "C"}}
    ev = CORR.evidence(TRIANGLE)  # several acceptable values: the full sets are shown too
    assert "Accepted values" in ev.text and '"unit": ["units", ""]' in ev.text
    assert CORR.evidence(IRRELEVANT).text == NO_CALL_EVIDENCE


@pytest.fixture(scope="module")
def evals():
    return ToolCallTask().load("eval")


def test_gold_scores_full_marks_on_every_eval_item(evals):
    for e in evals:
        if e.gold["expects_call"]:
            out = render_tool_calls(canonical_gold(e.gold["ground_truth"], e.meta["functions"]))
            assert (FMT(out, e), CORR(out, e)) == (1.0, 3.0), e.id
            assert CORR(CORR.evidence(e).text, e) == 3.0
        else:
            assert (FMT("No suitable function.", e), CORR("No suitable function.", e)) == (1.0, 0.0)


def _perturb(value, rng):
    if isinstance(value, bool):
        return not value
    if isinstance(value, (int, float)):
        return value + 7919
    if isinstance(value, str):
        return value + " zq"
    if isinstance(value, list):
        return value + value[:1] if value else ["zq"]
    if isinstance(value, dict):
        return {**value, "zq_extra": 1}
    return "zq"


def test_changed_values_agree_with_bfcls_checker(evals):
    """One changed argument per item: BFCL accepts it exactly when the reward stays at 3."""
    rng = random.Random(0)
    rejected = 0
    for e in evals:
        if not e.gold["expects_call"]:
            continue
        calls = canonical_gold(e.gold["ground_truth"], e.meta["functions"])
        candidates = [(i, k) for i, c in enumerate(calls) for k in c["arguments"]]
        if not candidates:
            continue
        i, key = rng.choice(candidates)
        changed = copy.deepcopy(calls)
        changed[i]["arguments"][key] = _perturb(changed[i]["arguments"][key], rng)
        out = render_tool_calls(changed)
        verdict = check_item(out, e)
        score = CORR(out, e)
        assert -3.0 <= score <= 3.0
        assert verdict["valid"] == (score == 3.0), (e.id, key, verdict, score)
        rejected += not verdict["valid"]
    assert rejected > 900  # nearly every change is wrong (a few acceptable sets hold both booleans)


def test_scores_stay_in_range_on_hostile_and_random_completions(evals):
    rng = random.Random(1)
    texts = ["", "\x00", "[" * 50_000, "<tool_call>" * 1000, "f(" * 300, "x" * (10 << 20)]
    for e in rng.sample(evals, 60):
        calls = canonical_gold(e.gold["ground_truth"], e.meta["functions"]) if e.gold["expects_call"] else []
        out = render_tool_calls(calls) if calls else "nothing"
        cut = [out[: rng.randrange(len(out) + 1)] for _ in range(5)]
        for text in texts + cut:
            s, f = CORR(text, e), FMT(text, e)
            assert -3.0 <= s <= 3.0 and f in (0.0, 1.0)
        assert parse_completion(out).ok == bool(calls)
