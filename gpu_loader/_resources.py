"""Where the package's data files live once installed, and where it keeps what it makes.

The repository's top-level ``kernels/`` folder is installed as the data-only package
``gpu_loader.kernels``; this module is the one place that finds it, and the one place
that decides the cache folder (`cache_root`).
"""

from __future__ import annotations

import os
import tempfile
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # importlib.resources.abc is new in Python 3.11
    from importlib.abc import Traversable


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
        "reinstall the package from its checkout (it is on no package index): "
        "pip install --force-reinstall --no-deps ."
    )


def read_kernel(name: str) -> str:
    """The text of ``kernels/<name>``, e.g. ``read_kernel("fused_resize.cu")``."""
    entry = kernel_dir().joinpath(name)
    if not entry.is_file():
        raise FileNotFoundError(f"kernel source {name!r} is not in {kernel_dir()}")
    return entry.read_text(encoding="utf-8")


def cache_root() -> Path:
    """Where the package keeps what it makes: generated datasets (the CLI, benchmarks and
    examples) and, under ``emulation/``, the CPU emulation builds of the CUDA kernels.

    ``$GPU_LOADER_CACHE``; else ``$GPU_LOADER_CACHE_DIR`` (the emulation's own variable
    before there was one for both, still honoured); else ``$XDG_CACHE_HOME/gpu_loader``;
    else ``~/.cache/gpu_loader``; else, with no writable home (some containers), a
    per-user folder in the temporary directory.
    """
    for var in ("GPU_LOADER_CACHE", "GPU_LOADER_CACHE_DIR"):
        if value := os.environ.get(var):
            return Path(value)
    if value := os.environ.get("XDG_CACHE_HOME"):
        return Path(value) / "gpu_loader"
    try:
        home: Path | None = Path.home()
    except RuntimeError:  # no $HOME and no passwd entry for this uid
        home = None
    if home is not None and home.is_dir() and os.access(home, os.W_OK):
        return home / ".cache" / "gpu_loader"
    return _private_temp_folder()


def _private_temp_folder() -> Path:
    """``<tmp>/gpu_loader-<uid>``, made private to this user; if someone else made it
    first (its name is predictable, and the kernels' emulation loads libraries from the
    cache), a fresh folder of our own instead."""
    folder = Path(tempfile.gettempdir()) / f"gpu_loader-{os.getuid()}"
    try:
        folder.mkdir(mode=0o700, exist_ok=True)
        info = folder.lstat()
        if info.st_uid == os.getuid() and not info.st_mode & 0o022 and folder.is_dir():
            return folder
    except OSError:
        pass
    return Path(tempfile.mkdtemp(prefix=f"gpu_loader-{os.getuid()}-"))
