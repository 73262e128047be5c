"""The instructions task's ``classes`` setting: prompts restricted to chosen constraint classes, and a
held-out split of the same classes."""

from __future__ import annotations

from collections import Counter

import pytest

from mrtpo.tasks.instructions import pools
from mrtpo.tasks.instructions.generate import GeneratorConfig, generate
from mrtpo.tasks.instructions.task import HELD_OUT_START, InstructionsTask

THREE = ("keywords:existence", "keywords:forbidden_words", "detectable_content:postscript")


def test_restricted_prompts_carry_only_the_named_classes():
    examples = generate(40, GeneratorConfig(seed=3, min_constraints=3, max_constraints=3, classes=THREE))
    counts = Counter(c["id"] for e in examples for c in e.gold["constraints"])
    assert set(counts) <= set(THREE)
    # three compatible classes and three slots: every prompt has each class exactly once
    assert all(sorted(c["id"] for c in e.gold["constraints"]) == sorted(THREE) for e in examples)
    assert counts == {cid: 40 for cid in THREE}


def test_local_names_the_few_position_classes_and_unrestricted_streams_are_unchanged():
    cfg = GeneratorConfig(seed=1, classes="local")
    assert cfg.classes == pools.LOCAL_CLASSES
    assert all(("ifeval", cid) in pools.pool("ifeval") for cid in pools.LOCAL_CLASSES)
    seen = {c["id"] for e in generate(60, cfg) for c in e.gold["constraints"]}
    assert seen <= set(pools.LOCAL_CLASSES) and len(seen) >= 5
    # no restriction: the same prompts as a config that never heard of the setting
    plain = [e.gold["prompt"] for e in generate(5, GeneratorConfig(seed=1))]
    assert plain == [e.gold["prompt"] for e in generate(5, GeneratorConfig(seed=1, classes=()))]


def test_bad_classes_are_errors():
    with pytest.raises(ValueError, match="not in constraint pool"):
        GeneratorConfig(classes=("count:numbers",))  # an IFBench class, not in the ifeval pool
    with pytest.raises(ValueError, match="repeat"):
        GeneratorConfig(classes=("local", "keywords:existence"))
    with pytest.raises(ValueError, match="min_constraints=3"):
        GeneratorConfig(min_constraints=3, max_constraints=3, classes=THREE[:2])


def test_task_setting_and_held_out_split():
    task = InstructionsTask(train_size=8, seed=2, min_constraints=3, max_constraints=3, classes=list(THREE))
    train, held = task.load("train"), task.load("eval", limit=6)
    assert len(train) == 8 and len(held) == 6
    assert held[0].id.endswith(f"{HELD_OUT_START:06d}") and not {e.id for e in train} & {e.id for e in held}
    assert all({c["id"] for c in e.gold["constraints"]} == set(THREE) for e in held)

    def answer(example, with_keywords):  # the keywords (or not), then a P.S. block with the example's marker
        kw = {c["id"]: c["kwargs"] for c in example.gold["constraints"]}
        words = " ".join(kw["keywords:existence"]["keywords"]) if with_keywords else "nothing"
        return f"Here is {words}.\n\n{kw['detectable_content:postscript']['postscript_marker']} fine"

    scores = task.evaluate([answer(e, i % 2 == 0) for i, e in enumerate(held)], held)
    per = {k: v["strict"] for k, v in scores["per_instruction"].items()}
    assert per == {
        "ifeval/detectable_content:postscript": 1.0,
        "ifeval/keywords:existence": 0.5,
        "ifeval/keywords:forbidden_words": 1.0,
    }
    assert InstructionsTask(train_size=2).load("eval", limit=1)[0].id != held[0].id  # unrestricted: IFEval
