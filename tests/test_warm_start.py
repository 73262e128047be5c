"""The supervised warm start (mrtpo.warm_start): its data (training pairs only, rendered as RL renders
them, the user's JSONL shapes and their errors), its settings, TRL SFT on a tiny model, the cache,
and ``mrtpo sft``."""

from __future__ import annotations

import json

import pytest

from mrtpo import warm_start as ws
from mrtpo.tasks.toolcall import EVAL_CATEGORIES, TRAIN_CATEGORIES, ToolCallTask, canonical_gold, render_tool_calls
from mrtpo.testing import tiny_policy, tiny_tokenizer
from mrtpo.warm_start import WarmStartError, WarmStartSettings


@pytest.fixture(scope="module")
def task():
    return ToolCallTask()


def _pairs_file(tmp_path, n=8):
    """Short chat pairs: ask for a word, answer with it (learnable by a tiny model in a few steps)."""
    path = tmp_path / "pairs.jsonl"
    lines = [
        {"messages": [{"role": "user", "content": f"say {w}"}, {"role": "assistant", "content": w}]}
        for w in ["cat", "dog", "owl", "emu", "yak", "ant", "bee", "elk"][:n]
    ]
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return path


def test_toolcall_pairs_are_training_items_rendered_as_rl_renders_them(task):
    pairs = task.warm_start_pairs()
    assert len(pairs) == len(task.load("train")) == 1310  # every live item has a gold call
    assert {e.split for e, _ in pairs} == {"train"}
    assert {e.meta["category"] for e, _ in pairs} == set(TRAIN_CATEGORIES)
    eval_ids = {e.id for e in task.load("eval")}
    assert not eval_ids & {e.id for e, _ in pairs}
    assert not set(EVAL_CATEGORIES) & {e.meta["category"] for e, _ in pairs}
    tok = tiny_tokenizer()
    rows = ws.task_rows(task, tok, limit=5)
    for (example, answer), row in zip(pairs[:5], rows):
        assert row["id"] == example.id
        assert row["prompt"] == task.render_prompt(example, tok)  # what RL generates from
        gold = canonical_gold(example.gold["ground_truth"], example.meta["functions"])
        assert answer == render_tool_calls(gold)
        assert row["completion"] == answer + "<|im_end|>"  # the template's own end of turn
        assert task.verifiers()[0](answer, example) == 1.0  # the instructed form


def test_completion_for_and_its_errors():
    tok = tiny_tokenizer()
    messages = [{"role": "user", "content": "hi"}]
    prompt = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert ws.completion_for(tok, messages, prompt, "hello") == "hello<|im_end|>"
    with pytest.raises(WarmStartError, match="does not render the prompt as the start"):
        ws.completion_for(tok, messages, "<|im_start|>system\nX" + prompt, "hello")

    class NoTemplate:
        chat_template = None
        eos_token = "</s>"

    assert ws.completion_for(NoTemplate(), messages, "User: hi\nAssistant:", "hello") == "hello</s>"


def test_user_jsonl_shapes(tmp_path):
    tok = tiny_tokenizer()
    path = tmp_path / "d.jsonl"
    msgs = [{"role": "user", "content": "q"}]
    rendered = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    path.write_text(
        "\n".join(
            json.dumps(x)
            for x in [
                {"messages": [*msgs, {"role": "assistant", "content": "a1"}]},
                {"prompt": msgs, "completion": "a2"},
                {"prompt": msgs, "completion": [{"role": "assistant", "content": "a3"}]},
                {"prompt": "RAW PROMPT ", "completion": "a4"},
            ]
        )
        + "\n\n"
    )
    rows = ws.file_rows(path, tok)
    assert [(r["prompt"], r["completion"]) for r in rows] == [
        (rendered, "a1<|im_end|>"),
        (rendered, "a2<|im_end|>"),
        (rendered, "a3<|im_end|>"),
        ("RAW PROMPT ", "a4"),
    ]
    assert [r["id"] for r in rows] == ["d.jsonl:1", "d.jsonl:2", "d.jsonl:3", "d.jsonl:4"]
    assert len(ws.file_rows(path, tok, limit=2)) == 2


@pytest.mark.parametrize(
    "content, message",
    [
        (None, "does not exist"),
        ("", "holds no pairs"),
        ('{"messages": [}\n', "line 1: not valid JSON"),
        ("[1, 2]\n", "line 1: expected a JSON object"),
        ('{"text": "x"}\n', "line 1: unknown shape"),
        ('{"messages": [{"role": "user", "content": "q"}]}\n', "ending with an assistant turn"),
        (
            '{"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": " "}]}\n',
            "answer is empty",
        ),
        ('{"prompt": "p", "completion": ""}\n', "completion must be a non-empty string"),
        ('{"prompt": 3, "completion": "a"}\n', "prompt must be a rendered string"),
        ('\n{"prompt": "p", "completion": "a"}\n{"prompt": "", "completion": "a"}\n', "line 3: the prompt is empty"),
    ],
)
def test_bad_user_data_is_a_clear_error(tmp_path, content, message):
    path = tmp_path / "bad.jsonl"
    if content is not None:
        path.write_text(content)
    with pytest.raises(WarmStartError, match=message):
        ws.file_rows(path, tiny_tokenizer())


