"""Training-prompt generator: determinism, conflicts, evidence layout, anchors, base tasks."""

from __future__ import annotations

import itertools
import random
import re
from collections import Counter

import pytest

from mrtpo.tasks.instructions import checkers, data, nltk_data, pools
from mrtpo.tasks.instructions.generate import (
    TEMPLATES,
    TOPICS,
    GeneratorConfig,
    base_tasks,
    build_prompt,
    generate,
    generate_one,
)


@pytest.fixture(scope="module")
def big() -> dict[str, list]:
    """A few hundred examples per pool, with and without anchors (shared by the tests)."""
    return {
        "ifeval": generate(400, GeneratorConfig(seed=11)),
        "ifbench": generate(400, GeneratorConfig(seed=14, pool="ifbench")),
        "all": generate(400, GeneratorConfig(seed=12, pool="all", anchor=("min_words",))),
        "ifbench_anchored": generate(300, GeneratorConfig(seed=13, pool="ifbench", anchor=("min_words", "keywords"))),
    }


def _as_plain(examples) -> list:
    return [(e.id, e.messages, e.gold, e.meta) for e in examples]


def test_reproducible_by_seed_and_index() -> None:
    cfg = GeneratorConfig(seed=5, pool="all", anchor=("keywords",))
    a = generate(30, cfg)
    assert _as_plain(a) == _as_plain(generate(30, cfg))
    # example i does not depend on the others, nor on the global random state
    random.seed(123)
    assert _as_plain([generate_one(17, cfg)]) == _as_plain([a[17]])
    assert _as_plain(generate(5, cfg, start=10)) == _as_plain(a[10:15])
    state = random.getstate()
    generate(5, cfg)
    assert random.getstate() == state
    # another seed gives other prompts
    b = generate(30, GeneratorConfig(seed=6, pool="all", anchor=("keywords",)))
    assert sum(x.messages == y.messages for x, y in zip(a, b)) < 3


def test_conflicting_pairs_never_co_occur(big) -> None:
    n_pairs = 0
    for examples in big.values():
        for e in examples:
            cs = e.gold["constraints"]
            base = e.meta["base_task"]
            for x, y in itertools.combinations(cs, 2):
                n_pairs += 1
                assert not pools.conflicts(x, y, base), (e.id, x["id"], y["id"])
                assert (x["benchmark"], x["id"]) != (y["benchmark"], y["id"])
    assert n_pairs > 1000
    # and the rule is not vacuous: IFEval's own table forbids some pairs we do draw from
    assert pools.class_conflict(("ifeval", "detectable_format:json_format"), ("ifeval", "punctuation:no_comma"))
    assert pools.class_conflict(("ifeval", "change_case:english_lowercase"), ("ifeval", "change_case:english_capital"))
    assert pools.class_conflict(("ifeval", "punctuation:no_comma"), ("ifbench", "count:punctuation"))
    assert not pools.class_conflict(("ifeval", "punctuation:no_comma"), ("ifeval", "detectable_content:postscript"))


def test_keyword_rules() -> None:
    forbid = {"id": "keywords:forbidden_words", "kwargs": {"forbidden_words": ["rain", "cloud"]}}
    need = {"id": "keywords:existence", "kwargs": {"keywords": ["Rain", "sun"]}}
    other = {"id": "keywords:existence", "kwargs": {"keywords": ["sun", "moon"]}}
    end = {"id": "startend:end_checker", "kwargs": {"end_phrase": "Any other questions?"}}
    assert pools.kwargs_conflict(forbid, need) and pools.kwargs_conflict(need, forbid)
    assert not pools.kwargs_conflict(forbid, other)
    assert pools.kwargs_conflict(need, other)  # both require "sun"
    assert pools.kwargs_conflict({"kwargs": {"forbidden_words": ["questions"]}}, end)
    rep = {"id": "combination:repeat_prompt", "kwargs": {"prompt_to_repeat": "x"}}
    assert pools.kwargs_conflict(forbid, rep, base_task="Write about rain.")
    assert not pools.kwargs_conflict(forbid, rep, base_task="Write about snow.")


def test_evidence_sentences_are_unique_and_removable(big) -> None:
    for examples in big.values():
        for e in examples:
            prompt = e.messages[0]["content"]
            assert prompt == e.gold["prompt"]
            cs = e.gold["constraints"]
            base = e.meta["base_task"]
            assert prompt == build_prompt(base, [c["sentence"] for c in cs])
            assert prompt.count(base) == 1 and prompt.startswith(base)
            for c in cs:
                assert prompt.count(c["sentence"]) == 1
                removed = prompt.replace(c["sentence"], "", 1)
                # the base task and every other sentence survive, each exactly once
                assert removed.startswith(base + "\n\n") and removed.count(base) == 1
                for o in cs:
                    if o is not c:
                        assert removed.count(o["sentence"]) == 1
                assert c["sentence"] not in removed


def test_records_rebuild_their_sentences(big) -> None:
    for e in big["all"][:150]:
        for c in e.gold["constraints"]:
            assert set(c) == {"benchmark", "id", "kwargs", "sentence", "anchor"}
            assert checkers.describe(c["benchmark"], c["id"], c["kwargs"]) == c["sentence"]
    # the library can draw "Paragraph n+1" of an n-paragraph answer; such draws are rejected
    nth = [
        c["kwargs"]
        for ex in big.values()
        for e in ex
        for c in e.gold["constraints"]
        if c["id"] == "length_constraints:nth_paragraph_first_word"
    ]
    assert len(nth) > 10
    assert all(1 <= k["nth_paragraph"] <= k["num_paragraphs"] for k in nth)


