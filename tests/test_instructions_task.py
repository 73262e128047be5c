"""The registered task: splits, the five slot verifiers with evidence, and evaluate()."""

from __future__ import annotations

import json

import pytest

from mrtpo.tasks import get_task
from mrtpo.tasks.instructions import InstructionsTask
from mrtpo.tasks.instructions.generate import build_prompt
from mrtpo.tasks.instructions.verifiers import ConstraintVerifier
from mrtpo.verifiers import Evidence, Example, Verifier


def _example(constraints: list[dict], base: str = "Write a poem about tea.") -> Example:
    prompt = build_prompt(base, [c["sentence"] for c in constraints])
    return Example(
        id="t-1",
        split="train",
        messages=[{"role": "user", "content": prompt}],
        gold={"prompt": prompt, "constraints": constraints},
    )


NO_COMMA = {
    "benchmark": "ifeval",
    "id": "punctuation:no_comma",
    "kwargs": {},
    "sentence": "In your entire response, refrain from the use of any commas.",
    "anchor": None,
}
FLOOR = {
    "benchmark": "ifeval",
    "id": "length_constraints:number_words",
    "kwargs": {"num_words": 8, "relation": "at least"},
    "sentence": "Answer with at least 8 words.",
    "anchor": "min_words",
}
END = {
    "benchmark": "ifeval",
    "id": "startend:end_checker",
    "kwargs": {"end_phrase": "Any other questions?"},
    "sentence": "Finish your response with this exact phrase Any other questions?. No other words "
    "should follow this phrase.",
    "anchor": None,
}


def test_registered_and_splits() -> None:
    task = get_task("instructions", train_size=7, seed=3, anchor="min_words", pool="all")
    assert isinstance(task, InstructionsTask) and task.name == "instructions"
    train = task.load("train")
    assert len(train) == 7 and all(e.split == "train" for e in train)
    assert [e.id for e in task.load("train", limit=3)] == [e.id for e in train[:3]]
    assert len(task.load("eval")) == 541
    assert [e.id for e in task.load("eval_ifeval", limit=2)] == ["ifeval-1000", "ifeval-1001"]
    assert len(task.load("eval_ifbench", limit=4)) == 4
    with pytest.raises(ValueError, match="unknown split"):
        task.load("test")


def test_five_slot_verifiers_scores_and_none() -> None:
    vs = get_task("instructions").verifiers()
    assert [v.name for v in vs] == [f"constraint_{k}" for k in range(1, 6)]
    assert all(isinstance(v, Verifier) for v in vs)
    ex = _example([NO_COMMA, FLOOR])
    good = "Steam rises from the cup and warms the quiet morning air."
    short = "Steam rises."
    comma = "Steam rises, and the quiet morning air is warm around the cup."
    assert [v(good, ex) for v in vs] == [1.0, 1.0, None, None, None]
    assert [v(short, ex) for v in vs] == [1.0, 0.0, None, None, None]
    assert [v(comma, ex) for v in vs] == [0.0, 1.0, None, None, None]
    # never raises on model output
    assert [v("", ex) for v in vs][:2] == [0.0, 0.0]
    assert vs[0](None, ex) == 0.0  # type: ignore[arg-type]
    assert vs[0]([{"role": "assistant", "content": good}], ex) == 1.0  # chat-style completion


def test_loose_mode() -> None:
    ex = _example([END])
    text = "Tea is old. Any other questions?\nBye"
    assert ConstraintVerifier(1)(text, ex) == 0.0
    assert ConstraintVerifier(1, mode="loose")(text, ex) == 1.0
    with pytest.raises(ValueError, match="mode"):
        ConstraintVerifier(1, mode="lenient")
    with pytest.raises(ValueError, match="slot"):
        ConstraintVerifier(6)


