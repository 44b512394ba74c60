"""Which CPU implementation runs: the native C fast path or the Pillow path.

Both compute the same function (transform-semantics.md). ``native`` is the compiled
extension ``gpu_loader.ops._native`` (libjpeg-turbo region decode streamed into a fused
resize, normalise and cast); it is built at install time when a C compiler and libjpeg's
headers are present. ``pillow`` is the pure-Python-plus-libraries path (simplejpeg decode,
Pillow resize, OpenCV normalise), always available. ``$GPU_LOADER_CPU_BACKEND`` chooses:
``auto`` (default: native when built), ``native`` (an error if it is not built) or
``pillow``.
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Iterator
from types import ModuleType
from typing import Literal

CpuBackend = Literal["native", "pillow"]
ENV_VAR = "GPU_LOADER_CPU_BACKEND"
_CHOICES = ("auto", "native", "pillow")
_BUILD_HINT = (
    "the native CPU fast path (gpu_loader.ops._native) is not built; install a C compiler "
    "and libjpeg's headers (Debian/Ubuntu: apt-get install gcc libjpeg-dev; Fedora: "
    "dnf install gcc libjpeg-turbo-devel), then reinstall from the checkout (it is on no "
    "package index): pip install --force-reinstall --no-deps . there (-e . for an "
    "editable install; make setup after rm .venv/.installed)"
)


def cpu_backend() -> CpuBackend:
    """The CPU implementation in use: "native" or "pillow" (see ``$GPU_LOADER_CPU_BACKEND``)."""
    return "native" if native_module() is not None else "pillow"


def chosen() -> str:
    """``$GPU_LOADER_CPU_BACKEND``, validated: "auto" (the default), "native" or "pillow"."""
    choice = os.environ.get(ENV_VAR, "auto").strip().lower() or "auto"
    if choice not in _CHOICES:
        raise ValueError(f"${ENV_VAR} must be one of {_CHOICES}, got {choice!r}")
    return choice


@functools.cache
def native_module() -> ModuleType | None:
    """The native extension when it is chosen and built, else None (cached per process)."""
    choice = chosen()
    if choice == "pillow":
        return None
    try:
        from gpu_loader.ops import _native
    except ImportError:
        if choice == "native":
            raise ImportError(f"${ENV_VAR}=native, but {_BUILD_HINT}") from None
        return None
    return _native


@contextlib.contextmanager
def forced(backend: CpuBackend) -> Iterator[None]:
    """Run the block on ``backend`` (benchmarks and tests); the previous choice comes back."""
    if backend not in ("native", "pillow"):
        raise ValueError(f"`backend` must be 'native' or 'pillow', got {backend!r}")
    before = os.environ.get(ENV_VAR)
    os.environ[ENV_VAR] = backend
    native_module.cache_clear()
    try:
        native_module()  # raises here, with the build hint, if native is asked for and missing
        yield
    finally:
        if before is None:
            os.environ.pop(ENV_VAR, None)
        else:
            os.environ[ENV_VAR] = before
        native_module.cache_clear()


def build_hint() -> str:
    """How to get the native backend, for messages and `gpu-loader inspect`."""
    return _BUILD_HINT
