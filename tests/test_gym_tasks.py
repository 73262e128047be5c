"""The gym tasks: rewards and ground-truth relevant positions on hand-computed cases, evidence that
occurs in the rendered prompt, demonstrators that meet rewards at the set rate, deterministic splits."""

from __future__ import annotations

import random

import pytest

from mrtpo.counterfactual import remove_span
from mrtpo.gym import answer, call, constraints, long
from mrtpo.gym.vocab import WORDS, gym_tokenizer
from mrtpo.tasks import get_task
from mrtpo.verifiers import Example

GYM = ("gym-constraints", "gym-answer", "gym-call", "gym-overlap", "gym-tradeoff", "gym-long")


def _constraints_example(clauses):
    gold = {
        "topic": ["fig", "tan", "elk"],
        "length": 6,
        "clauses": [{"kind": k, "args": a, "text": constraints.clause_text(k, a)} for k, a in clauses],
    }
    return Example(id="x", split="train", messages=[{"role": "user", "content": "?"}], gold=gold)


def test_constraints_rewards_and_positions_by_hand():
    ex = _constraints_example(
        [
            ("include", ["owl"]),
            ("avoid", ["rice"]),
            ("start", ["gold"]),
            ("end", ["pie"]),
            ("before", ["cat", "dog"]),
            ("count", ["fox", 2]),
            ("length", [6]),
        ]
    )
    verifiers = constraints.verifiers(7)
    words = "gold owl cat rice dog pie".split()
    assert [v(" ".join(words), ex) for v in verifiers] == [1.0, 0.0, 1.0, 1.0, 1.0, 0.0, 1.0]
    assert [v.positions(words, ex) for v in verifiers] == [[1], [3], [0], [5], [2, 4], [], [6]]
    # dog before cat breaks "cat before dog"; both first occurrences are the relevant positions
    words = "dog fox cat fox cat".split()
    assert verifiers[4](" ".join(words), ex) == 0.0 and verifiers[4].positions(words, ex) == [0, 2]
    assert verifiers[5](" ".join(words), ex) == 1.0 and verifiers[5].positions(words, ex) == [1, 3]
    assert verifiers[6](" ".join(words), ex) == 0.0 and verifiers[6].positions(words, ex) == [5]


def test_overlap_control_shares_evidence_and_positions():
    task = get_task("gym-overlap")
    ex = task.load("train", 1)[0]
    x = ex.gold["clauses"][0]["args"][0]
    once, twice = task.verifiers()
    words = [x, "the", x]
    assert (once(" ".join(words), ex), twice(" ".join(words), ex)) == (1.0, 1.0)
    assert (once(x, ex), twice(x, ex)) == (1.0, 0.0)
    assert once.evidence(ex) == twice.evidence(ex)
    assert task.relevant_positions(ex, words) == {"once": [0, 2], "twice": [0, 2]}


def test_answer_rewards_and_positions_by_hand():
    gold = {
        "items": ["owl", "red", "pie", "rome"],
        "op": "reverse",
        "category": None,
        "answer": ["rome", "pie", "red", "owl"],
        "items_text": "items : owl red pie rome .",
    }
    ex = Example(id="a", split="train", messages=[], gold=gold)
    fmt, valid, result = answer.verifiers()
    words = "<ans> rome pie owl red </ans>".split()
    assert [v(" ".join(words), ex) for v in (fmt, valid, result)] == [1.0, 1.0, 0.0]
    assert fmt.positions(words, ex) == [0, 5] and valid.positions(words, ex) == [1, 2, 3, 4]
    assert result.positions(words, ex) == [3]
    # bracketed but right: format fails where the wrapper is, result and valid hold
    words = "[ rome pie red owl ]".split()
    assert [v(" ".join(words), ex) for v in (fmt, valid, result)] == [0.0, 1.0, 1.0]
    assert fmt.positions(words, ex) == [0, 5]
    # a word that is not an item; a missing last item points after the last answer word
    words = "<ans> rome cat red </ans>".split()
    assert (valid(" ".join(words), ex), valid.positions(words, ex), result.positions(words, ex)) == (0.0, [2], [2])
    words = "<ans> rome pie red </ans>".split()
    assert result(" ".join(words), ex) == 0.0 and result.positions(words, ex) == [4]
    assert answer.gold_answer(["owl", "red", "pie", "cat"], "keep", "animal") == ["owl", "cat"]


