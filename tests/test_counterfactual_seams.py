"""Counterfactual prompts of the three tasks: removing a span takes its separator with it.

For every in_prompt evidence of every task, the counterfactual must equal the prompt rendered from
messages written without that span, through both paths that build it: the library's
``counterfactual.counterfactual_prompt`` and the trainer's ``MRTPOTrainer._counterfactual_texts``
(:mod:`mrtpo.replay_plan`).
"""

import re

import pytest
from datasets import Dataset

from mrtpo.counterfactual import counterfactual_prompt, cut, prompt_renderer
from mrtpo.replay_plan import plan_group
from mrtpo.rewards import VerifierReward
from mrtpo.tasks import get_task
from mrtpo.testing import tiny_policy
from mrtpo.trainer import MRTPOConfig, MRTPOTrainer

LEADING_BLANK = re.compile(r"<\|im_start\|>\w+\n\s")


@pytest.mark.parametrize(
    "text, span, expected",
    [
        ("A\nS\nB", "S", "A\nB"),
        ("A\n\nS\nB", "S", "A\n\nB"),  # the first of a list after a blank line: the blank line stays
        ("A\nS\n\nB", "S", "A\n\nB"),
        ("A. S B", "S", "A. B"),
        ("A\n\nS", "S", "A"),  # at the end: the separator before it goes
        ("S\n\nB", "S", "B"),  # at the start: the separator after it goes
        ("S", "S", ""),
        ("A(S)B", "S", "A()B"),  # no separator on either side: nothing else changes
    ],
)
def test_cut_keeps_the_stronger_separator(text, span, expected):
    start = text.index(span)
    assert cut(text, start, start + len(span)) == expected


def check_seams(original: str, cf: str) -> None:
    """No seam the removal introduced: a turn ending in a newline, a turn starting with whitespace,
    a triple newline (counted against the original, whose own text may have them)."""
    for pattern in ("\n<|im_end|>", "\n\n\n"):
        assert cf.count(pattern) <= original.count(pattern), pattern
    assert len(LEADING_BLANK.findall(cf)) <= len(LEADING_BLANK.findall(original))


def without(messages, index, old, new=""):
    """``messages`` with ``old`` replaced by ``new`` in message ``index`` (exactly once)."""
    assert messages[index]["content"].count(old) == 1
    out = [dict(m) for m in messages]
    out[index]["content"] = out[index]["content"].replace(old, new)
    return out


@pytest.fixture(scope="module")
def tok():
    return tiny_policy(seed=0)[1]


def trainer_for(task, examples, tmp_path):
    """A real MRTPOTrainer over ``examples`` (its start-up check builds every counterfactual)."""
    model, tok = tiny_policy(seed=0, max_position_embeddings=8192)
    by_id = {ex.id: ex for ex in examples}
    rewards = [VerifierReward(v, by_id) for v in task.verifiers()]
    rows = Dataset.from_list([{"prompt": ex.messages, "example_id": ex.id} for ex in examples])
    args = MRTPOConfig(
        output_dir=str(tmp_path),
        use_cpu=True,
        bf16=False,
        activation_checkpointing=False,
        report_to=[],
        per_device_train_batch_size=2,
        num_generations=2,
        max_steps=1,
    )
    return MRTPOTrainer(model=model, processing_class=tok, reward_funcs=rewards, args=args, train_dataset=rows)


def both_paths(task, examples, tok, tmp_path):
    """``{(example id, verifier name): (original, library counterfactual, trainer counterfactual)}``."""
    trainer = trainer_for(task, examples, tmp_path)
    render = prompt_renderer(task, tok)
    out = {}
    for ex in examples:
        original = render(ex)
        assert trainer._render(ex.messages) == original
        verifiers = task.verifiers()
        for i, verifier in enumerate(verifiers):
            ev = verifier.evidence(ex)
            if ev is None or ev.placement != "in_prompt":
                continue
            lib = counterfactual_prompt(ex, [ev], render, verifiers=[verifier.name])
            alone = [ev if k == i else None for k in range(len(verifiers))]
            (ours,) = trainer._counterfactual_texts(
                {"prompt": ex.messages, "example_id": ex.id},
                plan_group([0], alone, [True] * len(verifiers), "per_reward"),
            )
            assert ours == lib
            out[ex.id, verifier.name] = original, lib
    return out


