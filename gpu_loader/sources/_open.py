"""``open_index``: pick the index type from what a path or URL looks like."""

from __future__ import annotations

import os
from typing import Literal

from gpu_loader.sources import _io
from gpu_loader.sources._base import SampleIndex
from gpu_loader.sources._filelist import FileList
from gpu_loader.sources._folder import ImageFolder
from gpu_loader.sources._tar import TarShards, expand_urls

# Compressed tars go to TarShards too, whose error says to decompress them (random access
# needs plain .tar): taken for a folder, they were "not a folder".
_TAR_SUFFIXES = (".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tar.xz", ".tar.zst")


def open_index(path_or_url: str | os.PathLike[str]) -> SampleIndex:
    """``*.tar`` (brace patterns allowed) → TarShards, ``*.csv`` → FileList, else ImageFolder.

    A path that exists as written is taken as it is, braces and all."""
    location = os.fspath(path_or_url)
    if not location:
        raise ValueError("open_index needs a path or URL, got an empty string")
    # A folder or list named with braces ("x{a,b}") is not a pattern.
    literal = "{" in location and _exists(location)
    shards = [location] if literal else expand_urls(location)
    if all(kind_by_name(s) == "tar" for s in shards):
        return TarShards(shards)  # a compressed one is refused there, saying why
    if len(shards) > 1:
        raise ValueError(
            f"the brace pattern {location!r} expands to several paths that are not all .tar "
            "shards; only tar shards can be given as a pattern"
        )
    if kind_by_name(location) == "csv":
        return FileList.from_csv(location)
    return ImageFolder(location)


def kind_by_name(location: str) -> Literal["tar", "csv", "folder"]:
    """What `open_index` takes ``location`` for, by its name alone: a tar shard, a CSV
    list, or else a folder. The name is the link naming the file (a CSV inside a zip,
    ``zip://l.csv::s3://b/z.zip``, is a list: QA, it was taken for a folder)."""
    name = _io.path_link(location).lower()
    if name.endswith(_TAR_SUFFIXES):
        return "tar"
    return "csv" if name.endswith(".csv") else "folder"


def _exists(location: str) -> bool:
    path = _io.local_path(location)
    try:
        if path is not None:
            return os.path.exists(path)
        fs, inner = _io.fsspec_fs(location)
        return bool(fs.exists(inner))
    except Exception:  # the pattern's own error says more
        return False