def test_call_rewards_and_positions_by_hand():
    gold = {"name": "order", "args": [("food", "pie"), ("count", "3")], "call": "order ( food = pie , count = 3 )"}
    ex = Example(id="c", split="train", messages=[], gold=gold)
    fmt, corr = call.verifiers()
    words = "<call> order ( food = pie , count = 4 ) </call>".split()
    assert fmt(" ".join(words), ex) == 1.0
    assert corr(" ".join(words), ex) == pytest.approx((1 + 1 + 0.5) / 3)
    assert corr.positions(words, ex) == [9]
    words = "order ( food = pie )".split()  # unwrapped, count missing: the ")" is where it should be
    assert fmt(" ".join(words), ex) == 0.0
    assert corr(" ".join(words), ex) == pytest.approx((1 + 0.5 + 0.5) / 3)
    assert corr.positions(words, ex) == [5]
    words = "find ( city = pie , count = 3 )".split()  # wrong name, wrong key, food missing
    assert corr(" ".join(words), ex) == pytest.approx((0 + 0.5 + 0.5) / 3)
    assert corr.positions(words, ex) == [0, 2, 9]
    exact = "<call> order ( food = pie , count = 3 ) </call>".split()
    assert corr(" ".join(exact), ex) == 1.0 and corr.positions(exact, ex) == [1, 5, 9]
    assert fmt("<call> order ( food = pie count = 3 ) </call>", ex) == 0.0  # a missing comma
    assert corr("no call at all", ex) == 0.0


@pytest.mark.parametrize("name", GYM)
def test_evidence_occurs_once_in_the_rendered_prompt_and_words_are_in_vocab(name):
    task = get_task(name)
    tok = gym_tokenizer()
    for ex in task.load("train", 20) + task.load("eval", 5):
        prompt = tok.apply_chat_template(ex.messages, tokenize=False, add_generation_prompt=True)
        assert tok.unk_token_id not in tok(prompt, add_special_tokens=False)["input_ids"]
        for v in task.verifiers():
            ev = v.evidence(ex)
            if ev.placement == "in_prompt":
                assert "  " not in remove_span(prompt, ev.text)
            else:
                assert all(w in WORDS for w in ev.text.split())  # (a copy's gold answer is in the prompt)


@pytest.mark.parametrize("name", GYM)
def test_demonstrator_meets_rewards_near_its_rate_and_outputs_score(name):
    task = get_task(name, p_follow=0.5)
    rng = random.Random(0)
    examples = task.load("train", 300)
    totals = [0.0] * len(task.verifiers())
    for ex in examples:
        _, words = task.demonstration(ex, rng)
        for i, v in enumerate(task.verifiers()):
            totals[i] += v(" ".join(words), ex)
    rates = [t / len(examples) for t in totals]
    assert all(0.1 < r < 0.95 for r in rates), rates  # spread: neither never nor always met
    metrics = task.evaluate(["garbage ( ( </ans>", ""], examples[:2])
    assert metrics["n"] == 2 and 0.0 <= metrics["all_correct"] <= 1.0


def test_the_registry_registers_every_family_under_its_name():
    from mrtpo.gym.task import FAMILIES
    from mrtpo.tasks import GYM_TASK_NAMES, TASK_NAMES

    assert GYM_TASK_NAMES == GYM == tuple(f.name for f in FAMILIES) and set(GYM) <= set(TASK_NAMES)
    assert [type(get_task(name)) for name in GYM] == list(FAMILIES)


def test_splits_are_deterministic_and_disjoint():
    task = get_task("gym-constraints")
    train, again, held = task.load("train", 50), task.load("train", 50), task.load("eval", 50)
    assert [e.messages for e in train] == [e.messages for e in again]
    assert not {e.messages[0]["content"] for e in train} & {e.messages[0]["content"] for e in held}
    with pytest.raises(ValueError, match="unknown split"):
        task.load("test")
    with pytest.raises(TypeError, match="unknown gym-constraints setting"):
        get_task("gym-constraints", clauses=3)


def test_checked_spans_are_the_relevant_words():
    task = get_task("gym-constraints")
    ex = _constraints_example([("include", ["owl"]), ("length", [3])])
    task._verifiers = constraints.verifiers(2)
    text = "fig owl tan"
    # the length rule's position is the end-of-turn token, which has no characters
    assert task.checked_spans(ex, text) == [("c1", "gym-constraints/c1", [(4, 7)])]


