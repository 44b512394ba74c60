"""FileList: an explicit list of ``(path_or_url, label)``, in code or from a CSV."""

from __future__ import annotations

import csv
import io
import os
import posixpath
from collections.abc import Iterable, Sequence

import numpy as np

from gpu_loader.sources import _io
from gpu_loader.sources._base import FileIndex, check_label


class FileList(FileIndex):
    """Samples given as ``(path_or_url, label)`` pairs, kept in the given order.

    Paths may be local (read with the zero-copy fast path) or any fsspec URL; both kinds
    may be mixed. ``classes`` optionally names the labels (``classes[label]``).
    """

    def __init__(
        self,
        items: Iterable[tuple[str | os.PathLike[str], int]],
        *,
        classes: Sequence[str] | None = None,
    ) -> None:
        locations: list[str] = []
        labels: list[int] = []
        for n, item in enumerate(items):
            try:
                path, label = item
            except (TypeError, ValueError):
                raise TypeError(
                    f"FileList item {n} must be a (path_or_url, label) pair, got {item!r}"
                ) from None
            if not isinstance(path, str | os.PathLike):
                raise TypeError(f"FileList item {n}: path must be a str, got {path!r}")
            location = os.fspath(path)
            if not location:
                raise ValueError(f"FileList item {n}: path is empty")
            locations.append(location)
            labels.append(check_label(label, f"FileList item {n} ({location!r})"))
        names = list(classes) if classes is not None else []
        if names and labels and not 0 <= min(labels) <= max(labels) < len(names):
            raise ValueError(
                f"FileList labels span {min(labels)}..{max(labels)} but {len(names)} classes "
                "were named; each label must index `classes`"
            )
        super().__init__(locations, np.array(labels, np.int64), None, names)

    @classmethod
    def from_csv(
        cls, path: str | os.PathLike[str], *, classes: Sequence[str] | None = None
    ) -> FileList:
        """Read a CSV with the header ``path,label`` (extra columns are ignored).

        Relative paths are taken relative to the CSV's own folder (or URL), so a dataset
        folder with its CSV inside can be moved as a whole.
        """
        location = os.fspath(path)
        try:
            text = _io.read_file(location, location).decode("utf-8-sig")
        except FileNotFoundError:
            raise FileNotFoundError(f"CSV file {location!r} not found") from None
        rows = csv.reader(io.StringIO(text))
        header = [h.strip() for h in next(rows, [])]
        if "path" not in header or "label" not in header:
            raise ValueError(
                f"CSV {location!r} must start with a header row naming the columns "
                f"'path' and 'label', got {header!r}"
            )
        p_col, l_col = header.index("path"), header.index("label")
        base = _base_of(location)
        items: list[tuple[str, int]] = []
        for line, row in enumerate(rows, start=2):
            if not row or all(not c.strip() for c in row):
                continue  # blank lines are harmless
            if len(row) <= max(p_col, l_col):
                raise ValueError(f"CSV {location!r} line {line}: too few columns in {row!r}")
            try:
                label = int(row[l_col].strip())
            except ValueError:
                raise ValueError(
                    f"CSV {location!r} line {line}: label {row[l_col]!r} is not an integer"
                ) from None
            items.append((_join(base, row[p_col].strip()), label))
        return cls(items, classes=classes)


def _base_of(location: str) -> str:
    if _io.local_path(location) is not None and not location.startswith("file://"):
        return os.path.dirname(location)
    return posixpath.dirname(location)


def _join(base: str, entry: str) -> str:
    if _io.is_url(entry) or os.path.isabs(entry) or not base:
        return entry
    if _io.is_url(base):
        return f"{base.rstrip('/')}/{entry}"
    return os.path.join(base, entry)
