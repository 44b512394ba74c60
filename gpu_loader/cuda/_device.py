"""Is there a CUDA device this process can use? Asked lazily, never at import."""

from __future__ import annotations

import functools
import importlib


@functools.cache
def cuda_available() -> bool:
    """True when CuPy (or, failing that, torch) sees at least one usable CUDA device.

    Missing packages, a missing driver and zero devices all read as False; the answer
    is cached for the life of the process.
    """
    try:
        cupy = importlib.import_module("cupy")
        return int(cupy.cuda.runtime.getDeviceCount()) > 0
    except Exception:  # no cupy, no driver, no device: all mean "not usable"
        pass
    try:
        torch = importlib.import_module("torch")
        return bool(torch.cuda.is_available())
    except Exception:
        return False