def test_evidence_is_the_sentence_and_removal_keeps_the_rest() -> None:
    task = get_task("instructions", train_size=60, seed=9, pool="all", anchor=("min_words",))
    vs = task.verifiers()
    for ex in task.load("train"):
        prompt = ex.messages[0]["content"]
        base = ex.meta["base_task"]
        sentences = [c["sentence"] for c in ex.gold["constraints"]]
        for k, v in enumerate(vs):
            ev = v.evidence(ex)
            if k >= len(sentences):
                assert ev is None and v("anything", ex) is None
                continue
            assert ev == Evidence(sentences[k], "in_prompt")
            assert prompt.count(ev.text) == 1
            rest = prompt.replace(ev.text, "", 1)
            assert rest.startswith(base) and all(rest.count(s) == 1 for j, s in enumerate(sentences) if j != k)
    # benchmark prompts carry no sentence: no evidence, but still scored
    ev_ex = task.load("eval", limit=1)[0]
    assert vs[0].evidence(ev_ex) is None and vs[0]("x", ev_ex) in (0.0, 1.0)


def test_unverifiable_slot_is_none_and_missing_gold_is_an_error() -> None:
    task = get_task("instructions")
    ib = task.load("eval_ifbench")
    sv = next(e for e in ib if e.gold["constraints"][0]["id"] == "words:start_verb")
    assert task.verifiers()[0]("Write it now.", sv) is None
    typo = _example([{**NO_COMMA, "id": "punctuation:no_commas"}])
    with pytest.raises(KeyError, match="unknown ifeval instruction id"):
        task.verifiers()[0]("x", typo)
    bare = Example(id="x", split="train", messages=[{"role": "user", "content": "hi"}])
    with pytest.raises(ValueError, match="gold\\['constraints'\\]"):
        task.verifiers()[0]("x", bare)


def test_evaluate_hand_computed() -> None:
    task = get_task("instructions")
    a = _example([NO_COMMA, FLOOR])
    b = _example([END])
    outputs = [
        "Steam rises from the cup and warms the quiet morning air.",  # both pass
        "Tea is old. Any other questions?\n**Bye**",  # strict fails, loose passes
    ]
    r = task.evaluate(outputs, [a, b])
    assert r["n_prompts"] == 2 and r["n_instructions"] == 3
    assert r["prompt_level_strict"] == 0.5 and r["prompt_level_loose"] == 1.0
    assert r["instruction_level_strict"] == pytest.approx(2 / 3)
    assert r["instruction_level_loose"] == 1.0
    assert r["per_instruction"]["ifeval/startend:end_checker"] == {"n": 1, "strict": 0.0, "loose": 1.0}
    assert r["per_prompt"][1] == {
        "id": "t-1",
        "instructions": ["ifeval/startend:end_checker"],
        "strict": [False],
        "loose": [True],
    }
    json.dumps(r)
    with pytest.raises(ValueError, match="one output per example"):
        task.evaluate(["only one"], [a, b])


def test_evaluate_excludes_unverifiable_prompts_explicitly() -> None:
    task = get_task("instructions")
    ib = task.load("eval_ifbench")
    r = task.evaluate(["Write."] * len(ib), ib)
    assert r["n_prompts"] == 294 and r["n_excluded_prompts"] == 6
    assert set(r["excluded"]) == {"ifbench/words:start_verb"}
    assert "POS tagger" in r["excluded"]["ifbench/words:start_verb"]["reason"]
    assert "ifbench/words:start_verb" not in r["per_instruction"]


def test_evidence_in_the_chat_templated_prompt() -> None:
    """The contract is about the rendered prompt the policy sees (ChatML, as Qwen's)."""
    from mrtpo.testing import tiny_tokenizer

    tok = tiny_tokenizer()
    task = get_task("instructions", train_size=40, seed=21, pool="all", anchor=("keywords",))
    vs = task.verifiers()
    for ex in task.load("train"):
        rendered = tok.apply_chat_template(ex.messages, tokenize=False, add_generation_prompt=True)
        evs = [e for e in (v.evidence(ex) for v in vs) if e is not None]
        assert len(evs) == len(ex.gold["constraints"])
        for ev in evs:
            assert rendered.count(ev.text) == 1
        # removing all of them at once (the "contrast" baseline) keeps the base task and the
        # chat frame intact
        stripped = rendered
        for ev in evs:
            stripped = stripped.replace(ev.text, "", 1)
        assert ex.meta["base_task"] in stripped
        assert stripped.startswith("<|im_start|>user\n") and stripped.endswith("<|im_end|>\n<|im_start|>assistant\n")
