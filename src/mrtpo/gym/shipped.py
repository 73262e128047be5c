"""The gym's shipped warm-started policies: the same starting weights on every machine.

A warm start is not bit-reproducible across CPUs (2,000 optimizer steps amplify the last bits of
different kernels), so a comparison run on two machines would start from two policies. The package
therefore ships the warm starts of each family's default settings for warm-start seeds 0, 1 and 2
(``task_args={policy: {seed: s}}``), built once by ``scripts/build_gym_policies.py``, in
``policies/<task>-<digest>/`` under the folder name the cache would give them. ``MANIFEST.json``
lists every file's sha256 and is itself pinned here (:data:`SHIPPED_MANIFEST_SHA256`): a changed
file is an error that names it, never a silently different policy. Settings that are not shipped
are built and cached as before (:func:`mrtpo.gym.policy.ensure_warm_start`).

The policies (24 MB) live in the source tree, not in the wheel: an install from a checkout (the
README's ``bash scripts/setup.sh``, editable) has them; a wheel install has none and builds each warm
start on first use, saying so (:func:`policies_installed`).
"""

from __future__ import annotations

import hashlib
import json
from functools import lru_cache
from pathlib import Path
from typing import Any

POLICIES_DIR = Path(__file__).resolve().parent / "policies"
#: sha256 of ``policies/MANIFEST.json`` (printed by scripts/build_gym_policies.py).
SHIPPED_MANIFEST_SHA256 = "80edc54b34730fbbf71e24633d45780d2a2ac1c9db2ca3538ca6ad6a4c293cad"


class ShippedPolicyError(RuntimeError):
    """A shipped policy's files differ from the pinned manifest."""


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@lru_cache(maxsize=4)
def _manifest(folder: Path, pinned: str | None) -> dict[str, Any]:
    path = folder / "MANIFEST.json"
    if not path.is_file():
        return {"policies": {}}
    digest = _sha256(path)
    if digest != pinned:
        raise ShippedPolicyError(
            f"{path} has sha256 {digest}, but mrtpo.gym.shipped pins {pinned}: the shipped "
            "policies were changed; reinstall mrtpo, or rebuild them with "
            "scripts/build_gym_policies.py and pin the printed sha256"
        )
    return json.loads(path.read_text())


def policies_installed(folder: Path | None = None) -> bool:
    """Whether this install carries the shipped policies (a source checkout does, a wheel does not)."""
    return ((folder or POLICIES_DIR) / "MANIFEST.json").is_file()


NOT_INSTALLED = (
    "this install carries no shipped gym policies (the wheel leaves out their 24 MB), so the warm start is "
    "built here and differs from the pinned one docs/results used; install from a source checkout "
    "(bash scripts/setup.sh) to start from the shipped policies"
)


def shipped_policies(folder: Path | None = None) -> dict[str, dict[str, Any]]:
    """``{folder name: entry}`` of the pinned manifest (task, warm-start seed, file hashes)."""
    return _manifest(folder or POLICIES_DIR, SHIPPED_MANIFEST_SHA256)["policies"]


def shipped_policy(task, folder: Path | None = None) -> Path | None:
    """The shipped folder of ``task``'s warm start, its files checked against the manifest; None when
    its settings are not shipped."""
    from mrtpo.gym.policy import policy_spec, warm_start_dir

    root = folder or POLICIES_DIR
    name = warm_start_dir(task, policy_spec(task), root).name
    entry = shipped_policies(root).get(name)
    if entry is None:
        return None
    for file, digest in entry["files"].items():
        path = root / name / file
        if not path.is_file() or _sha256(path) != digest:
            raise ShippedPolicyError(
                f"shipped gym policy file {path} is missing or differs from its pinned "
                f"sha256 {digest[:12]}…; reinstall mrtpo"
            )
    return root / name


def load_shipped(folder: Path, dtype=None):
    """``(model, tokenizer)`` from a shipped policy folder, in eval mode."""
    import torch
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

    tokenizer = PreTrainedTokenizerFast.from_pretrained(folder, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype or torch.float32, local_files_only=True)
    model.eval()
    return model, tokenizer


__all__ = [
    "NOT_INSTALLED",
    "POLICIES_DIR",
    "SHIPPED_MANIFEST_SHA256",
    "ShippedPolicyError",
    "load_shipped",
    "policies_installed",
    "shipped_policies",
    "shipped_policy",
]
