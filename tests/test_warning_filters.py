"""A run through the ``mrtpo`` command prints no warnings of its own making; the filters for the
pinned dependencies' own deprecation warnings are narrow (message and module)."""

import json
import warnings

from mrtpo.cli import main as cli_main
from mrtpo.warning_filters import filter_dependency_warnings


def test_a_tiny_lora_run_with_activation_checkpointing_warns_nothing(tiny_dir, tmp_path, one_thread):
    # The README's `make run` path (LoRA on bf16 weights, activation checkpointing, MRTPO replays),
    # on the tiny model: the code that calls TRL, peft and transformers the same way.
    out = tmp_path / "run"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        rc = cli_main(
            [
                "train",
                "--task",
                "sql",
                "--method",
                "mrtpo",
                "--model",
                str(tiny_dir),
                "--output-dir",
                str(out),
                "--max-steps",
                "1",
                "--lora-r",
                "4",
                "dtype=bfloat16",
                "activation_checkpointing=true",
                "task_args={sample_rows: 0}",
                "train_size=4",
                "max_completion_length=8",
                "report=false",
            ]
        )
    assert rc == 0
    assert [json.loads(x)["step"] for x in (out / "metrics.jsonl").read_text().splitlines()][0] == 1
    future = [f"{w.filename}:{w.lineno}: {w.message}" for w in caught if issubclass(w.category, FutureWarning)]
    assert future == []
    ours = [f"{w.filename}:{w.lineno}: {w.message}" for w in caught if "/mrtpo/" in w.filename.replace("\\", "/")]
    assert ours == []


def test_the_filters_name_the_message_and_the_module():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        filter_dependency_warnings()
        hidden = "`is_gradient_checkpointing` is deprecated and will be removed in v6."
        warnings.warn_explicit(hidden, FutureWarning, "modeling_utils.py", 1, module="transformers.modeling_utils")
        # The same message from another module, and another deprecation from that module, still show.
        warnings.warn_explicit(hidden, FutureWarning, "mine.py", 1, module="mrtpo.trainer")
        warnings.warn_explicit(
            "`use_cache` is deprecated", FutureWarning, "modeling_utils.py", 2, module="transformers.modeling_utils"
        )
    assert [(str(w.message), w.filename) for w in caught] == [
        (hidden, "mine.py"),
        ("`use_cache` is deprecated", "modeling_utils.py"),
    ]


def test_the_offline_adapter_vocabulary_warning_is_hidden_only_from_peft():
    message = (
        "Could not find a config file in Qwen/Qwen2.5-Coder-0.5B-Instruct - will assume that the vocabulary "
        "was not modified."
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        filter_dependency_warnings()
        warnings.warn_explicit(message, UserWarning, "save_and_load.py", 313, module="peft.utils.save_and_load")
        warnings.warn_explicit(message, UserWarning, "other.py", 1, module="peft.other")
    assert [w.filename for w in caught] == ["other.py"]
