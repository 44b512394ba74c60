"""TarShards: WebDataset-style tar shards, indexed once so samples are read at random.

A sample is the group of members sharing a key (``dir/key.jpg`` + ``dir/key.cls``).
Each shard is scanned once for its members' data offsets and sizes; a read is then one
ranged read (``pread`` locally, ``cat_file(start, end)`` through fsspec), so shards can
be shuffled globally instead of only streamed.
"""

from __future__ import annotations

import io
import itertools
import logging
import os
import posixpath
import re
import tarfile
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import IO, TYPE_CHECKING, Any

import numpy as np

from gpu_loader.sources import _io
from gpu_loader.sources._base import (
    apple_double,
    check_index,
    check_labels_index,
    fingerprint_of,
    parse_label,
)

if TYPE_CHECKING:
    from gpu_loader.sources._io import Buffer

_log = logging.getLogger("gpu_loader.sources")

# The sample's image, by extension: one of these per key (two is an error) ...
IMAGE_EXTENSIONS = frozenset({"jpg", "jpeg", "png", "webp"})
# ... else one of these, the other formats the decoders take (`ops.sniff`), so a key with a
# ``.jpg`` and a ``.tif`` companion (a scan, a mask) stays the ``.jpg`` sample it was.
OTHER_IMAGE_EXTENSIONS = frozenset({"gif", "bmp", "tif", "tiff", "ppm", "pgm", "pbm", "pnm"})
ALL_IMAGE_EXTENSIONS = IMAGE_EXTENSIONS | OTHER_IMAGE_EXTENSIONS
LABEL_EXTENSION = "cls"

# WebDataset's rule: the key is everything up to the first dot of the file name.
# DOTALL and \Z: a name may hold a newline (QA54: "new\nline/a.jpg" had no key).
_KEY_EXT = re.compile(r"\A((?:.*/|)[^./][^./]*)\.([^/]*)\Z", re.DOTALL)

# (image member name, data offset, data size, label or -1)
_Entry = tuple[str, int, int, int]


