"""Tool-calling prompts: the ``format`` evidence is the whole call-format instruction as rendered,
removing it (through the replay's own counterfactual) leaves no other ``<tool_call>`` instruction and
the rest intact, a missing or duplicated instruction is a clear error, and evaluation renders
exactly as training does."""

from __future__ import annotations

import dataclasses

import pytest

from mrtpo.counterfactual import EvidenceNotFoundError, counterfactual_text
from mrtpo.tasks.toolcall import FORMAT_INSTRUCTION, ToolCallTask
from mrtpo.tasks.toolcall.prompt import FormatInstructionError, check_format_instruction
from mrtpo.testing import tiny_policy, tiny_tokenizer


@pytest.fixture(scope="module")
def task():
    return ToolCallTask()


@pytest.fixture(scope="module")
def examples(task):
    return task.load("train") + task.load("eval")


def _renderer(example, tok):
    """messages -> prompt string, for ``counterfactual_text``, through the task's checked rendering
    (as ``mrtpo.counterfactual.counterfactual_prompt`` does)."""
    return lambda messages: ToolCallTask.render_prompt(dataclasses.replace(example, messages=messages), tok)


def test_the_instruction_carries_its_example():
    assert FORMAT_INSTRUCTION.count("<tool_call>") == 3  # two in the prose, one opening the example
    example_line = FORMAT_INSTRUCTION.split("For example:\n<tool_call>\n")[1].split("\n</tool_call>")[0]
    assert example_line == '{"name": "lookup_word", "arguments": {"word": "harbor", "language": "en"}}'


def test_every_prompt_holds_the_instruction_once_and_its_removal_leaves_the_rest(task, examples):
    tok = tiny_tokenizer()
    fmt = task.verifiers()[0]
    with_bfcl_system = 0
    for e in examples:
        rendered = task.render_prompt(e, tok)  # checked rendering: raises if anything is off
        evidence = fmt.evidence(e)
        assert evidence.text == FORMAT_INSTRUCTION and evidence.placement == "in_prompt"
        assert rendered.count(evidence.text) == 1
        without = counterfactual_text(e.messages, [evidence], _renderer(e, tok), example_id=e.id)
        # exactly the instruction and the blank line before it are gone; nothing else changed
        assert without == rendered.replace("\n\n" + FORMAT_INSTRUCTION, "", 1)
        assert len(without) == len(rendered) - len(FORMAT_INSTRUCTION) - 2
        assert "<tool_call>" not in without and "</tool_call>" not in without
        assert "<tools>\n" in without and e.messages[-1]["content"] in without
        with_bfcl_system += "\n\n" + FORMAT_INSTRUCTION + "\n\n" in rendered
    assert with_bfcl_system == 48  # BFCL's own system text follows ours and survives the cut


