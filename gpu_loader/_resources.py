"""Where the package's data files live once installed.

The repository's top-level ``kernels/`` folder is installed as the data-only package
``gpu_loader.kernels``; this module is the one place that finds it.
"""

from __future__ import annotations

from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path


def kernel_dir() -> Traversable:
    """The installed ``kernels/`` folder (CUDA sources and the CPU emulation header)."""
    try:
        found = resources.files("gpu_loader.kernels")
    except ModuleNotFoundError:
        found = None
    if found is not None and found.joinpath("README.md").is_file():
        return found
    # A source checkout used without installing: the folder beside the package.
    here = Path(__file__).resolve().parent.parent / "kernels"
    if here.joinpath("README.md").is_file():
        return here
    raise FileNotFoundError(
        "gpu_loader's kernels/ folder is missing from this installation; "
        "reinstall the package (pip install --force-reinstall gpu-loader)"
    )


def read_kernel(name: str) -> str:
    """The text of ``kernels/<name>``, e.g. ``read_kernel("fused_resize.cu")``."""
    entry = kernel_dir().joinpath(name)
    if not entry.is_file():
        raise FileNotFoundError(f"kernel source {name!r} is not in {kernel_dir()}")
    return entry.read_text(encoding="utf-8")
