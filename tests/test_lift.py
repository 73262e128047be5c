"""The credit lift (docs/design.md#measurement): the pure function, the checked spans of each task, and the
benchmark."""

import json
import subprocess
import sys

import pytest
import torch

from mrtpo.credit.lift import char_spans_to_tokens, span_lift, summarise_lifts
from mrtpo.tasks.instructions import checkers
from mrtpo.tasks.instructions.spans import checked_spans as instruction_spans, constraint_span
from mrtpo.tasks.sql.spans import checked_spans as sql_spans
from mrtpo.tasks.toolcall.spans import checked_spans as toolcall_spans
from mrtpo.verifiers import Example


# ----------------------------------------------------------------------------- span_lift
def test_uniform_weights_have_lift_one():
    mask = torch.tensor([1, 1, 1, 1, 1, 0.0])
    span = torch.tensor([0, 1, 1, 0, 0, 0], dtype=torch.bool)
    assert span_lift(torch.ones(6), span, mask) == pytest.approx(1.0)
    assert span_lift(torch.full((6,), 0.3), span, mask) == pytest.approx(1.0)  # scale-free


def test_lift_hand_computed():
    # weight 3 of 6 on the one span token of 4: share 0.5 over a token share 0.25 = 2
    in_span = torch.tensor([1, 0, 0, 0]).bool()
    assert span_lift(torch.tensor([3.0, 1, 1, 1]), in_span, torch.ones(4)) == pytest.approx(2.0)
    # all weight off the span: lift 0; weight on a padded position does not count
    w = torch.tensor([0.0, 2, 2, 100])
    assert span_lift(w, torch.tensor([1, 0, 0, 1]).bool(), torch.tensor([1, 1, 1, 0.0])) == pytest.approx(0.0)


def test_lift_undefined_cases():
    mask = torch.ones(3)
    assert span_lift(torch.ones(3), torch.zeros(3, dtype=torch.bool), mask) is None  # empty span
    assert span_lift(torch.ones(3), torch.ones(3, dtype=torch.bool), mask) is None  # span = everything
    assert span_lift(torch.zeros(3), torch.tensor([1, 0, 0]).bool(), mask) is None  # no weight at all


def test_char_spans_to_tokens_marks_overlaps():
    offsets = [(0, 3), (3, 5), (5, 9), (9, 9)]  # the last token is special: no characters
    assert char_spans_to_tokens(offsets, [(4, 6)]).tolist() == [False, True, True, False]
    assert char_spans_to_tokens(offsets, [(3, 5)]).tolist() == [False, True, False, False]
    assert char_spans_to_tokens(offsets, [(0, 1), (8, 20)]).tolist() == [True, False, True, False]


def test_summarise_lifts():
    s = summarise_lifts([1.0, 2.0, 3.0, 0.5])
    assert s["n"] == 4 and s["mean"] == pytest.approx(1.625) and s["median"] == pytest.approx(1.5)
    assert s["above_1"] == pytest.approx(0.5)
    assert s["std"] == pytest.approx(torch.tensor([1.0, 2.0, 3.0, 0.5]).std().item())
    assert summarise_lifts([])["mean"] is None


# ----------------------------------------------------------------------------- instruction spans
def _constraint(cid, **kwargs):
    return {"benchmark": "ifeval", "id": cid, "kwargs": kwargs}


@pytest.mark.parametrize(
    "text",
    [
        "Sure.\nIs there anything else I can help with?  ",
        '"Sure. Is there anything else I can help with?"\n',
        "Sure. This answer ends otherwise, with no phrase at all.",
    ],
)
def test_end_phrase_span_is_what_the_checker_compares(text):
    phrase = "Is there anything else I can help with?"
    c = _constraint("startend:end_checker", end_phrase=phrase)
    [(a, b)] = constraint_span(c, text)
    ok = checkers.check_strict("ifeval", c["id"], c["kwargs"], text, "prompt")
    assert (text[a:b].lower() == phrase.lower()) == ok
    assert b - a == len(phrase)


