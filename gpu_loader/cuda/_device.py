"""Is there a CUDA device this process can use? Asked lazily, never at import."""

from __future__ import annotations

import functools
import importlib


@functools.cache
def cuda_available() -> bool:
    """True when torch sees at least one usable CUDA device.

    torch, not CuPy, decides: every CUDA piece of the loader goes through it (the runtime
    port's streams, events and pinned memory; the CPU path's copies and pinning), so a
    device only CuPy sees (a CPU build of torch beside cupy-cuda12x) is not usable, and
    ``device="auto"`` must not pick it. Missing packages, a missing driver and zero
    devices all read as False; the answer is cached for the life of the process.
    """
    try:
        torch = importlib.import_module("torch")
        return bool(torch.cuda.is_available())
    except Exception:  # no torch, no driver, no device: all mean "not usable"
        return False
