"""The name a trained model gives its base model, and back.

A preset is a GGUF re-upload of a hub model, loaded through a local cache folder: its model card and
its LoRA adapters name the upstream hub id (:data:`UPSTREAM`), which means something on any machine,
rather than the cache path. mrtpo's own loaders read that id back as the preset
(:func:`spec_for_base`), so an adapter still loads offline, on the weights it was trained on.
"""

from __future__ import annotations

import os
from pathlib import Path

#: preset -> the hub id of the model it re-packages.
UPSTREAM = {
    "qwen2.5-coder-0.5b": "Qwen/Qwen2.5-Coder-0.5B-Instruct",
    "smollm2-135m": "HuggingFaceTB/SmolLM2-135M-Instruct",
}


def base_model_names(spec: str | os.PathLike, task: str | None = None) -> tuple[str | None, str | None]:
    """``(card name, adapter name)`` of the base model ``spec`` (a run's ``model`` setting).

    - a preset: its upstream hub id, for both;
    - a hub id: itself, for both;
    - a model folder or ``.gguf`` file: its name on the card, its absolute path in an adapter (what
      loads it again);
    - ``gym`` (the credit gym's tiny policy): ``mrtpo-gym/<task>`` on the card, no adapter name.
    """
    text = os.fspath(spec)
    if text == "gym":
        return f"mrtpo-gym/{task or 'policy'}", None
    if text in UPSTREAM:
        return UPSTREAM[text], UPSTREAM[text]
    path = Path(text).expanduser()
    if path.exists():
        return (path.stem if path.is_file() else path.resolve().name), str(path.resolve())
    return text, text


def base_weights_note(spec: str | os.PathLike) -> str | None:
    """A model card's line on base weights that are not the named model's own: a preset or ``.gguf`` file is
    a quantised GGUF, dequantised to bfloat16 before training (None for any other base)."""
    from mrtpo.models import PRESETS

    text = os.fspath(spec)
    if text in PRESETS:
        preset = PRESETS[text]
        what = preset.description.split(" (")[0]
        return (
            f"**Base weights.** Trained on mrtpo's preset `{text}`: {what}, dequantised to "
            f"bfloat16 (GGUF sha256 `{preset.sha256[:12]}…`; {preset.source}), not the original "
            f"{UPSTREAM.get(text, 'hub')} weights, which differ by the quantisation error. mrtpo loads an "
            f"adapter naming {UPSTREAM.get(text, text)} on that same preset; on the hub model it behaves close "
            "to, not exactly as, it did in training."
        )
    if text.lower().endswith(".gguf"):
        return (
            f"**Base weights.** Trained on `{Path(text).name}`, a GGUF file dequantised to bfloat16 by "
            "transformers' GGUF loader: the base model is those dequantised weights."
        )
    return None


def spec_for_base(name: str) -> str:
    """What mrtpo loads for a base model named ``name``: a preset's upstream hub id gives the preset
    (the weights it trained on, offline); anything else is itself."""
    for preset, hub_id in UPSTREAM.items():
        if name == hub_id:
            return preset
    return name


__all__ = ["UPSTREAM", "base_model_names", "base_weights_note", "spec_for_base"]