def test_keyword_forbidden_postscript_and_title_spans():
    text = "<<A Day>>\nThe Park opens. We love the park!\n\nP.S. bring water\nbye"

    def shown(kind, **args):
        return [text[a:b] for a, b in constraint_span(_constraint(kind, **args), text)]

    assert shown("keywords:existence", keywords=["park"]) == ["Park", "park"]
    assert shown("keywords:frequency", keyword="love", frequency=2, relation="at least") == ["love"]
    assert shown("keywords:forbidden_words", forbidden_words=["opens"]) == ["opens"]
    assert constraint_span(_constraint("keywords:forbidden_words", forbidden_words=["rain"]), text) is None
    assert shown("detectable_content:postscript", postscript_marker="P.S.") == ["P.S. bring water"]
    assert shown("detectable_format:title") == ["<<A Day>>"]
    assert constraint_span(_constraint("change_case:english_lowercase"), text) is None  # whole-response property


def test_instruction_spans_follow_the_slots():
    ex = Example(
        id="x",
        split="train",
        messages=[{"role": "user", "content": "p"}],
        gold={
            "constraints": [
                _constraint("change_case:english_lowercase"),
                _constraint("keywords:existence", keywords=["tea"]),
            ]
        },
    )
    spans = instruction_spans(ex, "I like tea.", [f"constraint_{k}" for k in range(1, 6)])
    assert spans == [("constraint_2", "keyword", [(7, 10)])]


# ----------------------------------------------------------------------------- toolcall, sql
def _toolcall_example():
    return Example(
        id="t",
        split="train",
        messages=[{"role": "user", "content": "weather?"}],
        gold={"ground_truth": [{"get_weather": {"city": ["Paris"], "unit": ["C", ""]}}]},
        meta={
            "functions": [
                {"name": "get_weather", "parameters": {"properties": {"city": {}, "unit": {}}, "required": ["city"]}}
            ]
        },
    )


def test_toolcall_wrong_argument_value_span():
    text = 'Here: {"name": "get_weather", "arguments": {"city": "paris", "unit": "F", "extra": 1}}'
    spans = dict(
        (kind, [text[a:b] for a, b in s])
        for _, kind, s in toolcall_spans(_toolcall_example(), text, ["format", "correctness"])
    )
    assert spans == {"argument value": ['"paris"', '"F"'], "wrong argument value": ['"F"']}  # BFCL case-folds strings
    assert toolcall_spans(_toolcall_example(), "no call at all", ["format", "correctness"]) == []


def test_sql_spans():
    text = "The answer:\n```sql\nSELECT count(*) FROM pets\n```\nDone."
    spans = {
        (name, kind): [text[a:b] for a, b in s]
        for name, kind, s in sql_spans(None, text, ["format", "executes", "result"])
    }
    assert spans[("format", "code fence")] == ["```sql", "```"]
    assert spans[("executes", "SQL query")] == spans[("result", "SQL query")] == ["SELECT count(*) FROM pets"]


# ----------------------------------------------------------------------------- the benchmark
def test_token_offsets_cover_the_decoded_text():
    from mrtpo.bench.lift import token_offsets
    from mrtpo.testing import tiny_tokenizer

    tok = tiny_tokenizer()
    text = "héllo → wörld"
    ids = tok(text, add_special_tokens=False)["input_ids"] + [tok.convert_tokens_to_ids("<|im_end|>")]
    offsets = token_offsets(tok, ids)
    decoded = tok.decode(ids, skip_special_tokens=True)
    assert decoded == text and offsets[-1][0] == offsets[-1][1] == len(text)
    assert offsets[0][0] == 0 and all(a <= b for a, b in offsets)
    assert all(offsets[i][1] == offsets[i + 1][0] for i in range(len(offsets) - 1))


def test_lift_bench_runs_and_uniform_methods_have_lift_one(tiny_model_dir, tmp_path):
    out = tmp_path / "lift.json"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "mrtpo.cli",
            "bench",
            "lift",
            "--model",
            str(tiny_model_dir),
            "--task",
            "instructions",
            "--prompts",
            "5",
            "--group-size",
            "2",
            "--max-new-tokens",
            "12",
            "--dtype",
            "float32",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    record = json.loads(out.read_text())
    assert len(record["prompts"]) == 5
    rows = record["rows"]
    assert rows, "the end-phrase constraint of the fifth prompt always has a span"
    assert {r["kind"] for r in rows} >= {"end phrase"}
    for r in rows:
        assert r["lift"]["gdpo"] == pytest.approx(1.0)  # uniform weights
        assert r["lift"]["mrtpo"] is None or r["lift"]["mrtpo"] >= 0
        assert 0 < r["span_tokens"] < r["tokens"]
    assert "end phrase" in proc.stdout