def test_fit_rows_leaves_out_long_pairs():
    tok = tiny_tokenizer()  # byte level: one token per byte
    rows = [{"prompt": "a" * 10, "completion": "b" * 5}, {"prompt": "a" * 30, "completion": "b"}]
    kept, dropped = ws.fit_rows(rows, tok, 16)
    assert kept == rows[:1] and dropped == 1
    with pytest.raises(WarmStartError, match="none of the 2 warm start pairs fits max_length=8"):
        ws.fit_rows(rows, tok, 8)


def test_settings_parsing_and_what_a_run_starts_from(tmp_path):
    default = ws.TASK_DEFAULTS["toolcall"]
    assert ws.parse_warm_start("auto", "toolcall") == (default, False)
    assert ws.parse_warm_start("auto", "sql") == (None, False)
    for off in (None, False, "none", "off", "no"):
        assert ws.parse_warm_start(off, "toolcall") == (None, True)
    assert ws.parse_warm_start(True, "toolcall") == (default, True)
    got, _ = ws.parse_warm_start({"steps": 3, "learning_rate": "2e-4"}, "toolcall")
    assert got.steps == 3 and got.learning_rate == 2e-4 and got.lora_r == default.lora_r
    got, _ = ws.parse_warm_start({"data": "x.jsonl"}, "sql")
    assert got.data == "x.jsonl"
    for bad, message in (
        (True, "has no default warm start data"),
        ("maybe", "must be auto, none"),
        ({"stepz": 3}, "unknown setting"),
        ({"steps": -1}, "steps must be"),
        ({"steps": 2}, "has no warm start data of its own"),
        (3, "must be auto, none"),
    ):
        with pytest.raises(WarmStartError, match=message):
            ws.parse_warm_start(bad, "sql" if bad in (True, {"steps": 2}) else "toolcall")
    # auto: on for the default model (the default dose was measured there), off for other models
    assert ws.resolve_for_run("auto", "toolcall", "qwen2.5-coder-0.5b")[0] == default
    for other in (str(tmp_path), "smollm2-135m"):
        settings, why = ws.resolve_for_run("auto", "toolcall", other)
        assert settings is None and "off for model" in why
    assert ws.resolve_for_run(True, "toolcall", "smollm2-135m")[0] == default
    assert ws.resolve_for_run({"steps": 2}, "toolcall", str(tmp_path))[0].steps == 2
    assert ws.resolve_for_run("none", "toolcall", "qwen2.5-coder-0.5b") == (None, "warm start: off (warm_start: none)")
    assert ws.resolve_for_run("auto", "sql", "qwen2.5-coder-0.5b") == (None, "")


def test_config_section(tmp_path):
    from mrtpo.config import ConfigError, load_config

    config = load_config([], {"task": "toolcall", "output_dir": str(tmp_path / "r")})
    steps = ws.TASK_DEFAULTS["toolcall"].steps
    assert config.run.warm_start == "auto" and any(f"warm start: {steps} LoRA SFT steps" in n for n in config.notes)
    config = load_config([], {"task": "toolcall", "output_dir": str(tmp_path / "r"), "warm_start": None})
    assert any("warm start: off" in n for n in config.notes)
    yaml_file = tmp_path / "c.yaml"
    yaml_file.write_text("task: toolcall\nwarm_start:\n  steps: 4\n  learning_rate: 5e-5\n")
    assert load_config([yaml_file], {"output_dir": str(tmp_path / "r")}).run.warm_start == {
        "steps": 4,
        "learning_rate": "5e-5",
    }
    with pytest.raises(ConfigError, match="unknown setting"):
        load_config([], {"task": "toolcall", "warm_start": {"step": 4}})


def test_sft_on_a_tiny_model_learns_the_answers_with_trl(tmp_path, one_thread):
    import torch

    model, tok = tiny_policy(seed=3)
    rows = ws.file_rows(_pairs_file(tmp_path), tok)

    def answer_logprob(m):
        total = 0.0
        for r in rows:
            p = tok(r["prompt"], add_special_tokens=False)["input_ids"]
            c = tok(r["completion"], add_special_tokens=False)["input_ids"]
            ids = torch.tensor([p + c])
            with torch.no_grad():
                logp = m(ids).logits[0, len(p) - 1 : -1].log_softmax(-1)
            total += logp.gather(-1, torch.tensor(c)[:, None]).sum().item()
        return total / len(rows)

    before = answer_logprob(model)
    settings = WarmStartSettings(steps=30, learning_rate=1e-2, batch_size=4, lora_r=8, lora_alpha=16, max_length=64)
    merged, stats = ws.run_sft(model, tok, rows, settings, tmp_path / "sft", save_steps=10)
    assert stats["steps"] == 30 and len(stats["losses"]) == 30
    assert stats["last_loss"] < 0.5 * stats["first_loss"]
    assert answer_logprob(merged) > before + 5.0  # the answers became much likelier
    assert not any("lora" in name for name, _ in merged.named_parameters())  # adapters merged away
    assert sorted(p.name for p in (tmp_path / "sft").glob("checkpoint-*")) == [
        "checkpoint-10",
        "checkpoint-20",
        "checkpoint-30",
    ]
    same, stats0 = ws.run_sft(model, tok, rows, WarmStartSettings(steps=0), tmp_path / "none")
    assert same is model and stats0["steps"] == 0