class TarShards:
    """Samples from uncompressed tar shards (local paths or fsspec URLs), in shard order.

    ``urls`` is a list, or one string that may hold brace patterns
    (``"train-{0000..0099}.tar"``). Keys are ``"<shard>:<member>"``; samples without a
    ``.cls`` member get label -1. Members whose names are absolute or contain ``..``,
    and members that are links or sparse files, make indexing fail with an error
    naming the member.
    """

    def __init__(
        self,
        urls: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
        *,
        classes: Sequence[str] | None = None,
        index_threads: int = 8,
    ) -> None:
        shards = (
            expand_urls(os.fspath(urls))
            if isinstance(urls, str | os.PathLike)
            else [os.fspath(u) for u in urls]
        )
        if not shards:
            raise ValueError("TarShards needs at least one shard path or URL, got none")
        # Relative local paths made absolute, as every index's (QA54: after an os.chdir,
        # every read of "train.tar" failed as not found).
        shards = [_io.anchored(shard) for shard in shards]
        _refuse_repeats(shards)
        if index_threads < 1:
            raise ValueError(f"`index_threads` must be >= 1, got {index_threads}")
        self.urls = shards
        self.classes = list(classes) if classes is not None else []
        # Remote shards are indexed concurrently: each scan is mostly waiting on I/O.
        with ThreadPoolExecutor(max_workers=min(index_threads, len(shards))) as pool:
            scanned = list(pool.map(_scan_named, shards))
        per_shard = [entries for entries, _ in scanned]
        # Local shards: what each was when indexed, checked at every read (a shard
        # rewritten in place would be read at stale offsets). Remote ones are trusted:
        # asking an object store would cost a request per sample.
        self._stamps = [stamp for _, stamp in scanned]
        counts = [len(entries) for entries in per_shard]
        self._shard = np.repeat(np.arange(len(shards), dtype=np.int32), counts)
        entries = [e for shard_entries in per_shard for e in shard_entries]
        self._members = [e[0] for e in entries]
        self._offsets = np.fromiter((e[1] for e in entries), np.int64, len(entries))
        self._sizes = np.fromiter((e[2] for e in entries), np.int64, len(entries))
        self._labels = np.fromiter((e[3] for e in entries), np.int64, len(entries))
        self._labels.flags.writeable = False
        self._fingerprint: str | None = None
        named = self._labels[self._labels != -1]  # -1: a sample without a .cls
        check_labels_index(named, self.classes, "TarShards", " (-1: no .cls member)")
        if unlabelled := len(self._labels) - len(named):
            # QA65: a tar of class folders ("tar cf s.tar class_00 class_01") gave every
            # sample -1 without a word, and training failed later at its loss.
            _log.warning(
                "TarShards: %d of %d samples have no .cls member and get label -1 (labels "
                "come from a <key>.cls member beside each image, not from folder names: "
                "for a tar of class folders, use ImageFolder on the folders, or an fsspec "
                "URL into the tar, tar://::%s)",
                unlabelled,
                len(self._labels),
                shards[0],
            )

    def __len__(self) -> int:
        return len(self._members)

    def __repr__(self) -> str:
        return f"TarShards({len(self)} samples in {len(self.urls)} shards)"

    def key(self, i: int) -> str:
        j = check_index(i, len(self))
        return f"{self.urls[self._shard[j]]}:{self._members[j]}"

    def label(self, i: int) -> int:
        return int(self._labels[check_index(i, len(self))])

    @property
    def labels(self) -> np.ndarray[tuple[int], np.dtype[np.int64]]:
        return self._labels

    def read(self, i: int) -> bytes:
        j = check_index(i, len(self))
        shard = self._shard[j]
        return _io.read_range(self.key(j), self.urls[shard], *self._span(j), self._stamps[shard])

    def _read_local_run(
        self, indices: Sequence[int]
    ) -> tuple[list[bytes | Exception], list[float]] | None:
        """`read` on each of ``indices`` in one native call (`_io.read_local_ranges`: one
        release of the GIL for all) when each shard is a local file: per index its bytes
        or the error `read` raises, and each read's seconds; None otherwise (`read` them
        one by one)."""
        js = [check_index(i, len(self)) for i in indices]
        shards = [int(self._shard[j]) for j in js]
        spans = [self._span(j) for j in js]
        return _io.read_local_ranges(
            [self.key(j) for j in js],
            [self.urls[s] for s in shards],
            [offset for offset, _ in spans],
            [size for _, size in spans],
            [self._stamps[s] for s in shards],
        )

    def readinto(self, i: int, buf: Buffer) -> int:
        j = check_index(i, len(self))
        shard = self._shard[j]
        return _io.readinto_range(
            self.key(j), self.urls[shard], *self._span(j), buf, self._stamps[shard]
        )

    def nbytes(self, i: int) -> int | None:
        return int(self._sizes[check_index(i, len(self))])

    def fingerprint(self) -> str:
        # Shard base names, not full URLs: the same shards copied elsewhere still match.
        if self._fingerprint is None:
            names = (
                f"{posixpath.basename(self.urls[s])}:{m}"
                for s, m in zip(self._shard.tolist(), self._members, strict=True)
            )
            self._fingerprint = fingerprint_of(names, self._labels)
        return self._fingerprint

    def _span(self, j: int) -> tuple[int, int]:
        return int(self._offsets[j]), int(self._sizes[j])


def _refuse_repeats(shards: Sequence[str]) -> None:
    """A shard listed twice (also as a path and as its file:// URL) would give its
    samples twice per epoch, as a brace pattern naming it twice would."""
    seen: dict[object, str] = {}
    for shard in shards:
        same = _identity(shard)
        if same in seen:
            raise ValueError(
                f"the shard list names one shard twice ({seen[same]!r} and {shard!r}): its "
                "samples would come twice per epoch"
            )
        seen[same] = shard


def _identity(shard: str) -> object:
    """What names one shard however it is spelled: a local file's device and inode (a
    symlink or a hard link to it is the same file), else the URL as fsspec resolves it
    (``memory://a/s.tar``, ``memory:///a/s.tar`` and ``memory://a/./s.tar`` are one).
    A local cache in front of a shard (``simplecache::``) does not make it another one."""
    links = shard.split("::") if _io.chained(shard) else [shard]
    while len(links) > 1 and links[0].partition("://")[0] in _CACHE_LINKS:
        links = links[1:]
    shard = "::".join(links)
    path = _io.local_path(shard)
    if path is not None:
        try:
            st = os.stat(path)
        except OSError:
            return os.path.realpath(path)  # TarShards says what is wrong with it
        return st.st_dev, st.st_ino
    try:
        fs, inner = _io.fsspec_fs(shard)
    except Exception:  # no such protocol, say: reported when the shard is opened
        return shard
    return fs, inner


