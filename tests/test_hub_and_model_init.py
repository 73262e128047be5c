"""Hub mode (:mod:`mrtpo.hub`) and TRL's ``model_init_kwargs`` (:mod:`mrtpo.model_init`), issue 32 item 2.

The hub is never contacted: the reachability check is monkeypatched, or pointed at local endpoints.
"""

from __future__ import annotations

import http.server
import json
import os
import socket
import subprocess
import sys
import threading
import time

import pytest
import torch
from huggingface_hub import constants

from mrtpo import hub
from mrtpo.model_init import ModelInitError, load_with_init, parse_model_init
from mrtpo.models import ModelLoadError, load_policy
from mrtpo.testing import tiny_policy

HUB_VARS = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", hub.REASON_VAR, "HF_ENDPOINT")


@pytest.fixture
def no_hub_setting(monkeypatch):
    """No offline setting anywhere (the suite's conftest sets HF_HUB_OFFLINE=1); restored afterwards."""
    for var in HUB_VARS:
        monkeypatch.setenv(var, "x")  # so that undo restores the original value (or its absence)
        monkeypatch.delenv(var)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    if "datasets.config" in sys.modules:
        cfg = sys.modules["datasets.config"]
        monkeypatch.setattr(cfg, "HF_HUB_OFFLINE", cfg.HF_HUB_OFFLINE)
        monkeypatch.setattr(cfg, "HF_DATASETS_OFFLINE", cfg.HF_DATASETS_OFFLINE)
    hub._probe.cache_clear()
    yield monkeypatch
    hub._probe.cache_clear()


def _no_check(*_a, **_k):
    raise AssertionError("the reachability check must not run when the user has decided")


# ---------------------------------------------------------------------------------------------
# hub mode
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "env, offline",
    [
        ({"HF_HUB_OFFLINE": "1"}, True),
        ({"HF_HUB_OFFLINE": "0"}, False),
        ({"TRANSFORMERS_OFFLINE": "1"}, True),
        ({"HF_HUB_OFFLINE": "0", "TRANSFORMERS_OFFLINE": "1"}, False),
    ],
)
def test_the_users_setting_wins_without_a_check(no_hub_setting, env, offline):
    for var, value in env.items():
        no_hub_setting.setenv(var, value)
    no_hub_setting.setattr(hub, "hub_reachable", _no_check)
    assert hub.decide() is offline
    if offline:
        var = next(iter(env))
        assert f"set {var}=0" in hub.offline_reason()


def test_reachable_hub_leaves_the_process_online(no_hub_setting):
    no_hub_setting.setattr(hub, "hub_reachable", lambda timeout=hub.CHECK_TIMEOUT_S: True)
    assert hub.decide() is False
    assert "HF_HUB_OFFLINE" not in os.environ and constants.HF_HUB_OFFLINE is False


def test_unreachable_hub_makes_the_process_offline_and_says_so(no_hub_setting):
    no_hub_setting.setenv("HF_ENDPOINT", "https://hub.example.invalid/")
    no_hub_setting.setattr(hub, "hub_reachable", lambda timeout=hub.CHECK_TIMEOUT_S: False)
    assert hub.decide() is True
    assert os.environ["HF_HUB_OFFLINE"] == "1" and constants.HF_HUB_OFFLINE is True  # children and hf libs too
    assert hub.user_setting() is None  # mrtpo's choice, not the user's
    reason = hub.offline_reason()
    assert "https://hub.example.invalid gave no usable answer" in reason and "HF_HUB_OFFLINE=0" in reason
    no_hub_setting.setattr(hub, "hub_reachable", _no_check)
    assert hub.decide() is True  # decided once


def test_real_check_against_an_unreachable_endpoint_is_quick(no_hub_setting):
    no_hub_setting.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # discard port: refused
    t0 = time.perf_counter()
    assert hub.hub_reachable() is False
    assert hub.decide() is True
    assert time.perf_counter() - t0 < 3
    # a server that accepts the connection and never answers: the deadline bounds the wait
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(1)
    try:
        t0 = time.perf_counter()
        assert hub._probe(f"http://127.0.0.1:{silent.getsockname()[1]}", 0.5) is False
        assert time.perf_counter() - t0 < 1.5
    finally:
        silent.close()


def test_real_check_against_a_local_endpoint(no_hub_setting):
    status = {"code": 200}

    class Head(http.server.BaseHTTPRequestHandler):
        def do_HEAD(self):  # noqa: N802
            self.send_response(status["code"])
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Head)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        no_hub_setting.setenv("HF_ENDPOINT", f"http://127.0.0.1:{server.server_port}")
        assert hub.hub_reachable() is True and hub.decide() is False
        status["code"] = 404  # an interceptor's answer, not a hub
        hub._probe.cache_clear()
        assert hub.hub_reachable() is False
    finally:
        server.shutdown()


