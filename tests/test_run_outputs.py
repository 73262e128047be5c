"""What a finished run leaves for a TRL user: the final model or adapter in ``<run>/model/``, a model
card naming the base model and MRTPO, ``mrtpo export`` (a merged model for LoRA runs) and
``mrtpo report RUN`` with the held-out metrics (issue 32, item 3)."""

import json
import shutil
from pathlib import Path

import pytest
import torch
import yaml

from mrtpo.train import main

SMALL = ["task_args={sample_rows: 0}", "train_size=4", "max_completion_length=12", "save_steps=1"]
EVAL = ["eval_size=4", "eval_strategy=steps", "eval_steps=1", "per_device_eval_batch_size=4"]


@pytest.fixture(scope="module")
def lora_run(tiny_dir, tmp_path_factory):
    torch.set_num_threads(1)
    out = tmp_path_factory.mktemp("outputs") / "lora"
    assert (
        main(
            [
                "--task",
                "sql",
                "--model",
                str(tiny_dir),
                "--output-dir",
                str(out),
                "--max-steps",
                "2",
                "--lora-r",
                "4",
                "learning_rate=0.01",
                *SMALL,
                *EVAL,
            ]
        )
        == 0
    )
    return out


def test_a_lora_run_saves_its_adapter_tokenizer_and_card(lora_run, tiny_dir):
    model = lora_run / "model"
    assert (model / "adapter_model.safetensors").is_file() and not (model / "model.safetensors").exists()
    assert (model / "tokenizer.json").is_file() and (model / "tokenizer_config.json").is_file()
    adapter = json.loads((model / "adapter_config.json").read_text())
    assert adapter["base_model_name_or_path"] == str(Path(tiny_dir).resolve())  # a folder: the path that loads it
    assert not list(lora_run.glob(".model*"))  # the partial folder was renamed into place
    card = (model / "README.md").read_text()
    assert card == (lora_run / "README.md").read_text()
    assert f"fine-tuned version of [{Path(tiny_dir).resolve().name}]" in card and "[None]" not in card
    assert "trained with MRTPO, a method introduced in [Each Reward to Its Relevant Tokens" in card
    assert "huggingface.co/papers/2610.21439" in card and "zhai2026mrtpo" in card
    meta = yaml.safe_load(card.split("---")[1])
    assert {"trl", "mrtpo", "mrtpo-method-mrtpo"} <= set(meta["tags"])
    assert "trained with GRPO" not in card


