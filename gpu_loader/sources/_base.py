"""The ``SampleIndex`` protocol and the shared one-file-per-sample index."""

from __future__ import annotations

import hashlib
import operator
import re
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import numpy as np

from gpu_loader.sources import _io

if TYPE_CHECKING:
    from gpu_loader.sources._io import Buffer


@runtime_checkable
class SampleIndex(Protocol):
    """What the loader needs from a dataset: keys, labels and a way to read bytes.

    Every method takes a sample index ``0 <= i < len(index)``; reads raise errors that
    name the sample's key (``FileNotFoundError`` for a missing file). `ImageLoader` calls
    ``len``, ``key``, ``labels``, ``read``, ``nbytes`` and ``fingerprint`` (and
    ``readinto`` on the GPU path); ``label`` and ``classes`` are for the user.
    """

    classes: list[str]

    def __len__(self) -> int: ...

    def key(self, i: int) -> str:
        """A stable, human-readable key: the path or URL, or ``shard.tar:member``."""
        ...

    def label(self, i: int) -> int: ...

    @property
    def labels(self) -> np.ndarray[tuple[int], np.dtype[np.int64]]:
        """All labels, int64, one per sample (-1 where a sample has none)."""
        ...

    def read(self, i: int) -> bytes: ...

    def readinto(self, i: int, buf: Buffer) -> int:
        """Write sample ``i`` into ``buf``; returns the byte count (BufferTooSmallError if it won't fit)."""
        ...

    def nbytes(self, i: int) -> int | None:
        """The sample's size in bytes when known cheaply, else None."""
        ...

    def fingerprint(self) -> str:
        """A stable hash of the keys and labels (resume checks compare it)."""
        ...


def apple_double(name: str) -> bool:
    """Whether the file name ``name`` is a macOS resource fork ("._x.jpg", left by copies
    from a Mac): no image, and as a sample a decode failure per epoch (torchvision lists
    them). ImageFolder and TarShards pass them over."""
    return name.startswith("._")


def check_index(i: int, length: int) -> int:
    """``i`` as a plain int in ``[0, length)``; IndexError otherwise."""
    j = operator.index(i)
    if not 0 <= j < length:
        raise IndexError(f"sample index {j} is out of range for an index of {length} samples")
    return j


def check_label(label: object, where: str) -> int:
    """A label must be an integer (numpy integers too, never bool or float)."""
    if isinstance(label, bool) or not isinstance(label, int | np.integer):
        raise TypeError(f"label of {where} must be an int, got {label!r} ({type(label).__name__})")
    value = int(label)
    if not -(2**63) <= value < 2**63:  # labels travel as int64 tensors
        raise ValueError(f"label of {where} does not fit in int64, got {value}")
    return value


_INTEGER = re.compile(r"[+-]?[0-9]+")


def parse_label(text: str, where: str) -> int | None:
    """The integer ``text`` writes in ASCII digits (spaces around it allowed), checked as a
    label; None for anything else. ``int()`` alone also took ``1_000`` and full-width
    digits, which no list of labels means."""
    text = text.strip()
    if not _INTEGER.fullmatch(text):
        return None
    digits = text.lstrip("+-").lstrip("0")
    if len(digits) > 19:  # past int64 (and int() refuses more than 4,300 digits: QA63)
        sign = text[0] if text[0] in "+-" else ""
        shown = sign + (digits if len(digits) <= 24 else f"{digits[:20]}...")
        raise ValueError(
            f"label of {where} does not fit in int64, got {shown} ({len(digits):,} digits)"
        )
    return check_label(int(text), where)


def check_labels_index(
    labels: Sequence[int] | np.ndarray, classes: Sequence[str], what: str, note: str = ""
) -> None:
    """With ``classes`` named, every label must index them (``labels``: those to check)."""
    if not classes or not len(labels):
        return
    low, high = int(np.min(labels)), int(np.max(labels))
    if not 0 <= low <= high < len(classes):
        raise ValueError(
            f"{what} labels span {low}..{high} but {len(classes)} classes were named; each "
            f"label must index `classes`{note}"
        )


def fingerprint_of(names: Iterable[str], labels: np.ndarray) -> str:
    """sha256 over (name, label) pairs; the first 16 bytes as hex are plenty for a check."""
    h = hashlib.sha256()
    count = 0
    for name, label in zip(names, labels.tolist(), strict=True):
        # surrogateescape: a file name that is not UTF-8 (legal on Linux) arrives from
        # os.listdir / tarfile with its bytes escaped; they hash as those bytes.
        h.update(f"{name}\0{label}\n".encode("utf-8", "surrogateescape"))
        count += 1
    h.update(f"count={count}".encode())
    return h.hexdigest()[:32]


