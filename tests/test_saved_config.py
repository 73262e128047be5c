"""The saved ``config.yaml`` keeps what the user chose apart from what the machine decided, so the file
re-runs correctly on another machine (issue 32, item 3)."""

import pytest
import torch
import yaml

from mrtpo.config import load_config
from mrtpo.saved_config import write_config


def _cpu_machine(monkeypatch, flags=frozenset({"avx512_bf16"})):
    import mrtpo.machine

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(mrtpo.machine, "cpu_flags", lambda: flags)


def test_a_cpu_runs_file_does_not_pin_the_cpu_on_a_gpu_machine(tmp_path, monkeypatch):
    _cpu_machine(monkeypatch)
    config = load_config([], {"lora_r": 8, "output_dir": str(tmp_path / "run")})
    assert config.args.use_cpu and config.run.dtype == "bfloat16"  # what this CPU decided
    path = write_config(config, tmp_path / "config.yaml")
    text = path.read_text()
    saved = yaml.safe_load(text)
    assert not {"use_cpu", "bf16", "fp16", "dtype"} & set(saved)
    assert saved["lora_r"] == 8 and saved["max_steps"] == config.args.max_steps
    # ... but the file still says what was decided here, as comments.
    assert "# Decided by the machine" in text and "# use_cpu: true" in text and "# dtype: bfloat16" in text

    # The same file on a machine with CUDA (no CPU defaults): the trainer gets neither use_cpu nor bf16
    # from it, so TRL's GPU defaults apply (this machine has no GPU to build that config on: record it).
    import mrtpo.machine
    import mrtpo.trainer.config

    class Built(Exception):
        pass

    class Recording(mrtpo.trainer.config.MRTPOConfig):
        def __init__(self, **kwargs):
            raise Built(kwargs)

    with monkeypatch.context() as m:
        m.setattr(mrtpo.machine, "cpu_run_defaults", lambda: {})
        m.setattr(mrtpo.trainer.config, "MRTPOConfig", Recording)
        with pytest.raises(Built) as built:
            load_config([path])
    kwargs = built.value.args[0]
    assert "use_cpu" not in kwargs and "bf16" not in kwargs and kwargs["max_steps"] > 0
    # ... and back on a CPU without bf16 matmuls: that CPU's choice, not the first one's.
    _cpu_machine(monkeypatch, frozenset())
    other = load_config([path])
    assert other.args.use_cpu and other.run.dtype == "float32"


def test_what_the_user_set_stays_a_setting(tmp_path, monkeypatch):
    _cpu_machine(monkeypatch)
    config = load_config([], {"lora_r": 8, "use_cpu": True, "dtype": "float16", "output_dir": str(tmp_path / "r")})
    saved = yaml.safe_load(write_config(config, tmp_path / "config.yaml").read_text())
    assert saved["use_cpu"] is True and saved["dtype"] == "float16"
    assert "bf16" not in saved  # not set by the user: decided by the machine


@pytest.mark.parametrize("explicit", [False, True])
def test_a_resumed_runs_settings_round_trip(tmp_path, monkeypatch, explicit):
    _cpu_machine(monkeypatch)
    given = {"lora_r": 4, "output_dir": str(tmp_path / "run"), **({"dtype": "float32"} if explicit else {})}
    config = load_config([], given)
    path = write_config(config, tmp_path / "config.yaml")
    again = load_config([], {}, base=yaml.safe_load(path.read_text()), base_source=str(path))
    assert again.to_flat() == config.to_flat()