def test_missing_duplicated_or_competing_instructions_are_clear_errors(task, examples):
    tok = tiny_tokenizer()
    e = examples[0]
    rendered = task.render_prompt(e, tok)
    with pytest.raises(FormatInstructionError, match="does not occur"):
        check_format_instruction(rendered.replace(FORMAT_INSTRUCTION, "Answer in JSON."), FORMAT_INSTRUCTION, e.id)
    with pytest.raises(FormatInstructionError, match="occurs 2 times"):
        check_format_instruction(rendered + FORMAT_INSTRUCTION, FORMAT_INSTRUCTION, e.id)
    # A chat template rendering tools= adds its own <tool_call> instruction outside our messages:
    # the checked rendering refuses it, since removing our instruction would leave that one.
    competing = tiny_tokenizer()
    competing.chat_template = competing.chat_template.replace(
        "'\\n</tools><|im_end|>\\n'", "'\\n</tools>\\nReturn each call in <tool_call></tool_call> tags.<|im_end|>\\n'"
    )
    templated = competing.apply_chat_template(e.messages, tools=e.tools, tokenize=False, add_generation_prompt=True)
    with pytest.raises(FormatInstructionError, match="outside the call-format instruction"):
        check_format_instruction(templated, FORMAT_INSTRUCTION, e.id)
    # a template that loses or mangles the instruction (here: escapes "<") is refused
    escaping = tiny_tokenizer()
    escaping.chat_template = escaping.chat_template.replace(
        "messages[0]['content'] + '<|im_end|>", "messages[0]['content'].replace('<', '&lt;') + '<|im_end|>"
    )
    with pytest.raises(FormatInstructionError, match="does not occur"):
        task.render_prompt(e, escaping)
    # the counterfactual (instruction removed) renders through the same checked path: allowed, and
    # refused if anything else in the prompt mentions <tool_call>
    bare = dataclasses.replace(e, messages=[{"role": "user", "content": e.messages[-1]["content"]}])
    assert "<tool_call>" not in task.render_prompt(bare, tok)
    chatty = dataclasses.replace(e, messages=[{"role": "user", "content": "Use <tool_call> tags. Hi"}])
    with pytest.raises(FormatInstructionError, match="outside the call-format instruction"):
        task.render_prompt(chatty, tok)
    twice = dataclasses.replace(e, messages=[{"role": "user", "content": FORMAT_INSTRUCTION * 2}])
    with pytest.raises(FormatInstructionError, match="2 times in the messages"):
        task.render_prompt(twice, tok)
    # messages without the instruction: the format reward's evidence and the replay both refuse
    with pytest.raises(ValueError, match="exactly once"):
        task.verifiers()[0].evidence(bare)
    with pytest.raises(EvidenceNotFoundError, match="does not occur"):
        from mrtpo.verifiers import Evidence

        counterfactual_text(bare.messages, [Evidence(FORMAT_INSTRUCTION, "in_prompt")], _renderer(bare, tok))


def test_the_correctness_counterfactual_renders_with_its_gold_calls(task, examples):
    """The ``correctness`` replay appends the gold calls, written in the instructed ``<tool_call>``
    form, under the privileged header: the checked rendering accepts that reference block, still
    holds the instruction once, and still refuses a ``<tool_call>`` anywhere else."""
    from mrtpo.counterfactual import DEFAULT_PRIVILEGED_HEADER, counterfactual_prompt

    tok = tiny_tokenizer()
    e = examples[0]
    evidence = task.verifiers()[1].evidence(e)
    assert evidence.placement == "privileged" and "<tool_call>" in evidence.text
    render = lambda ex: task.render_prompt(ex, tok)  # noqa: E731
    with_gold = counterfactual_prompt(e, [evidence], render, verifiers=["correctness"])
    assert with_gold.count(FORMAT_INSTRUCTION) == 1
    assert with_gold.index(DEFAULT_PRIVILEGED_HEADER) > with_gold.index(FORMAT_INSTRUCTION)
    assert evidence.text in with_gold
    messages = [dict(m) for m in e.messages]
    messages[0]["content"] += " Wrap calls in <tool_call> tags."
    with pytest.raises(FormatInstructionError, match="outside the call-format instruction"):
        counterfactual_prompt(dataclasses.replace(e, messages=messages), [evidence], render, verifiers=["correctness"])


def test_evaluation_renders_exactly_as_training(task, one_thread):
    """``mrtpo eval`` generates from the task's rendering, which is TRL's (no tools=) rendering."""
    from mrtpo.evaluate import evaluate_model

    model, tok = tiny_policy(seed=1, max_position_embeddings=8192)
    examples = task.load("eval", limit=2)
    _, gens = evaluate_model(model, tok, task, examples, batch_size=2, max_new_tokens=1, progress=False)
    for e, g in zip(examples, gens):
        trl = tok.apply_chat_template(e.messages, tokenize=False, add_generation_prompt=True)
        assert g.prompt == task.render_prompt(e, tok) == trl
