"""gpu_loader: a thread-based PyTorch image data loader.

Importing this package needs neither a GPU nor any GPU package: torch, cupy,
nvImageCodec and NVML are imported lazily by the modules that use them.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # static names for type checkers; at run time they load on first use
    from gpu_loader import batching, cuda, datasets, monitor, ops, pipeline, sources
    from gpu_loader._failed import FailedSample
    from gpu_loader.loader import ImageLoader, LoaderOptions
    from gpu_loader.pipeline import PipelineFailure

__version__ = "0.1.0"

# Names resolved lazily on first use so `import gpu_loader` stays cheap and torch-free.
_LAZY = {
    "FailedSample": "gpu_loader._failed",
    "ImageLoader": "gpu_loader.loader",
    "LoaderOptions": "gpu_loader.loader",
    "PipelineFailure": "gpu_loader.pipeline",
    "datasets": "gpu_loader.datasets",
    "batching": "gpu_loader.batching",
    "cuda": "gpu_loader.cuda",
    "monitor": "gpu_loader.monitor",
    "ops": "gpu_loader.ops",
    "pipeline": "gpu_loader.pipeline",
    "sources": "gpu_loader.sources",
}

__all__ = [
    "FailedSample",
    "ImageLoader",
    "LoaderOptions",
    "PipelineFailure",
    "__version__",
    "batching",
    "cuda",
    "datasets",
    "monitor",
    "ops",
    "pipeline",
    "sources",
]


def __getattr__(name: str) -> Any:
    target = _LAZY.get(name)
    if target is None:
        raise AttributeError(f"module 'gpu_loader' has no attribute {name!r}")
    module = importlib.import_module(target)
    value = module if target.endswith("." + name) else getattr(module, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
