"""Where a figure was measured: the machine, its load and the library versions.

Below every command (``mrtpo eval``, the benchmarks) so each can stamp its results with it.
"""

from __future__ import annotations

import os
import platform
from pathlib import Path
from typing import Any

__all__ = ["machine_info"]


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
    info: dict[str, Any] = {"platform": platform.platform(), "cpu": cpu, "cpus": os.cpu_count(),
                            "threads": torch.get_num_threads(), "gpu": gpu, "python": platform.python_version(),
                            "torch": torch.__version__, "load_average": os.getloadavg()}
    try:
        import transformers

        info["transformers"] = transformers.__version__
    except ImportError:  # pragma: no cover
        pass
    info["summary"] = f"{gpu or cpu}, {info['cpus']} CPUs ({info['threads']} torch threads), torch {torch.__version__}"
    return info
