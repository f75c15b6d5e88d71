"""The memory a run can take now, for the families' checks that a run fits before anything is
allocated or written: MemAvailable of /proc/meminfo on a CPU, the free memory on CUDA."""
from __future__ import annotations

from pathlib import Path

import torch

GIB = 2 ** 30


def available_bytes(device: torch.device) -> int | None:
    """The memory a run on `device` can take now (bytes): free CUDA memory, or the host's
    MemAvailable; None where it cannot be read."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None
