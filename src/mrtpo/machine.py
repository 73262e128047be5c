"""Facts about the machine: where a figure was measured (the machine, its load and the library
versions, :func:`machine_info`), the CPU's feature flags and the dtype and trainer settings they call
for on a CPU run (:func:`cpu_flags`, :func:`choose_cpu_dtype`, :func:`cpu_run_defaults`).

Below every command (``mrtpo eval``, the benchmarks, the config of ``mrtpo train``) so each can use it.
"""

from __future__ import annotations

import os
import platform
from pathlib import Path
from typing import Any

__all__ = ["BF16_CPU_FLAGS", "choose_cpu_dtype", "cpu_flags", "cpu_run_defaults", "machine_info"]


def machine_info() -> dict[str, Any]:
    """Where a figure was measured: CPU or GPU, cores, torch threads, versions, load average.

    ``summary`` is a one-line description for tables and Markdown.
    """
    import torch

    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    info: dict[str, Any] = {
        "platform": platform.platform(),
        "cpu": cpu,
        "cpus": os.cpu_count(),
        "threads": torch.get_num_threads(),
        "gpu": gpu,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "load_average": os.getloadavg(),
    }
    try:
        import transformers

        info["transformers"] = transformers.__version__
    except ImportError:  # pragma: no cover
        pass
    info["summary"] = f"{gpu or cpu}, {info['cpus']} CPUs ({info['threads']} torch threads), torch {torch.__version__}"
    return info


def cpu_run_defaults() -> dict[str, Any]:
    """Trainer settings for a machine without CUDA: train on the CPU in fp32 (TRL defaults to bf16 +
    checkpointing); none where CUDA is available."""
    import torch

    if torch.cuda.is_available():
        return {}
    return {"use_cpu": True, "bf16": False, "activation_checkpointing": False}


#: ``/proc/cpuinfo`` flags of native bf16 matrix instructions; without one, bf16 matmuls take slow paths.
BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16")


def cpu_flags(cpuinfo: str | os.PathLike = "/proc/cpuinfo") -> frozenset[str]:
    """The CPU's feature flags (the first ``flags`` line of ``cpuinfo``; empty where there is none)."""
    try:
        text = Path(cpuinfo).read_text()
    except OSError:
        return frozenset()
    for line in text.splitlines():
        if line.startswith("flags"):
            return frozenset(line.partition(":")[2].split())
    return frozenset()


def choose_cpu_dtype(flags: frozenset[str], lora: bool, given: str | None = None) -> tuple[str, str]:
    """``(dtype, one line saying why)`` for a CPU run with these feature ``flags``.

    bf16 only pays for frozen base weights (``lora``) on a CPU with native bf16 matmuls
    (:data:`BF16_CPU_FLAGS`); trainable weights stay float32. ``given``: the user's own dtype, which wins.
    """
    fast = [f for f in BF16_CPU_FLAGS if f in flags]
    cpu = f"CPU with {'/'.join(fast).upper()}" if fast else "CPU without AVX512-BF16/AMX"
    if given is not None:
        slow = " (bf16 matmuls are slow here; float32 would be faster)" if given == "bfloat16" and not fast else ""
        return given, f"{cpu}: {given} weights as configured{slow}"
    if not lora:
        return "float32", f"{cpu}: float32 weights (full fine-tuning trains them; bf16 weights would lose the updates)"
    if fast:
        return "bfloat16", f"{cpu}: bfloat16 base weights (native bf16 matmuls; the LoRA adapters train in float32)"
    return "float32", f"{cpu}: float32 weights (bf16 matmuls are slow here)"