def test_cache_is_built_once_and_keyed_by_settings(tmp_path, tiny_model_dir, monkeypatch, one_thread):
    data = _pairs_file(tmp_path, n=4)
    settings = WarmStartSettings(steps=2, batch_size=2, lora_r=4, lora_alpha=8, max_length=64, data=str(data))
    cache = tmp_path / "cache"
    model, tok, folder = ws.load_warm_start(str(tiny_model_dir), settings, cache_dir=cache, log=lambda *_: None)
    record = json.loads((folder / "mrtpo_warm_start.json").read_text())
    assert folder.parent == cache / "warm-start" and record["train"]["steps"] == 2 and record["pairs"] == 4
    assert record["settings"]["data"] == str(data) and len(record["data"]["file_sha256"]) == 64
    monkeypatch.setattr(ws, "build_warm_start", lambda *a, **k: pytest.fail("rebuilt a cached warm start"))
    assert ws.load_warm_start(str(tiny_model_dir), settings, cache_dir=cache, log=lambda *_: None)[2] == folder
    other = ws.warm_start_dir(
        str(tiny_model_dir), WarmStartSettings(**{**settings.record(), "steps": 3}), cache_dir=cache
    )
    assert other != folder and "3steps" in other.name
    data.write_text(data.read_text() + json.dumps({"prompt": "p", "completion": "a"}) + "\n")
    assert ws.warm_start_dir(str(tiny_model_dir), settings, cache_dir=cache) != folder  # new data, new key


def test_mrtpo_sft_command(tmp_path, tiny_model_dir, capsys, one_thread):
    from mrtpo.cli import main
    from mrtpo.models import load_policy

    out = tmp_path / "warm"
    assert (
        main(
            [
                "sft",
                "--data",
                str(_pairs_file(tmp_path, n=4)),
                "--model",
                str(tiny_model_dir),
                "--steps",
                "2",
                "--batch-size",
                "2",
                "--lora-r",
                "4",
                "--max-length",
                "64",
                "--output-dir",
                str(out),
            ]
        )
        == 0
    )
    assert f"warm-started model: {out}" in capsys.readouterr().out
    model, _ = load_policy(out)
    assert model.config.model_type == "qwen2"
    assert main(["sft", "--model", str(tiny_model_dir)]) == 2
    assert "give --task" in capsys.readouterr().err
    assert (
        main(
            [
                "sft",
                "--data",
                str(tmp_path / "missing.jsonl"),
                "--model",
                str(tiny_model_dir),
                "--output-dir",
                str(tmp_path / "x"),
            ]
        )
        == 2
    )
    assert "does not exist" in capsys.readouterr().err


def test_text_tags_are_spelled_with_ordinary_tokens():
    tok = tiny_tokenizer()
    tok.add_tokens(["<tool_call>", "</tool_call>"])  # added tokens, as in Qwen's tokenizer
    tag_ids = set(tok.convert_tokens_to_ids(["<tool_call>", "</tool_call>"]))
    text = '<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call><|im_end|>'
    assert tag_ids <= set(tok(text, add_special_tokens=False)["input_ids"])
    ids = ws.text_token_ids(tok, text, ("<tool_call>", "</tool_call>"))
    assert not tag_ids & set(ids) and tok.decode(ids) == text
    assert ids[-1] == tok.convert_tokens_to_ids("<|im_end|>")  # other special tokens stay as they are
    assert ws.text_token_ids(tok, text) == tok(text, add_special_tokens=False)["input_ids"]
    assert ws.TASK_DEFAULTS["toolcall"].text_tags == ("<tool_call>", "</tool_call>")


def test_sft_with_text_tags_learns_the_answers(tmp_path, one_thread):
    """The pre-tokenized path (text_tags) goes through TRL and learns the answers."""
    import torch

    model, tok = tiny_policy(seed=5)
    rows = [
        {
            "prompt": f"<|im_start|>user\nsay {w}<|im_end|>\n<|im_start|>assistant\n",
            "completion": f"<tag>{w}</tag><|im_end|>",
        }
        for w in ("cat", "dog", "owl", "emu")
    ]
    settings = WarmStartSettings(
        steps=20,
        learning_rate=1e-2,
        batch_size=2,
        lora_r=8,
        lora_alpha=16,
        max_length=64,
        text_tags=("<tag>", "</tag>"),
    )
    merged, stats = ws.run_sft(model, tok, rows, settings, tmp_path / "sft")
    assert stats["last_loss"] < 0.5 * stats["first_loss"]
    prompt = tok(rows[0]["prompt"], return_tensors="pt", add_special_tokens=False)["input_ids"]
    with torch.no_grad():
        first = merged(prompt).logits[0, -1].argmax().item()
    assert tok.decode([first]) == "<"  # the answer's first token, learned
