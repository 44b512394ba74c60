"""Optional GPU backends: availability probes and install hints.

GPU packages are extras. Code that needs one calls :func:`require`, which imports
it or raises an ``ImportError`` naming the extra that provides it.
"""

from __future__ import annotations

import importlib
import importlib.util
from types import ModuleType

# module name -> (what it is, the pip extra that provides it)
_PROVIDERS: dict[str, tuple[str, str]] = {
    "cupy": ("CuPy", "cuda12"),
    "nvidia.nvimgcodec": ("nvImageCodec", "cuda12"),
    "pynvml": ("NVML bindings (nvidia-ml-py)", "cuda12"),
    "torch": ("PyTorch", "torch"),
}


def install_hint(module: str) -> str:
    """The pip command that provides ``module``."""
    _, extra = _PROVIDERS.get(module, (module, "cuda12"))
    if extra == "torch":
        return "pip install torch  (pin a CPU or CUDA build that suits the machine)"
    return f"pip install 'gpu-loader[{extra}]'  (or [cuda13] for CUDA 13)"


def require(module: str, feature: str) -> ModuleType:
    """Import ``module`` for ``feature`` or raise an ImportError saying what to install."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        what, _ = _PROVIDERS.get(module, (module, ""))
        raise ImportError(
            f"{feature} needs {what} (module {module!r}), which is not importable: {exc}. "
            f"Install it with: {install_hint(module)}"
        ) from None


def is_importable(module: str) -> bool:
    """True when ``module`` can be imported (without importing it)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False