def test_offline_hub_id_error_names_the_variable_that_lifts_it(no_hub_setting):
    no_hub_setting.setenv("HF_HUB_OFFLINE", "1")
    no_hub_setting.setattr(constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(ModelLoadError) as exc:
        load_policy("nobody/no-such-model-q7")
    msg = str(exc.value)
    assert "HF_HUB_OFFLINE=1 is set" in msg and "set HF_HUB_OFFLINE=0" in msg and "not found in the local" in msg


def test_push_to_hub_is_refused_offline_and_without_a_token(no_hub_setting):
    no_hub_setting.setattr(hub, "hub_reachable", lambda timeout=hub.CHECK_TIMEOUT_S: False)
    assert hub.prepare_hub(False) is True  # nothing pushed: offline is fine
    with pytest.raises(hub.HubError, match="push_to_hub=true needs the model hub.*HF_HUB_OFFLINE=0"):
        hub.prepare_hub(True)
    no_hub_setting.setenv("HF_HUB_OFFLINE", "0")  # the user says online; no token anywhere
    no_hub_setting.setattr("huggingface_hub.get_token", lambda: None)
    with pytest.raises(hub.HubError, match="needs a Hugging Face token"):
        hub.prepare_hub(True)


def test_train_refuses_push_to_hub_offline_before_loading(no_hub_setting, tmp_path, capsys):
    from mrtpo.train import main

    no_hub_setting.setenv("HF_HUB_OFFLINE", "1")
    out = tmp_path / "run"
    rc = main(["--task", "gym-constraints", "--model", "gym", "--output-dir", str(out), "push_to_hub=true"])
    assert rc == 2 and not out.exists()
    assert "push_to_hub=true needs the model hub" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------
# model_init_kwargs
# ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny") / "model"
    model, tok = tiny_policy()
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def test_parse_checks_keys_and_values(tiny_folder):
    with pytest.raises(ModelInitError, match="unknown key 'attn_implmentation' .*did you mean 'attn_implementation'"):
        parse_model_init(str(tiny_folder), {"attn_implmentation": "eager"})
    with pytest.raises(ModelInitError, match="unknown key 'low_cpu_mem_usage'"):
        parse_model_init(str(tiny_folder), {"low_cpu_mem_usage": True})
    with pytest.raises(ModelInitError, match="quantization_config: 4-/8-bit \\(QLoRA\\) training is not supported"):
        parse_model_init(str(tiny_folder), {"quantization_config": {"load_in_4bit": True}})
    with pytest.raises(ModelInitError, match="dtype must be one of"):
        parse_model_init(str(tiny_folder), {"dtype": "int8"})
    with pytest.raises(ModelInitError, match="disagree"):
        parse_model_init(str(tiny_folder), {"dtype": "bfloat16"}, dtype="float32", dtype_given=True)
    with pytest.raises(ModelInitError, match="must be a mapping"):
        parse_model_init(str(tiny_folder), ["eager"])
    assert parse_model_init(str(tiny_folder), {"torch_dtype": "bfloat16"}).dtype == "bfloat16"  # old name
    assert parse_model_init(str(tiny_folder), '{"dtype": "auto"}').dtype == "auto"  # TRL's JSON string form
    assert parse_model_init(str(tiny_folder), None, dtype="bfloat16").dtype == "bfloat16"  # the run's dtype
    assert parse_model_init("gym", None, trust_remote_code=True).trust_remote_code is True  # TRL's own field


def test_revision_is_for_hub_ids_only(tiny_folder):
    for spec, what in ((str(tiny_folder), "a local folder"), ("smollm2-135m", "a preset"), ("gym", "the gym policy")):
        with pytest.raises(ModelInitError, match=f"applies to hub ids only; .* is {what}"):
            parse_model_init(spec, {"revision": "main"})
    init = parse_model_init("someone/some-model", {"revision": "v1", "trust_remote_code": True})
    assert init.from_pretrained_kwargs() == {"revision": "v1", "trust_remote_code": True}


@pytest.mark.parametrize(
    "kwargs, attn, dtype",
    [
        ({"attn_implementation": "eager", "dtype": "bfloat16"}, "eager", torch.bfloat16),
        ({"attn_implementation": "sdpa", "dtype": "float32"}, "sdpa", torch.float32),
        ({"dtype": "auto"}, "sdpa", torch.float32),  # the folder's own dtype
    ],
)
def test_a_folder_loads_with_the_asked_attention_and_dtype(tiny_folder, kwargs, attn, dtype):
    model, _ = load_with_init(tiny_folder, parse_model_init(str(tiny_folder), kwargs))
    assert model.config._attn_implementation == attn and model.dtype == dtype


def test_an_attention_that_cannot_run_here_is_a_clear_error(tiny_folder):
    with pytest.raises(ModelInitError, match="attn_implementation='no_such_attention'"):
        load_with_init(tiny_folder, parse_model_init(str(tiny_folder), {"attn_implementation": "no_such_attention"}))


def test_trust_remote_code_reaches_from_pretrained(tmp_path):
    """A folder whose config names its own code loads only with trust_remote_code."""
    folder = tmp_path / "remote"
    model, tok = tiny_policy()
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    (folder / "configuration_q7.py").write_text(
        "from transformers import Qwen2Config\n\nclass Q7Config(Qwen2Config):\n    model_type = 'q7-remote'\n"
    )
    (folder / "modeling_q7.py").write_text(
        "from transformers import Qwen2ForCausalLM\nfrom .configuration_q7 import Q7Config\n\n"
        "class Q7ForCausalLM(Qwen2ForCausalLM):\n    config_class = Q7Config\n"
    )
    config = json.loads((folder / "config.json").read_text())
    config.update(
        model_type="q7-remote",
        architectures=["Q7ForCausalLM"],
        auto_map={"AutoConfig": "configuration_q7.Q7Config", "AutoModelForCausalLM": "modeling_q7.Q7ForCausalLM"},
    )
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises((ValueError, OSError)):
        load_with_init(folder, parse_model_init(str(folder), {}))
    loaded, _ = load_with_init(folder, parse_model_init(str(folder), {"trust_remote_code": True}))
    assert type(loaded).__name__ == "Q7ForCausalLM"


def test_build_trainer_applies_model_init_kwargs(tiny_folder, tmp_path):
    from mrtpo.config import load_config
    from mrtpo.train import build_trainer

    config = load_config(
        overrides={
            "task": "gym-constraints",
            "model": str(tiny_folder),
            "output_dir": str(tmp_path / "run"),
            "max_steps": 1,
            "num_generations": 2,
            "per_device_train_batch_size": 2,
            "max_completion_length": 8,
            "report": False,
            "model_init_kwargs": {"attn_implementation": "eager", "torch_dtype": "bfloat16"},
            "dtype": "bfloat16",
        }
    )
    trainer = build_trainer(config)
    assert trainer.model.config._attn_implementation == "eager" and trainer.model.dtype == torch.bfloat16
    assert config.args.model_init_kwargs == {"dtype": "bfloat16", "attn_implementation": "eager"}  # TRL's copy


def test_the_gym_policy_takes_attention_and_dtype(tmp_path, monkeypatch):
    monkeypatch.setenv("MRTPO_CACHE", str(tmp_path / "cache"))  # the shipped policy; nothing built elsewhere
    from mrtpo.config import load_config
    from mrtpo.tasks import get_task
    from mrtpo.train import load_model

    config = load_config(
        overrides={
            "task": "gym-constraints",
            "model": "gym",
            "output_dir": str(tmp_path / "r"),
            "model_init_kwargs": {"attn_implementation": "eager"},
        }
    )
    model, _, _ = load_model(config, get_task("gym-constraints"))
    assert model.config._attn_implementation == "eager"
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").iterdir())


def test_train_cli_one_step_with_model_init_kwargs(tiny_folder, tmp_path):
    out = tmp_path / "run"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "MRTPO_CACHE": str(tmp_path / "cache")}
    base = [
        sys.executable,
        "-m",
        "mrtpo.cli",
        "train",
        "--task",
        "gym-constraints",
        "--model",
        str(tiny_folder),
        "--output-dir",
        str(out),
        "--overwrite",
        "max_steps=1",
        "num_generations=2",
        "per_device_train_batch_size=2",
        "max_completion_length=8",
        "report=false",
        "save_strategy=no",
    ]
    done = subprocess.run(
        [*base, "model_init_kwargs={attn_implementation: eager, dtype: float32}"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "will be ignored" not in done.stdout + done.stderr  # TRL's warning: mrtpo applied them
    saved = (out / "config.yaml").read_text()
    assert "model_init_kwargs:\n  dtype: float32\n  attn_implementation: eager" in saved
    bad = subprocess.run(
        [*base, "model_init_kwargs={revision: main}"], env=env, capture_output=True, text=True, timeout=300, check=False
    )
    assert bad.returncode == 2 and "revision 'main' applies to hub ids only" in bad.stderr
    assert "Traceback" not in bad.stderr