class FileIndex:
    """Shared body of indexes with one file (local path or URL) per sample.

    A sample's key is ``prefix + names[i] + suffix``: ImageFolder stores paths relative
    to its root once (half the memory of keeping both) and fingerprints the relative
    names (the suffix: the rest of a chained URL, ``zip://a.jpg::s3://b/d.zip``);
    FileList's prefix is its ``root``, the working folder when every path is relative,
    or empty (its names are then whole paths and URLs). ``sizes`` may hold -1 for "unknown"; local files are
    then ``stat``-ed on the first ``nbytes`` call and cached (lazily, so listing a huge
    folder stays one walk).
    """

    classes: list[str]

    def __init__(
        self,
        names: Sequence[str],
        labels: np.ndarray,
        sizes: np.ndarray | None,
        classes: list[str],
        prefix: str = "",
        suffix: str = "",
    ) -> None:
        self._names = list(names)
        self._prefix = prefix
        self._suffix = suffix
        self._labels = np.ascontiguousarray(labels, dtype=np.int64)
        self._labels.flags.writeable = False
        n = len(self._names)
        self._sizes = np.full(n, -1, np.int64) if sizes is None else np.asarray(sizes, np.int64)
        self._fingerprint: str | None = None
        self.classes = classes

    def __len__(self) -> int:
        return len(self._names)

    def __repr__(self) -> str:
        if self.classes or len(self) == 0:
            return f"{type(self).__name__}({len(self)} samples, {len(self.classes)} classes)"
        low, high = int(self._labels.min()), int(self._labels.max())  # labels, no class names
        return f"{type(self).__name__}({len(self)} samples, labels {low}..{high}, unnamed)"

    _suffix = ""  # indexes pickled before it existed

    def key(self, i: int) -> str:
        return self._prefix + self._names[check_index(i, len(self))] + self._suffix

    def label(self, i: int) -> int:
        return int(self._labels[check_index(i, len(self))])

    @property
    def labels(self) -> np.ndarray[tuple[int], np.dtype[np.int64]]:
        return self._labels  # read-only view: callers cannot corrupt the index

    def read(self, i: int) -> bytes:
        key = self.key(i)
        return self._whole(i, key, _io.read_file(key, key))

    def _read_local_run(
        self, indices: Sequence[int]
    ) -> tuple[list[bytes | Exception], list[float]] | None:
        """`read` on each of ``indices`` in one native call (`_io.read_local_files`: one
        release of the GIL for all) when each is a local file: per index its bytes or the
        error `read` raises, and each read's seconds; None when one is a URL or the native
        backend is not built (`read` them one by one)."""
        keys = [self.key(i) for i in indices]
        paths = [_io.local_path(key) for key in keys]
        if None in paths:
            return None
        return _io.read_local_files(keys, [p for p in paths if p is not None])

    def readinto(self, i: int, buf: Buffer) -> int:
        key = self.key(i)
        if _io.local_path(key) is not None:
            return _io.readinto_file(key, key, buf)
        data = self.read(i)
        return _io.copy_into(key, data, _io.byte_view(buf, key))

    def _whole(self, i: int, key: str, data: bytes) -> bytes:
        """``data``, or EOFError when a URL's read gave fewer bytes than its listing said
        (QA: reported as the decoder's "truncated", not as the read that cut it short)."""
        size = int(self._sizes[i])
        if 0 <= len(data) < size and _io.local_path(key) is None:
            raise EOFError(
                f"sample {key!r}: the read gave {len(data):,} of the {size:,} bytes its "
                "listing gave (cut short in transit, or the file changed since indexing)"
            )
        return data

    def nbytes(self, i: int) -> int | None:
        j = check_index(i, len(self))
        size = int(self._sizes[j])
        if size >= 0:
            return size
        location = self._prefix + self._names[j] + self._suffix
        if _io.local_path(location) is None:
            return None  # a remote size needs a request: not cheap
        try:
            size = _io.file_size(location)
        except FileNotFoundError:
            raise _io.not_found(location, location) from None
        self._sizes[j] = size
        return size

    def fingerprint(self) -> str:
        if self._fingerprint is None:
            self._fingerprint = fingerprint_of(self._names, self._labels)
        return self._fingerprint
