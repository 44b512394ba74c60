"""Where samples come from and in what order (see README.md in this folder).

Indexes (``ImageFolder``, ``FileList``, ``TarShards``) implement ``SampleIndex``: keys,
labels and byte reads. ``Sampler`` orders, shards and resumes; ``sample_rng`` gives each
sample its own deterministic random stream (``sample_stream``: the same, as a key the native
transform code draws from in C).
"""

from __future__ import annotations

from gpu_loader.sources._base import SampleIndex
from gpu_loader.sources._distributed import resolve_distributed
from gpu_loader.sources._filelist import FileList
from gpu_loader.sources._folder import IMG_EXTENSIONS, ImageFolder
from gpu_loader.sources._io import (
    MAX_FILE_BYTES,
    BufferTooSmallError,
    is_url,
    max_file_bytes,
    set_max_file_bytes,
)
from gpu_loader.sources._open import open_index
from gpu_loader.sources._rng import SampleStream, sample_rng, sample_stream
from gpu_loader.sources._sampler import Sampler
from gpu_loader.sources._tar import TarShards, expand_urls

__all__ = [
    "IMG_EXTENSIONS",
    "MAX_FILE_BYTES",
    "BufferTooSmallError",
    "FileList",
    "ImageFolder",
    "SampleIndex",
    "SampleStream",
    "Sampler",
    "TarShards",
    "expand_urls",
    "is_url",
    "max_file_bytes",
    "open_index",
    "resolve_distributed",
    "sample_rng",
    "sample_stream",
    "set_max_file_bytes",
]
