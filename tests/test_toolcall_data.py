"""BFCL loading, splits, order, prompts and the evidence contract of the toolcall task."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from mrtpo.tasks import get_task
from mrtpo.tasks.toolcall import FORMAT_INSTRUCTION, ToolCallTask, render_prompt
from mrtpo.tasks.toolcall.bfcl_shim import data_dir
from mrtpo.tasks.toolcall.prompt import plain_prompt
from mrtpo.verifiers import Example

JSON_SCHEMA_TYPES = {"object", "number", "integer", "string", "boolean", "array"}


def _file_entries(category: str, answers: bool = False) -> list[dict]:
    folder = data_dir() / "possible_answer" if answers else data_dir()
    with open(folder / f"BFCL_v4_{category}.json", encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


@pytest.fixture(scope="module")
def task() -> ToolCallTask:
    return ToolCallTask()


@pytest.fixture(scope="module")
def train(task) -> list[Example]:
    return task.load("train")


@pytest.fixture(scope="module")
def evals(task) -> list[Example]:
    return task.load("eval")


def test_registered_under_toolcall():
    assert isinstance(get_task("toolcall"), ToolCallTask)


def test_split_sizes_match_the_bfcl_files(train, evals):
    eval_sizes = {
        c: len(_file_entries(c)) for c in ("simple_python", "multiple", "parallel", "parallel_multiple", "irrelevance")
    }
    assert eval_sizes == {
        "simple_python": 400,
        "multiple": 200,
        "parallel": 200,
        "parallel_multiple": 200,
        "irrelevance": 240,
    }
    assert Counter(e.meta["category"] for e in evals) == eval_sizes
    train_sizes = Counter(e.meta["category"] for e in train)
    # one live_multiple question duplicates an eval question and is dropped (see next test)
    assert train_sizes["live_simple"] == len(_file_entries("live_simple")) == 258
    assert train_sizes["live_multiple"] == len(_file_entries("live_multiple")) - 1 == 1052
    assert {e.split for e in train} == {"train"} and {e.split for e in evals} == {"eval"}


def test_no_overlap_between_train_and_eval(train, evals):
    assert not {e.id for e in train} & {e.id for e in evals}

    def question(e: Example) -> str:
        text = " ".join(m["content"] for m in e.messages if m["role"] == "user")
        return " ".join(text.lower().split())

    assert not {question(e) for e in train} & {question(e) for e in evals}
    dup = "find out the rewards for playing fortnite on playstation platform"
    assert any(dup in e.messages[-1]["content"].lower() for e in evals)
    assert not any(dup in e.messages[-1]["content"].lower() for e in train)


def test_order_is_deterministic_file_ordered_and_spread(task, evals):
    again = ToolCallTask().load("eval")
    assert [e.id for e in again] == [e.id for e in evals]
    for category in ("simple_python", "parallel", "irrelevance"):
        ids = [e.id for e in evals if e.meta["category"] == category]
        assert ids == [entry["id"] for entry in _file_entries(category)]
    head = task.load("eval", limit=32)
    assert [e.id for e in head] == [e.id for e in evals[:32]]
    counts = Counter(e.meta["category"] for e in head)
    assert set(counts) == {"simple_python", "multiple", "parallel", "parallel_multiple", "irrelevance"}
    assert counts["simple_python"] == max(counts.values())  # proportional: the largest category
    assert task.load("eval", limit=0) == []


def test_messages_tools_and_gold(evals, train):
    answers = {a["id"]: a["ground_truth"] for a in _file_entries("parallel_multiple", answers=True)}
    questions = {q["id"]: q for q in _file_entries("parallel_multiple")}
    for e in evals:
        assert e.messages[0]["role"] == "system" and e.messages[-1]["role"] == "user"
        assert e.tools and all(t["type"] == "function" for t in e.tools)
        if e.meta["category"] == "parallel_multiple":
            q = questions[e.id]
            assert e.messages[1:] == q["question"][0]
            assert e.gold["ground_truth"] == answers[e.id]  # full acceptable sets kept
            assert [t["function"]["name"] for t in e.tools] == [f["name"] for f in q["function"]]
            assert e.meta["functions"] == q["function"]
        if e.meta["category"] == "irrelevance":
            assert e.gold["ground_truth"] == [] and e.gold["expects_call"] is False

    def types(node, out):
        if isinstance(node, dict):
            if isinstance(node.get("type"), str):
                out.add(node["type"])
            for key in ("properties",):
                for sub in (node.get(key) or {}).values():
                    types(sub, out)
            if isinstance(node.get("items"), dict):
                types(node["items"], out)
        return out

    seen = set()
    for e in evals + train:
        for t in e.tools:
            types(t["function"]["parameters"], seen)
    assert seen <= JSON_SCHEMA_TYPES and {"object", "number", "array"} <= seen


def test_bfcl_system_messages_are_merged_into_ours(train):
    with_system = {
        q["id"]: q["question"][0][0]["content"]
        for q in _file_entries("live_simple")
        if q["question"][0][0]["role"] == "system"
    }
    assert with_system
    for e in train:
        if e.id in with_system:
            assert [m["role"] for m in e.messages] == ["system", "user"]
            assert e.messages[0]["content"].endswith("\n\n" + with_system[e.id])
            assert e.messages[0]["content"].count(FORMAT_INSTRUCTION) == 1


def test_format_evidence_occurs_exactly_once_and_correctness_evidence_is_hidden(task, train, evals):
    fmt, corr = task.verifiers()
    for e in train + evals:
        ev = fmt.evidence(e)
        assert ev.placement == "in_prompt" and ev.text == FORMAT_INSTRUCTION
        prompt = render_prompt(e)
        assert prompt.count(ev.text) == 1
        assert sum(m["content"].count(ev.text) for m in e.messages) == 1
        priv = corr.evidence(e)
        assert priv.placement == "privileged" and priv.text not in prompt


def _chatml_tokenizer():
    """A real transformers tokenizer with a small ChatML template written for this test."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    raw = Tokenizer(models.WordLevel({"[UNK]": 0, "hi": 1}, unk_token="[UNK]"))
    raw.pre_tokenizer = pre_tokenizers.Whitespace()
    tok = PreTrainedTokenizerFast(tokenizer_object=raw, unk_token="[UNK]")
    tok.chat_template = (
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    return tok


def test_render_prompt_with_template_and_fallbacks(evals):
    e = evals[0]
    tok = _chatml_tokenizer()
    prompt = render_prompt(e, tok)
    assert prompt.startswith("<|im_start|>system\n") and prompt.endswith("<|im_start|>assistant\n")
    assert prompt.count(FORMAT_INSTRUCTION) == 1
    assert e.messages[-1]["content"] in prompt

    class NoTemplate:
        chat_template = None

    assert render_prompt(e, None) == render_prompt(e, NoTemplate()) == plain_prompt(e.messages)
    assert render_prompt(e).endswith("Assistant:\n")

    class SystemRejecting:  # like templates that raise "System role not supported"
        chat_template = "x"

        def apply_chat_template(self, messages, tokenize, add_generation_prompt):
            if messages[0]["role"] == "system":
                raise ValueError("System role not supported")
            return "|".join(m["role"] + ":" + m["content"] for m in messages)

    folded = render_prompt(e, SystemRejecting())
    assert folded.startswith("user:") and folded.count(FORMAT_INSTRUCTION) == 1


def test_removing_the_evidence_removes_the_format_instruction(evals):
    tok = _chatml_tokenizer()
    for e in evals[:50]:
        stripped = Example(e.id, e.split, [dict(m) for m in e.messages], e.gold, e.tools, e.meta)
        stripped.messages[0]["content"] = stripped.messages[0]["content"].replace(FORMAT_INSTRUCTION, "")
        prompt = render_prompt(stripped, tok)
        assert "<tool_call>" not in prompt and "</tool_call>" not in prompt
        assert "<tools>" in prompt and e.messages[-1]["content"] in prompt


def test_bad_arguments_fail_clearly(task):
    with pytest.raises(ValueError, match="unknown split"):
        task.load("test")
    with pytest.raises(ValueError, match="both train and eval"):
        ToolCallTask(train_categories=("live_simple", "multiple"))
    with pytest.raises(ValueError, match="unknown BFCL category"):
        ToolCallTask(eval_categories=("simple_java",))


@pytest.mark.slow
def test_real_qwen_template_renders_our_instruction_once():
    """With Qwen2.5-Coder's own chat template: no template tools section, one instruction."""
    from mrtpo.models import load_policy

    _, tok = load_policy("qwen2.5-coder-0.5b")
    for e in ToolCallTask().load("eval", limit=40):
        prompt = render_prompt(e, tok)
        assert prompt.count(FORMAT_INSTRUCTION) == 1
        assert "For each function call" not in prompt  # the template's own instruction is absent
        assert prompt.startswith("<|im_start|>system\nYou are an expert in composing function calls.")
        stripped = [dict(m) for m in e.messages]
        stripped[0]["content"] = stripped[0]["content"].replace(FORMAT_INSTRUCTION, "")
        cf = render_prompt(Example(e.id, e.split, stripped, e.gold, e.tools, e.meta), tok)
        assert "<tool_call>" not in cf and cf == prompt.replace(FORMAT_INSTRUCTION, "")
