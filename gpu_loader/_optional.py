"""Optional GPU backends: availability probes and install hints.

GPU packages are extras. Code that needs one calls :func:`require`, which imports
it or raises an ``ImportError`` naming the pip packages (and the extra) that provide it.
"""

from __future__ import annotations

import importlib
import importlib.util
from types import ModuleType

# module name -> (what it is, its pip packages for CUDA 12 and for CUDA 13); each is
# also in the package's [cuda12] / [cuda13] extra.
_PROVIDERS: dict[str, tuple[str, str, str]] = {
    "cupy": ("CuPy", "cupy-cuda12x", "cupy-cuda13x"),
    "nvidia.nvimgcodec": (
        "nvImageCodec",
        "'nvidia-nvimgcodec-cu12[nvjpeg]'",
        "'nvidia-nvimgcodec-cu13[nvjpeg]'",
    ),
    "pynvml": ("NVML bindings (nvidia-ml-py)", "nvidia-ml-py", "nvidia-ml-py"),
    "torch": ("PyTorch", "torch", "torch"),  # its hint asks for a pinned build
}


def install_hint(module: str) -> str:
    """The pip command that provides ``module``. gpu-loader is installed from its
    checkout (it is not on a package index), so the hint names the packages themselves."""
    if module == "torch":
        return "pip install torch  (pin a CPU or CUDA build that suits the machine)"
    _, cuda12, cuda13 = _PROVIDERS.get(module, (module, module, module))
    if cuda12 == cuda13:
        return f"pip install {cuda12}  (or the checkout's [cuda12] extra)"
    return (
        f"pip install {cuda12} for CUDA 12, {cuda13} for CUDA 13  (or the checkout's "
        "[cuda12] / [cuda13] extra: pip install '.[cuda12]')"
    )


def require(module: str, feature: str) -> ModuleType:
    """Import ``module`` for ``feature`` or raise an ImportError saying what to install."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        what = _PROVIDERS[module][0] if module in _PROVIDERS else module
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
