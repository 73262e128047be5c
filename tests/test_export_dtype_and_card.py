"""``mrtpo export --dtype`` and the model card's note on dequantised GGUF base weights (issue 40, item 6)."""

import json
import struct
from pathlib import Path

import pytest
import torch

from mrtpo.model_names import base_weights_note
from mrtpo.train import main

SMALL = ["task_args={sample_rows: 0}", "train_size=4", "max_completion_length=8", "save_strategy=no", "report=false"]


def _dtypes(folder: Path) -> set[str]:
    """The tensor dtypes in a folder's model.safetensors, read from its JSON header (no torch load)."""
    raw = (folder / "model.safetensors").read_bytes()
    size = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8 : 8 + size])
    return {v["dtype"] for k, v in header.items() if k != "__metadata__"}


@pytest.fixture(scope="module")
def runs(tiny_dir, tmp_path_factory):
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("export")
    for name, extra in (("lora", ["--lora-r", "4", "learning_rate=0.01"]), ("full", [])):
        assert (
            main(
                [
                    "--task",
                    "sql",
                    "--model",
                    str(tiny_dir),
                    "--output-dir",
                    str(root / name),
                    "--max-steps",
                    "1",
                    *extra,
                    *SMALL,
                ]
            )
            == 0
        )
    return root


def test_export_dtype_of_a_merged_adapter(runs, tmp_path):
    from transformers import AutoModelForCausalLM

    from mrtpo.cli import main as cli_main

    for dtype in ("float32", "bfloat16"):
        assert cli_main(["export", str(runs / "lora"), "--output-dir", str(tmp_path / dtype), "--dtype", dtype]) == 0
    assert _dtypes(tmp_path / "float32") == {"F32"} and _dtypes(tmp_path / "bfloat16") == {"BF16"}
    full, half = ((tmp_path / d / "model.safetensors").stat().st_size for d in ("float32", "bfloat16"))
    assert 0.45 < half / full < 0.55  # half the bytes (the header aside)
    ids = torch.tensor([[1, 5, 9, 20, 33]])
    with torch.no_grad():
        ref = AutoModelForCausalLM.from_pretrained(tmp_path / "float32")(ids).logits
        got = AutoModelForCausalLM.from_pretrained(tmp_path / "bfloat16", dtype=torch.float32)(ids).logits
    torch.testing.assert_close(got, ref, atol=0.05, rtol=0.05)  # the same model, rounded to bf16
    with pytest.raises(SystemExit) as done:  # argparse's choices
        cli_main(["export", str(runs / "lora"), "--output-dir", str(tmp_path / "x"), "--dtype", "int8"])
    assert done.value.code == 2


def test_export_dtype_of_a_full_model_casts_only_when_asked(runs, tmp_path):
    from mrtpo.export import export_model

    kept = export_model(runs / "full", tmp_path / "kept")
    assert _dtypes(kept) == _dtypes(runs / "full" / "model")
    half = export_model(runs / "full", tmp_path / "half", dtype="float16")
    assert _dtypes(half) == {"F16"} and (half / "tokenizer.json").is_file() and (half / "config.json").is_file()


def test_the_card_says_a_preset_was_a_dequantised_gguf(tmp_path):
    note = base_weights_note("qwen2.5-coder-0.5b")
    assert "Q4_K_M GGUF" in note and "dequantised to bfloat16" in note and "1d9614638d18" in note
    assert "Qwen/Qwen2.5-Coder-0.5B-Instruct" in note
    assert "GGUF file dequantised" in base_weights_note(str(tmp_path / "m.Q8_0.gguf"))
    assert base_weights_note(str(tmp_path)) is None and base_weights_note("someone/model") is None

    from tests.test_trainer import make_trainer, plain_length

    trainer = make_trainer(tmp_path, [plain_length], method="grpo")
    trainer.name_base_model("Qwen/Qwen2.5-Coder-0.5B-Instruct", None, note)
    trainer.create_model_card(model_name="run")
    card = (tmp_path / "README.md").read_text()
    assert card.count(note) == 1
    assert card.index("## Quick start") < card.index(note) < card.index("## Training procedure")
    trainer.create_model_card(model_name="run")  # written again: still once
    assert (tmp_path / "README.md").read_text().count(note) == 1