def test_counts_and_pool_coverage(big) -> None:
    counts = Counter(len(e.gold["constraints"]) for e in big["ifeval"])
    assert set(counts) == {1, 2, 3, 4, 5}
    assert all(counts[k] > 30 for k in counts)
    assert all(len(e.gold["constraints"]) <= e.meta["target_constraints"] for e in big["ifeval"])
    # every class of a pool is actually drawn (so the per-class tests cover what training uses),
    # except those that conflict with an anchor
    for name, examples in big.items():
        cfg = GeneratorConfig(
            **{**examples[0].meta["generator"], "anchor": tuple(examples[0].meta["generator"]["anchor"])}
        )
        anchor_keys = {
            "min_words": ("ifeval", "length_constraints:number_words"),
            "keywords": ("ifeval", "keywords:existence"),
        }
        anchors = {anchor_keys[a] for a in cfg.anchor}
        expected = {k for k in pools.pool(cfg.pool) if not any(pools.class_conflict(k, a) for a in anchors)} | anchors
        drawn = {(c["benchmark"], c["id"]) for e in examples for c in e.gold["constraints"]}
        assert drawn == expected, (name, expected ^ drawn)
    # the ifeval pool never draws IFBench classes
    assert all(c["benchmark"] == "ifeval" for e in big["ifeval"] for c in e.gold["constraints"])


def test_anchors_are_always_present(big) -> None:
    for e in big["all"]:
        floors = [c for c in e.gold["constraints"] if c["anchor"] == "min_words"]
        assert len(floors) == 1
        kw = floors[0]["kwargs"]
        assert floors[0]["id"] == "length_constraints:number_words"
        assert kw["relation"] == "at least" and 40 <= kw["num_words"] <= 120
        # no other length constraint can undercut the floor
        assert not any(c["id"] in ("count:word_count_range", "count:unique_word_count") for c in e.gold["constraints"])
    for e in big["ifbench_anchored"]:
        anchors = sorted(c["anchor"] for c in e.gold["constraints"] if c["anchor"])
        assert anchors == ["keywords", "min_words"]
        assert len(e.gold["constraints"]) >= 2
    # a degenerate answer now fails the floor
    e = big["all"][0]
    floor = next(c for c in e.gold["constraints"] if c["anchor"])
    assert not checkers.check_strict("ifeval", floor["id"], floor["kwargs"], "Ok.", "")


def test_word_budget_caps_length_demands() -> None:
    ex = generate(200, GeneratorConfig(seed=3, pool="all", word_budget=60))
    for e in ex:
        for c in e.gold["constraints"]:
            kw = c["kwargs"]
            if c["id"] == "length_constraints:number_words" and kw["relation"] == "at least":
                assert kw["num_words"] <= 60
            if c["id"] == "count:word_count_range":
                assert kw["min_words"] <= 60
            if c["id"] == "count:unique_word_count":
                assert kw["N"] <= 60


def test_config_errors() -> None:
    with pytest.raises(ValueError, match="min_constraints"):
        GeneratorConfig(min_constraints=0)
    with pytest.raises(ValueError, match="max_constraints"):
        GeneratorConfig(max_constraints=6)
    with pytest.raises(ValueError, match="anchor"):
        GeneratorConfig(anchor=("length",))
    with pytest.raises(ValueError, match="pool"):
        GeneratorConfig(pool="everything")
    with pytest.raises(ValueError, match="word_budget"):
        GeneratorConfig(anchor=("min_words",), word_budget=50)
    assert GeneratorConfig(anchor="min_words").anchor == ("min_words",)


def test_pools_and_exclusions_partition_the_registries() -> None:
    for bench in checkers.BENCHMARKS:
        every = {(bench, i) for i in checkers.registry(bench)}
        in_pool = {k for k in pools.pool(bench)}
        excluded = {k for k in pools.EXCLUDED if k[0] == bench}
        assert in_pool | excluded == every and not in_pool & excluded
    assert len(pools.pool("ifeval")) == 24 and len(pools.pool("ifbench")) == 23
    assert all(reason.strip() for reason in pools.EXCLUDED.values())
    # extra conflicts only name real classes
    for pair in pools.EXTRA_CONFLICTS:
        for bench, cid in pair:
            assert cid in checkers.registry(bench)


def test_base_tasks_are_not_eval_prompts() -> None:
    tasks = base_tasks()
    assert len(tasks) == len(set(tasks)) == len(TOPICS) * len(TEMPLATES) == 960
    assert not any("," in t for t in tasks)  # keeps "repeat the request" + "no commas" satisfiable
    eval_prompts = [e.gold["prompt"].lower() for e in data.load_ifeval()]
    eval_prompts += [e.gold["prompt"].lower() for e in data.load_ifbench()]
    words = lambda s: re.findall(r"[a-z']+", s)  # noqa: E731
    stop = set(nltk_data.stopwords())
    eval_words = [set(words(p)) for p in eval_prompts]
    for t in tasks:
        assert not any(t.lower() in p for p in eval_prompts), t
        # no eval prompt contains all the content words of a base task (topic and task kind):
        # generic openings like "write a blog post about" are shared, the subject never is
        content = set(words(t.lower())) - stop
        assert not any(content <= w for w in eval_words), t