# fsspec's caching file systems: a link of these in front of a URL names the same data.
_CACHE_LINKS = frozenset({"simplecache", "filecache", "blockcache", "cached"})


def expand_urls(pattern: str) -> list[str]:
    """Expand ``{a,b}`` lists (nested too) and ``{000..099}`` / ``{0..98..2}`` ranges, as
    bash and WebDataset do for these: a range is zero-padded to its wider end when either
    end has a leading zero. Letter and negative ranges (``{a..c}``, ``{-1..1}``) stay
    literal text, and a backward range is refused. A pattern that names one path twice is
    refused (a shard read twice would give its samples twice per epoch), and so is one
    that expands to more than `MAX_EXPANDED_URLS` (1,000,000) names (a range is counted
    before it is built; a product of several as soon as the names built so far pass it)."""
    urls = _expand(pattern, pattern)
    seen: set[str] = set()
    for url in urls:
        if url in seen:
            raise ValueError(f"the brace pattern {pattern!r} names {url!r} more than once")
        seen.add(url)
    return urls


def _expand(pattern: str, whole: str, at: int = 0) -> list[str]:
    """Expand the first brace group at or after ``at`` (and then the rest)."""
    start = pattern.find("{", at)
    if start < 0:
        return [pattern]
    depth, commas = 0, []
    for end in range(start, len(pattern)):
        char = pattern[end]
        if char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
            if depth == 0:
                break
        elif char == "," and depth == 1:
            commas.append(end)
    else:  # no closing brace: the rest is literal text
        return [pattern]
    head, body, tail = pattern[:start], pattern[start + 1 : end], pattern[end + 1 :]
    choices: list[str] | None
    if commas:
        cuts = [start, *commas, end]
        choices = [pattern[a + 1 : b] for a, b in itertools.pairwise(cuts)]
    else:
        choices = _range(body, whole)
    if choices is None:  # neither a list nor a range: literal text, as in bash
        return _expand(pattern, whole, end + 1)
    # A choice may hold braces itself: expansion goes on from where it starts.
    urls: list[str] = []
    for c in choices:
        urls += _expand(head + c + tail, whole, len(head))
        _check_count(len(urls), whole)
    return urls


# The most names a brace pattern may expand to: ten times the shards of the largest public
# WebDataset corpora. QA: a typo like s{0..999999999999}.tar was expanded whole first,
# taking the machine's memory before any check.
MAX_EXPANDED_URLS = 1_000_000


def _check_count(count: int, whole: str) -> None:
    if count > MAX_EXPANDED_URLS:
        raise ValueError(
            f"the brace pattern {whole!r} expands to more than {MAX_EXPANDED_URLS:,} names; "
            "is a range mistyped?"
        )


