"""``mrtpo eval``'s model loading: presets, ``.gguf`` files, hub ids, saved folders, training
checkpoints (a run folder resolves to its highest ``checkpoint-N``) and PEFT adapters (merged
on their base). :mod:`mrtpo.evaluate` re-exports everything here; ``mrtpo explain`` loads its
model the same way.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

__all__ = ["EvalUserError", "load_model", "resolve_checkpoint"]


class EvalUserError(Exception):
    """A mistake in the command's inputs (task, split, model path); the message says the fix."""


_CHECKPOINT = re.compile(r"checkpoint-(\d+)")


def resolve_checkpoint(path: str | os.PathLike) -> tuple[Path, str]:
    """``(folder, kind)`` of a saved model folder: kind "adapter" (PEFT adapter_config.json) or
    "full" (config.json). A training output folder without either resolves to its
    highest-numbered ``checkpoint-N`` subfolder; a folder of ``.gguf`` files gives "gguf"."""
    root = Path(path).expanduser()
    if (root / "adapter_config.json").is_file():
        return root, "adapter"
    if (root / "config.json").is_file():
        return root, "full"
    numbered = []
    for sub in root.iterdir():
        m = _CHECKPOINT.fullmatch(sub.name)
        if m and sub.is_dir() and ((sub / "adapter_config.json").is_file() or (sub / "config.json").is_file()):
            numbered.append((int(m.group(1)), sub))
    if not numbered:
        if any(root.glob("*.gguf")):
            return root, "gguf"  # mrtpo.models.load_policy takes a folder holding one .gguf
        raise EvalUserError(
            f"{root} is not a saved model: it has no config.json (a save_pretrained folder), no "
            f"adapter_config.json (a PEFT adapter) and no checkpoint-N subfolder with either. "
            f"Pass a model folder, a checkpoint folder, a .gguf file or a preset."
        )
    _, best = max(numbered)
    return resolve_checkpoint(best)


def _base_from_adapter(folder: Path, base_override: str | None) -> str:
    """The base model spec of a PEFT adapter: ``--base-model`` if given, else the config's
    ``base_model_name_or_path``; a missing mrtpo cache path ``<preset>-<sha8>`` maps to its preset."""
    if base_override:
        return base_override
    from mrtpo.models import PRESETS

    config = json.loads((folder / "adapter_config.json").read_text())
    base = config.get("base_model_name_or_path")
    if base:
        from mrtpo.model_names import spec_for_base

        base = spec_for_base(base)  # a preset's upstream hub id: the preset it trained on
    if not base:
        raise EvalUserError(
            f"the adapter in {folder} does not name its base model (base_model_name_or_path); "
            f"pass it with --base-model <preset|dir>."
        )
    if base not in PRESETS and not Path(base).expanduser().exists():
        stem = Path(base).name
        for name in PRESETS:
            if re.fullmatch(re.escape(name) + r"(-[0-9a-f]{8})?", stem):
                return name
    return base


def load_model(
    spec: str,
    dtype: str = "bfloat16",
    device: str = "auto",
    base_model: str | None = None,
) -> tuple[Any, Any, dict[str, Any]]:
    """``(model, tokenizer, info)`` for a preset, ``.gguf``, hub id, saved folder, checkpoint
    folder or PEFT adapter folder (loaded on its base via :func:`mrtpo.models.load_policy`,
    then merged). ``info`` describes what was loaded, for the run metadata."""
    import torch

    from mrtpo.models import PRESETS, ModelLoadError, load_policy

    torch_dtype = {"bfloat16": torch.bfloat16, "float32": torch.float32, "float16": torch.float16}[dtype]
    info: dict[str, Any] = {"spec": spec, "dtype": dtype}
    path = Path(spec).expanduser()
    try:
        if path.is_dir():
            folder, kind = resolve_checkpoint(path)
            info.update(kind=kind, path=str(folder.resolve()))
            if kind == "adapter":
                base = _base_from_adapter(folder, base_model)
                info["base_model"] = base
                model, tokenizer = load_policy(base, dtype=torch_dtype)
                from peft import PeftModel

                model = PeftModel.from_pretrained(model, str(folder), is_trainable=False)
                model = model.merge_and_unload()
                model.eval()
            elif kind == "gguf":
                model, tokenizer = load_policy(folder, dtype=torch_dtype)
            else:
                if not any((folder / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json")):
                    raise EvalUserError(
                        f"checkpoint {folder} has no tokenizer files (tokenizer.json / "
                        f"tokenizer_config.json): save them there with tokenizer.save_pretrained, "
                        f"or copy them from the training output folder."
                    )
                model, tokenizer = load_policy(folder, dtype=torch_dtype)
        else:
            model, tokenizer = load_policy(spec, dtype=torch_dtype)
            info["kind"] = "preset" if spec in PRESETS else ("gguf" if path.suffix == ".gguf" else "hub")
            if spec in PRESETS:
                info["sha256"] = PRESETS[spec].sha256
    except ModelLoadError as err:
        raise EvalUserError(f"cannot load model {spec!r}: {err}") from None
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    model.to(device)
    info["device"] = device
    info["parameters"] = sum(p.numel() for p in model.parameters())
    return model, tokenizer, info
