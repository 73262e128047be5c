"""What TRL writes about an MRTPO run: the trainer's name, tags and paper on the model card, and the
base model the card and a LoRA adapter name.

TRL's trainers describe themselves through three class attributes (``_name``, ``_tag_names``,
``_paper``) that ``create_model_card`` puts into the run folder's ``README.md``; GRPOTrainer's say
"GRPO" and DeepSeekMath. The card's base model is the model config's ``_name_or_path`` unless it is
a local folder, and peft's ``base_model_name_or_path`` is that same field when the adapter is made:
for a model loaded from mrtpo's preset cache both are a local path, which names nothing elsewhere.
:class:`ModelCardMixin` gives MRTPOTrainer its own attributes and the names chosen by the command
(:meth:`ModelCardMixin.name_base_model`).
"""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

#: The MRTPO paper, as TRL's card template cites a trainer's method.
MRTPO_PAPER = {
    "title": "Each Reward to Its Relevant Tokens: Reward-Specific Token-Level Credit Assignment for Multi-Reward RL",
    "id": "2610.21439",
    "citation": textwrap.dedent("""\
        @article{zhai2026mrtpo,
            title        = {{Each Reward to Its Relevant Tokens: Reward-Specific Token-Level Credit Assignment for Multi-Reward RL}},
            author       = {Skylar Zhai and Haonan Wang and Zhining Liu and Linxin Song and Xuwei Ding and Jingcheng Liang and Jian Kang},
            year         = 2026,
            eprint       = {arXiv:2610.21439},
        }"""),  # noqa: E501 - BibTeX fields kept whole, as TRL's card prints them
}


class ModelCardMixin:
    """Put before ``GRPOTrainer`` in the bases: MRTPO's card attributes, and the base model's name."""

    _tag_names = ["trl", "grpo", "mrtpo"]
    _name = "MRTPO"
    _paper = MRTPO_PAPER
    #: The base model as the card names it (None: TRL's own rule, the config's ``_name_or_path``).
    base_model_name: str | None = None
    #: A paragraph the card adds on the base weights (a dequantised GGUF), or None.
    base_weights_note: str | None = None

    def name_base_model(
        self, card_name: str | None, adapter_name: str | None = None, weights_note: str | None = None
    ) -> None:
        """Name the base model on the model card (``card_name``) and in each LoRA adapter's
        ``adapter_config.json`` (``adapter_name``; None leaves peft's value); ``weights_note``: a
        paragraph the card adds on the base weights (:func:`mrtpo.model_names.base_weights_note`)."""
        self.base_model_name = card_name
        self.base_weights_note = weights_note
        peft_config = getattr(self.model, "peft_config", None)
        if adapter_name and isinstance(peft_config, dict):
            for config in peft_config.values():
                config.base_model_name_or_path = adapter_name

    def create_model_card(
        self, model_name: str | None = None, dataset_name: str | None = None, tags: str | list[str] | None = None
    ) -> None:
        """TRL's card, naming :attr:`base_model_name` and tagged with the credit method."""
        tags = [tags] if isinstance(tags, str) else list(tags or [])
        method = getattr(getattr(self, "args", None), "method", None)
        if method:
            tags.append(f"mrtpo-method-{method}")
        config: Any = self.model.config  # a PeftModel forwards .config to its base model's
        before = getattr(config, "_name_or_path", None)
        if self.base_model_name:
            config._name_or_path = self.base_model_name
        try:
            super().create_model_card(model_name=model_name, dataset_name=dataset_name, tags=tags)  # type: ignore[misc]
        finally:
            config._name_or_path = before
        card = Path(self.args.output_dir) / "README.md"  # type: ignore[attr-defined]
        if self.base_weights_note and card.is_file() and self.base_weights_note not in card.read_text():
            text = card.read_text()
            at = text.find("\n## ", text.find("## Quick start") + 1)  # after the quick start, before the rest
            at = len(text) if at < 0 else at
            card.write_text(text[:at].rstrip("\n") + f"\n\n{self.base_weights_note}\n\n" + text[at:].lstrip("\n"))


__all__ = ["MRTPO_PAPER", "ModelCardMixin"]