def test_export_merges_the_adapter_into_its_base(lora_run, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from mrtpo.cli import main as cli_main
    from mrtpo.models import load_policy

    dest = tmp_path / "merged"
    assert cli_main(["export", str(lora_run), "--output-dir", str(dest)]) == 0
    assert (dest / "model.safetensors").is_file() and not (dest / "adapter_config.json").exists()
    assert (dest / "tokenizer.json").is_file() and "MRTPO" in (dest / "README.md").read_text()
    merged = AutoModelForCausalLM.from_pretrained(dest, dtype=torch.float32)
    config = yaml.safe_load((lora_run / "config.yaml").read_text())
    base, _ = load_policy(config["model"], dtype=torch.float32)
    with_adapter = PeftModel.from_pretrained(base, str(lora_run / "model"))
    ids = torch.tensor([[1, 5, 9, 20, 33]])
    with torch.no_grad():
        expect, got = with_adapter(ids).logits, merged(ids).logits
        plain = base.get_base_model()(ids).logits if hasattr(base, "get_base_model") else None
    torch.testing.assert_close(got, expect, atol=1e-4, rtol=1e-4)
    assert plain is None or not torch.allclose(got, plain)  # the adapter moved the weights
    # A second export into the same folder is refused unless told to overwrite.
    assert cli_main(["export", str(lora_run), "--output-dir", str(dest)]) == 2
    assert cli_main(["export", str(lora_run), "--output-dir", str(dest), "--overwrite"]) == 0


def test_report_command_rebuilds_the_report_with_held_out_metrics(lora_run, capsys):
    from mrtpo.cli import main as cli_main

    for name in ("report.html", "report.md", "curves.png"):
        (lora_run / name).unlink()
    assert cli_main(["report", str(lora_run)]) == 0
    md = (lora_run / "report.md").read_text(errors="replace")
    assert "## Held-out evaluation" in md and "| eval_reward |" in md and "| eval_rewards/format/mean |" in md
    assert "(step 2)" in md
    assert "Held-out evaluation" in (lora_run / "report.html").read_text()
    assert (lora_run / "curves.png").read_bytes()[:4] == b"\x89PNG"
    assert cli_main(["report", str(lora_run / "model")]) == 2
    assert "holds no metrics.jsonl" in capsys.readouterr().err


def test_held_out_rows_and_series():
    from mrtpo.report.held_out import eval_rows, eval_series

    records = [
        {"step": 1, "loss": 0.1, "reward": 0.5},
        {"step": 1, "eval_reward": 0.2, "eval_rewards/a/mean": 0.1, "eval_rewards/a/std": 0.3, "eval_runtime": 3.0},
        {"step": 3, "eval_reward": 0.6, "eval_rewards/a/mean": 0.4, "eval_loss": 0.0},
    ]
    rows = {r["name"]: r for r in eval_rows(records)}
    assert list(rows)[:2] == ["eval_reward", "eval_rewards/a/mean"]
    assert "eval_runtime" not in rows and "eval_rewards/a/std" not in rows
    reward = rows["eval_reward"]
    assert (reward["first"], reward["last"], reward["last_step"]) == (0.2, 0.6, 3)
    assert eval_series(records, "eval_rewards/a/mean") == ([1, 3], [0.1, 0.4])


def test_a_full_run_saves_the_whole_model_and_export_copies_it(tiny_dir, tmp_path, one_thread):
    from transformers import AutoModelForCausalLM

    from mrtpo.export import export_model

    out = tmp_path / "full"
    assert (
        main(
            [
                "--task",
                "sql",
                "--model",
                str(tiny_dir),
                "--output-dir",
                str(out),
                "--max-steps",
                "1",
                "report=false",
                *SMALL,
            ]
        )
        == 0
    )
    assert (out / "model" / "model.safetensors").is_file() and (out / "model" / "tokenizer.json").is_file()
    assert not (out / "model" / "training_args.bin").exists()
    dest = export_model(out)
    assert dest == out / "export" and (dest / "model.safetensors").is_file()
    assert AutoModelForCausalLM.from_pretrained(dest).config.vocab_size > 0


def test_a_failed_final_save_leaves_the_finished_model(tiny_dir, tmp_path, monkeypatch, one_thread):
    from mrtpo.trainer import MRTPOTrainer

    out = tmp_path / "run"
    base = ["--task", "sql", "--model", str(tiny_dir), "--output-dir", str(out), "report=false", *SMALL]
    assert main([*base, "--max-steps", "1"]) == 0
    before = (out / "model" / "model.safetensors").read_bytes()

    save_model = MRTPOTrainer.save_model

    def broken(self, output_dir=None, _internal_call=False):
        if not str(output_dir).endswith(".model.partial"):  # checkpoints save as before
            return save_model(self, output_dir, _internal_call)
        Path(output_dir).mkdir(parents=True, exist_ok=True)
        (Path(output_dir) / "model.safetensors").write_bytes(b"half")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(MRTPOTrainer, "save_model", broken)
    assert main([*base, "--max-steps", "2", "--resume", str(out)]) == 2  # the disk-full message, no traceback
    assert (out / "model" / "model.safetensors").read_bytes() == before
    assert (out / "checkpoint-2" / "trainer_state.json").is_file()
    # A fresh run refuses the folder, which holds a finished model, unless told to overwrite it.
    monkeypatch.undo()
    assert main([*base, "--max-steps", "1"]) == 2
    shutil.rmtree(out / ".model.partial")
    assert main([*base, "--max-steps", "1", "--overwrite"]) == 0


def test_base_model_names():
    from mrtpo.model_names import base_model_names, spec_for_base

    assert base_model_names("qwen2.5-coder-0.5b") == ("Qwen/Qwen2.5-Coder-0.5B-Instruct",) * 2
    assert base_model_names("HuggingFaceTB/SmolLM2-135M-Instruct")[0] == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert base_model_names("gym", "gym-constraints") == ("mrtpo-gym/gym-constraints", None)
    assert spec_for_base("HuggingFaceTB/SmolLM2-135M-Instruct") == "smollm2-135m"
    assert spec_for_base("/some/folder") == "/some/folder"


def test_an_adapter_naming_a_presets_hub_id_loads_on_the_preset(tmp_path):
    from mrtpo.evaluate.load import _base_from_adapter

    adapter = {"base_model_name_or_path": "Qwen/Qwen2.5-Coder-0.5B-Instruct"}
    (tmp_path / "adapter_config.json").write_text(json.dumps(adapter))
    assert _base_from_adapter(tmp_path, None) == "qwen2.5-coder-0.5b"