def test_tradeoff_prompts_ask_for_a_first_and_a_last_word():
    task = get_task("gym-tradeoff")
    assert [v.name for v in task.verifiers()] == ["c1", "c2"]
    for ex in task.load("train", 30):
        kinds = sorted(c["kind"] for c in ex.gold["clauses"])
        assert kinds == ["end", "start"]
        words = ex.gold["topic"] * 4
        truth = task.relevant_positions(ex, words)
        assert sorted(truth.values()) == [[0], [len(words) - 1]]  # disjoint spans: the first and the last word


def test_tradeoff_demonstrator_meets_one_rule_at_a_time():
    """With both rules visible, a demonstration meets exactly one of them 90 % of the time and both
    10 %: the sum of the two rewards is nearly constant, the shape where GDPO's advantages cancel."""
    from mrtpo.gym.task import TRADEOFF_BOTH

    task = get_task("gym-tradeoff")
    rng = random.Random(1)
    met = []
    for ex in task.load("train", 600):
        messages, words = task.demonstration(ex, rng)
        if messages != ex.messages:  # a rule was hidden: the demonstrator ignored it
            continue
        met.append(tuple(v(" ".join(words), ex) for v in task.verifiers()))
    both = sum(m == (1.0, 1.0) for m in met) / len(met)
    one = sum(sum(m) == 1.0 for m in met) / len(met)
    assert len(met) > 300 and abs(both - TRADEOFF_BOTH) < 0.05 and both + one == pytest.approx(1.0)
    assert 0.35 < sum(m[0] for m in met) / len(met) < 0.65  # each rule about half the time


def test_long_rules_are_read_at_one_or_two_positions_by_hand():
    rules = [
        ("include", ["owl"]),
        ("avoid", ["rice"]),
        ("start", ["gold"]),
        ("end", ["rose"]),
        ("before", ["fox", "pie"]),
        ("count", ["cat", 2]),
    ]
    gold = {"length": 12, "clauses": [{"kind": k, "args": a, "text": constraints.clause_text(k, a)} for k, a in rules]}
    ex = Example(id="x", split="train", messages=[{"role": "user", "content": "?"}], gold=gold)
    task = get_task("gym-long", num_clauses=6)
    words = "gold 7 owl 3 cat 9 fox 11 cat pie 5 rose".split()
    assert [v(" ".join(words), ex) for v in task.verifiers()] == [1.0] * 6
    assert task.relevant_positions(ex, words) == {
        "c1": [2],
        "c2": [],
        "c3": [0],
        "c4": [11],
        "c5": [6, 9],
        "c6": [4, 8],
    }
    broken = "7 7 pie 3 rice 9 fox 11 cat rice 5 8".split()  # no owl, rice twice, wrong ends, pie first, one cat
    assert [v(" ".join(broken), ex) for v in task.verifiers()] == [0.0] * 6
    truth = task.relevant_positions(ex, broken)
    assert truth == {"c1": [], "c2": [4, 9], "c3": [0], "c4": [11], "c5": [2, 6], "c6": [8]}


def test_long_prompts_have_3_to_6_rules_and_long_filler_responses():
    task = get_task("gym-long")
    assert (task.settings.num_clauses, task.settings.length, task.max_new_tokens) == (4, 64, 88)
    assert get_task("gym-long", length=128).max_new_tokens == 168
    rng = random.Random(0)
    counts, lengths, filler, rule_positions = set(), [], 0, []
    for _ in range(200):
        ex = task.warm_example(rng)  # the warm start's mixture: 3-6 rules, 64 or 128 words
        counts.add(len(ex.gold["clauses"]))
        _, words = task.demonstration(ex, rng)
        lengths.append((ex.gold["length"], len(words)))
        filler += sum(w in long.FILLER for w in words)
        rule_positions.append(
            sum(len(constraints.relevant_positions(r["kind"], r["args"], words)) for r in ex.gold["clauses"])
        )
    assert counts == {3, 4, 5, 6}
    assert all(abs(n - length) <= long.LENGTH_JITTER for length, n in lengths)
    assert {length for length, _ in lengths} == {64, 128}
    assert filler / sum(n for _, n in lengths) > 0.9  # almost every token is filler no reward reads
    assert max(rule_positions) <= 2 * 6 and sum(rule_positions) / len(rule_positions) < 8
    with pytest.raises(ValueError, match="num_clauses"):
        get_task("gym-long", num_clauses=7).load("train", 1)