def test_toolcall_format_sentence(tok, tmp_path):
    from mrtpo.tasks.toolcall.prompt import FORMAT_INSTRUCTION

    task = get_task("toolcall")
    examples = task.load("train", limit=40)
    # BFCL items that bring their own system message: the format sentence is then not last.
    examples += [
        ex
        for ex in task.load("eval")
        if ex.messages[0]["content"].count("\n\n") > examples[0].messages[0]["content"].count("\n\n")
    ][:5]
    render = prompt_renderer(task, tok)
    ends, inside = 0, 0
    for (ex_id, name), (original, cf) in both_paths(task, examples, tok, tmp_path).items():
        ex = next(e for e in examples if e.id == ex_id)
        system = ex.messages[0]["content"]
        assert name == "format"
        check_seams(original, cf)
        ends += system.endswith(FORMAT_INSTRUCTION)
        inside += not system.endswith(FORMAT_INSTRUCTION)
        # the system message written without the sentence (and the blank line before it)
        expected = render(type(ex)(**{**ex.__dict__, "messages": without(ex.messages, 0, "\n\n" + FORMAT_INSTRUCTION)}))
        assert cf == expected
    assert ends >= 30 and inside >= 1  # both seams are exercised


def test_sql_schema_and_format_sentence(tok, tmp_path):
    from mrtpo.tasks.sql.prompt import FORMAT_INSTRUCTION

    task = get_task("sql")
    examples = task.load("train", limit=4)
    render = prompt_renderer(task, tok)
    seen = set()
    for (ex_id, name), (original, cf) in both_paths(task, examples, tok, tmp_path).items():
        ex = next(e for e in examples if e.id == ex_id)
        check_seams(original, cf)
        user = next(i for i, m in enumerate(ex.messages) if m["role"] == "user")
        if name == "format":
            messages = without(ex.messages, user, "\n\n" + FORMAT_INSTRUCTION)
        else:
            assert name == "executes"
            schema = ex.messages[user]["content"].split("\n\nQuestion: ")[0]
            messages = without(ex.messages, user, schema + "\n\n")
            assert messages[user]["content"].startswith("Question: ")
        assert cf == render(type(ex)(**{**ex.__dict__, "messages": messages}))
        seen.add(name)
    assert seen == {"format", "executes"}


def test_instructions_counterfactual_is_the_prompt_built_without_the_constraint(tok, tmp_path):
    from mrtpo.tasks.instructions.generate import build_prompt

    task = get_task("instructions", train_size=12, min_constraints=1, max_constraints=4)
    examples = task.load("train")
    render = prompt_renderer(task, tok)
    positions = set()
    pairs = both_paths(task, examples, tok, tmp_path)
    for ex in examples:
        sentences = [c["sentence"] for c in ex.gold["constraints"]]
        for k, sentence in enumerate(sentences):
            original, cf = pairs[ex.id, f"constraint_{k + 1}"]
            check_seams(original, cf)
            rest = sentences[:k] + sentences[k + 1 :]
            built = [{"role": "user", "content": build_prompt(ex.meta["base_task"], rest)}]
            assert cf == render(type(ex)(**{**ex.__dict__, "messages": built}))
            positions.add(
                "only"
                if len(sentences) == 1
                else "first"
                if k == 0
                else "last"
                if k == len(sentences) - 1
                else "middle"
            )
    assert positions == {"only", "first", "middle", "last"}


def test_joint_counterfactual_and_string_prompts(tok):
    """Several spans at once; a span across two messages falls back to the rendered string."""
    from mrtpo.counterfactual import counterfactual_text
    from mrtpo.verifiers import Evidence

    render = lambda msgs: tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)  # noqa: E731
    msgs = [
        {"role": "system", "content": "Be kind.\n\nRule one."},
        {"role": "user", "content": "Task.\n\nRule two.\nRule three."},
    ]
    cf = counterfactual_text(msgs, [Evidence("Rule one.", "in_prompt"), Evidence("Rule three.", "in_prompt")], render)
    assert cf == render([{"role": "system", "content": "Be kind."}, {"role": "user", "content": "Task.\n\nRule two."}])
    across = "Rule one.<|im_end|>\n<|im_start|>user\nTask."
    cf = counterfactual_text(msgs, [Evidence(across, "in_prompt")], render)
    assert cf == render(msgs).replace("\n\n" + across + "\n\n", "\n\n")
    assert (
        counterfactual_text(
            "Q? Answer briefly.",
            [Evidence("Answer briefly.", "in_prompt"), Evidence("42", "privileged")],
            render,
            "REF:",
        )
        == "Q?\n\nREF:\n42"
    )


def test_rewards_sharing_one_evidence_remove_it_once_in_the_joint_counterfactual():
    from mrtpo.counterfactual import counterfactual_text
    from mrtpo.verifiers import Evidence

    messages = [{"role": "user", "content": "Write a poem. Include the word cat at least twice. Be brief."}]
    shared = Evidence("Include the word cat at least twice.", "in_prompt")
    render = lambda m: m[0]["content"]  # noqa: E731
    joint = counterfactual_text(messages, [shared, shared], render, verifiers=["once", "twice"])
    assert joint == counterfactual_text(messages, [shared], render) == "Write a poem. Be brief."
