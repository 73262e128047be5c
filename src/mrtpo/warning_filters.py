"""Narrow filters for warnings raised inside the pinned dependencies, which a user cannot act on.

Each filter names the exact message and the module that raises it, so a warning about the user's
own settings or code (or a new one after an upgrade) still shows. Installed by the ``mrtpo``
command line; a library user keeps Python's defaults unless they call
:func:`filter_dependency_warnings` themselves.
"""

from __future__ import annotations

import warnings

#: ``(category, message regex, module regex, why)``. Re-check each when a pin moves.
DEPENDENCY_WARNINGS: tuple[tuple[type[Warning], str, str, str], ...] = (
    (
        FutureWarning,
        r"`(is_gradient_checkpointing|gradient_checkpointing_enable|gradient_checkpointing_disable)` "
        r"is deprecated",
        r"transformers\.modeling_utils",
        "TRL 1.16 and peft 0.21 still call transformers 5.25's old activation-checkpointing names",
    ),
    (
        UserWarning,
        r"Could not find a config file in .* - will assume that the vocabulary was not modified",
        r"peft\.utils\.save_and_load",
        "saving a LoRA adapter offline, peft cannot fetch the base's config to compare vocabularies; mrtpo's "
        "LoRA targets linear layers only (all-linear leaves the embeddings and the head) and never resizes them",
    ),
)

__all__ = ["DEPENDENCY_WARNINGS", "filter_dependency_warnings"]


def filter_dependency_warnings() -> None:
    """Ignore the warnings of :data:`DEPENDENCY_WARNINGS` (each by category, message and module)."""
    for category, message, module, _why in DEPENDENCY_WARNINGS:
        warnings.filterwarnings("ignore", message=message, category=category, module=module)