def _range(body: str, whole: str) -> list[str] | None:
    """The values of ``a..b`` or ``a..b..step``; None for anything else."""
    span = re.fullmatch(r"([0-9]+)\.\.([0-9]+)(?:\.\.([0-9]+))?", body)  # ASCII, as bash
    if span is None:
        return None
    lo, hi, step_text = span.group(1), span.group(2), span.group(3)
    if int(hi) < int(lo):
        raise ValueError(f"brace range {{{body}}} in {whole!r} runs backwards")
    step = int(step_text) if step_text is not None else 1
    if step < 1:
        raise ValueError(f"brace range {{{body}}} in {whole!r} needs a step >= 1")
    _check_count((int(hi) - int(lo)) // step + 1, whole)  # before building the list
    padded = any(len(end) > 1 and end.startswith("0") for end in (lo, hi))
    width = max(len(lo), len(hi)) if padded else 0
    return [str(n).zfill(width) for n in range(int(lo), int(hi) + 1, step)]


def check_member_name(name: str, shard: str) -> None:
    """Refuse names that would escape an extraction folder (absolute, drive, or ``..``)."""
    normal = name.replace("\\", "/")
    if normal.startswith("/") or re.match(r"^[A-Za-z]:/", normal) or ".." in normal.split("/"):
        raise ValueError(
            f"tar shard {shard!r} has a member named {name!r} that escapes the archive "
            "(absolute path or '..'); refusing the shard. Rebuild it with relative member names"
        )


def _scan_named(shard: str) -> tuple[list[_Entry], _io.Stamp | None]:
    """`_scan_shard`, its errors naming the shard. A filesystem's own (a timeout, or a
    credentials error that is no OSError) did not say which of the shards failed (QA)."""
    try:
        return _scan_shard(shard)
    except (ImportError, MemoryError):  # "Install s3fs to ..."; the machine's
        raise
    except Exception as exc:
        if shard in str(exc):  # ours name it
            raise
        said = f"tar shard {shard!r} could not be read: {type(exc).__name__}: {exc}".rstrip(": ")
        try:  # an OSError or ValueError keeps its kind (FileNotFoundError, TimeoutError, ...)
            named = type(exc)(said) if isinstance(exc, OSError | ValueError) else OSError(said)
        except Exception:
            named = OSError(said)
        raise named from exc


def _scan_shard(shard: str) -> tuple[list[_Entry], _io.Stamp | None]:
    """Scan one shard: ``(image member, offset, size, label)`` per sample, in archive
    order; and the shard's `_io.file_stamp` when it is a local file."""
    with _open_shard(shard) as f:
        stamp = _io.file_stamp(f.fileno()) if _io.local_path(shard) is not None else None
        try:
            # Closed by the `with tar` below; the open itself needs the error rewrite.
            tar = tarfile.open(fileobj=f, mode="r:")  # noqa: SIM115
        except tarfile.ReadError as exc:
            compressed = _looks_compressed(shard)
            hint = (
                "random access needs plain .tar shards, so decompress it first"
                if compressed
                else "it is not a tar file, or it is truncated or corrupt"
            )
            raise ValueError(
                f"tar shard {shard!r} is not an uncompressed tar archive ({exc}); {hint}"
            ) from None
        with tar:
            size = _size_of(f)
            try:
                entries = _group(shard, tar, size)
            except tarfile.TarError as exc:  # a member whose data would start past the end
                raise ValueError(f"tar shard {shard!r} is truncated or corrupt: {exc}") from exc
            _check_end(shard, tar, size)
            return entries, stamp


def _check_end(shard: str, tar: tarfile.TarFile, size: int) -> None:
    """tarfile ends its walk quietly at any header after the first that it cannot read
    (a bad checksum, a block cut short), and the members after it were lost with no
    error: the walk must have stopped at tar's end-of-archive marker (a zero block)."""
    end = tar.offset  # where the header that ended the walk starts
    f: Any = tar.fileobj
    f.seek(end)
    block = f.read(tarfile.BLOCKSIZE)
    if len(block) == tarfile.BLOCKSIZE and block.count(0) == tarfile.BLOCKSIZE:
        _check_tail(shard, f, end, size)
        return
    if not block:  # a cut that fell on a header boundary, or a writer without the marker
        _log.warning(
            "tar shard %r ends at byte %d without tar's end-of-archive marker: it may have "
            "been cut short, with samples (or the label of its last one) lost",
            shard,
            end,
        )
        return
    what = "damaged (its checksum fails)" if len(block) == tarfile.BLOCKSIZE else "cut short"
    raise ValueError(
        f"tar shard {shard!r} is truncated or corrupt: the member header at byte {end:,} of "
        f"{size:,} is {what}, so the members after it cannot be found"
    )


def _check_tail(shard: str, f: Any, end: int, size: int) -> None:
    """tarfile takes one zero block as the end of the archive, so a header zeroed in
    place, or shards joined with ``cat``, lost every member after it with no error (QA).
    The end is two zero blocks; what follows them is the record's padding, which POSIX
    leaves undefined (QA: refusing any non-zero byte there refused conforming archives),
    so only a block there that reads as a member header is refused, unless it is a
    stale copy left by the writer (`_stale_copies`)."""
    block_size = tarfile.BLOCKSIZE
    second = f.read(block_size)
    if second and second.count(0) != len(second):
        where = "a member header zeroed in place"
    else:
        records = _record_sizes(end, size)
        found: list[tuple[int, bytes]] = []  # the header blocks after the marker
        at = end + 2 * block_size
        while len(block := f.read(block_size)) == block_size:
            if block.count(0) != block_size and _is_header(block):
                found.append((at, block))
                if not records:  # no record could hold it: another archive, at once
                    break
            at += block_size
        if not found or _stale_copies(f, end, records, found):
            return
        where = f"tar files joined with cat (a member header at byte {found[0][0]:,})"
    raise ValueError(
        f"tar shard {shard!r} goes on past its end-of-archive marker at byte {end:,} of "
        f"{size:,}: {where}; the members after it cannot be indexed (`tar --ignore-zeros` "
        "reads joined files: extract and rewrite the shard)"
    )


STALE_WINDOW = 1 << 20
"""The largest record size a stale copy is looked for at (GNU tar's blocking factor
2048)."""


def _record_sizes(end: int, size: int) -> list[int]:
    """The record sizes the archive could have been written in with its end marker in the
    last record: multiples of 512 up to `STALE_WINDOW` that divide its size (a writer pads
    the archive to whole records) and reach back to the marker."""
    top = min(STALE_WINDOW, size)
    block_size = tarfile.BLOCKSIZE
    return [r for r in range(block_size, top + 1, block_size) if not size % r and size - r <= end]


def _stale_copies(f: Any, end: int, records: list[int], found: list[tuple[int, bytes]]) -> bool:
    """Whether every header block after the end marker is a copy of the block one record
    back, for one record size: what a writer that reuses its record buffer leaves in the
    last record's padding (QA: such a copy was refused as another archive). Matching by
    member name erred both ways: a stale GNU long-name or PAX block, whose name no member
    has, was refused; and another shard joined with ``cat`` whose member names repeat this
    one's (shard-local keys) passed, its members lost. So did any equal block in the last
    MiB (QA: two shards with the same names, sizes and mtimes). Another archive joined
    after this one passes only if its headers repeat this archive's, at one distance that
    divides the joined size, from inside this archive's last record: never in practice."""
    if not records:
        return False
    start = max(0, end - max(records))
    f.seek(start)
    data = f.read(end - start)
    block_size = tarfile.BLOCKSIZE
    return any(
        all(
            at - r >= start and data[at - r - start : at - r - start + block_size] == block
            for at, block in found
        )
        for r in records
    )


def _is_header(block: bytes) -> bool:
    """Whether a 512-byte block reads as a tar member header (its checksum holds)."""
    try:
        tarfile.TarInfo.frombuf(block, tarfile.ENCODING, "surrogateescape")
    except tarfile.HeaderError:
        return False
    return True


# Magic numbers of the compressions a .tar is often wrapped in (gzip, bzip2, xz, zstd).
_COMPRESSED_MAGIC = (b"\x1f\x8b", b"BZh", b"\xfd7zXZ\x00", b"\x28\xb5\x2f\xfd")


def _looks_compressed(shard: str) -> bool:
    try:
        with _open_shard(shard) as f:
            head = f.read(6)
    except OSError:
        return False
    return head.startswith(_COMPRESSED_MAGIC)


def _open_shard(shard: str) -> IO[bytes]:
    path = _io.local_path(shard)
    try:
        if path is not None:  # a FIFO or a device as a shard would hang or never end
            return io.BufferedReader(_io.open_regular(shard, path, what="tar shard"))
        # A shard inside an archive (zip://in.tar::outer.zip) is read through the outer
        # archive's file system, which closes its file when collected: `fsspec_fs` keeps
        # it for this thread (QA54: "seek of closed file" when it was dropped here).
        fs, inner = _io.fsspec_fs(shard, fresh=True)
        return fs.open(inner, "rb")  # type: ignore[no-any-return]
    except FileNotFoundError:
        raise FileNotFoundError(f"tar shard {shard!r} not found") from None


def _size_of(f: IO[bytes]) -> int:
    here = f.tell()
    size = f.seek(0, os.SEEK_END)
    f.seek(here)
    return size


def _group(shard: str, tar: tarfile.TarFile, shard_size: int) -> list[_Entry]:
    images: dict[str, tuple[str, int, int]] = {}  # key -> (member, offset, size), archive order
    others: dict[str, tuple[str, int, int]] = {}  # the first other-format image per key
    labels: dict[str, int] = {}
    odd: list[tuple[str | None, str]] = []  # (key or None, member): image-like, not an image
    for member in tar:
        check_member_name(member.name, shard)
        if member.isdir():
            continue
        if member.issparse():
            raise ValueError(
                f"tar shard {shard!r} member {member.name!r} is a sparse file; shards may "
                "hold only plain regular files (make the shard without --sparse)"
            )
        if not member.isreg():
            raise ValueError(
                f"tar shard {shard!r} member {member.name!r} is a link or special file; "
                "shards may hold only regular files"
            )
        if member.offset_data + member.size > shard_size:
            # tarfile stops quietly at a cut that falls inside a member's data.
            raise ValueError(
                f"tar shard {shard!r} is truncated or corrupt: member {member.name!r} needs "
                f"{member.offset_data + member.size} bytes, the shard has {shard_size}"
            )
        if apple_double(posixpath.basename(member.name)):
            continue  # not an image, no word of it
        parts = _KEY_EXT.match(member.name)
        if parts is None:
            if _image_like(member.name):
                odd.append((None, member.name))  # a dot-file such as ".x.jpg": no key
            continue
        key, ext = parts.group(1), parts.group(2).lower()
        where = (member.name, member.offset_data, member.size)
        if ext in ALL_IMAGE_EXTENSIONS:
            # Two of one list for a key is an error; a main format wins over the others.
            chosen = images if ext in IMAGE_EXTENSIONS else others
            if key in chosen:
                raise ValueError(
                    f"tar shard {shard!r} has two images for the key {key!r} "
                    f"({chosen[key][0]!r} and {member.name!r}); keep one image per key"
                )
            chosen[key] = where
        elif ext == LABEL_EXTENSION:
            if key in labels:
                raise ValueError(
                    f"tar shard {shard!r} has two labels for the key {key!r} (a second "
                    f"{member.name!r}); keep one label per key"
                )
            labels[key] = _read_label(tar, member, shard)
        elif _image_like(ext):
            odd.append((key, member.name))  # "k.v2.jpg": key "k", extension "v2.jpg"
    if others.keys() - images.keys():  # keys with only another format's image: in
        images = {  # archive order, by where each key's image member is
            k: v for k, v in sorted({**others, **images}.items(), key=lambda item: int(item[1][1]))
        }
    # Lost: an image-like member whose key has no image (a companion such as
    # "k.seg.png" beside "k.jpg" is not), and a label whose key has none.
    lost = [name for key, name in odd if key is None or key not in images]
    _warn_lost(shard, lost, [f"{k}.cls" for k in labels if k not in images], len(images))
    return [(m, off, size, labels.get(key, -1)) for key, (m, off, size) in images.items()]


def _image_like(name: str) -> bool:
    """An image extension ends ``name`` (its last dot-part)."""
    return name.rsplit(".", 1)[-1].lower() in ALL_IMAGE_EXTENSIONS if "." in name else False


def _warn_lost(shard: str, lost: list[str], unmatched: list[str], samples: int) -> None:
    """Say which members hold an image or a label that no sample takes: the samples
    they were meant for are not in the index, and nothing else would tell."""
    if not lost and not unmatched:
        return
    parts = []
    if lost:
        parts.append(
            f"{len(lost)} image member(s) no sample takes ({_examples(lost)}): a sample's "
            "key is the name up to its first dot, so 'a.v2.jpg' has the extension 'v2.jpg', "
            "and a name starting with a dot has no key"
        )
    if unmatched:
        parts.append(
            f"{len(unmatched)} label(s) without an image ({_examples(unmatched)}); "
            f"image extensions: {', '.join(sorted(ALL_IMAGE_EXTENSIONS))}"
        )
    _log.warning("tar shard %r: %s; indexed %d sample(s) from it", shard, "; ".join(parts), samples)


def _examples(names: list[str], limit: int = 3) -> str:
    shown = ", ".join(repr(n) for n in names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


def _read_label(tar: tarfile.TarFile, member: tarfile.TarInfo, shard: str) -> int:
    # A direct read: extractfile builds a file object per label and doubles the scan
    # time. tarfile re-seeks to the next header itself, so moving the position is safe.
    if member.size > _MAX_LABEL_BYTES:  # read at index time, whole: not a label
        raise ValueError(
            f"tar shard {shard!r} member {member.name!r} should hold an integer label, but "
            f"it is {member.size:,} bytes"
        )
    f: Any = tar.fileobj
    f.seek(member.offset_data)
    text = f.read(member.size).decode("utf-8", "replace").strip()
    label = parse_label(text, f"tar shard {shard!r} member {member.name!r}")
    if label is None:  # the rule of a CSV list's labels: ASCII digits, no "1_0"
        raise ValueError(
            f"tar shard {shard!r} member {member.name!r} should hold an integer label, "
            f"got {text[:40]!r}"
        )
    return label


_MAX_LABEL_BYTES = 64  # an int64 in decimal with spaces and a newline fits many times
