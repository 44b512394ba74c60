"""Byte readers: a zero-copy fast path for local files and fsspec for every URL.

Local files are read with ``open(..., buffering=0).readinto`` straight into the
caller's buffer, so the GPU path can fill pinned host memory without an extra copy.
URLs (``s3://``, ``gs://``, ``http://``, ``memory://`` ...) go through fsspec, which
returns ``bytes``; ``readinto`` then copies once into the caller's buffer.
"""

from __future__ import annotations

import errno
import functools
import io
import os
import posixpath
import re
import stat
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from gpu_loader._compat import add_note

if TYPE_CHECKING:
    import numpy as np

    Buffer = memoryview | bytearray | np.ndarray[Any, Any]

# A scheme of two or more letters, so that a Windows drive ("C:\\x") is not a URL.
# A scheme, after any fsspec chain of them ("simplecache::s3://...").
_URL_RE = re.compile(r"^(?:[A-Za-z][A-Za-z0-9+.\-]*::)*[A-Za-z][A-Za-z0-9+.\-]+://")


class BufferTooSmallError(ValueError):
    """A sample does not fit the buffer given to ``readinto``.

    Carries ``key``, ``nbytes`` (the sample's size) and ``capacity`` (the buffer's
    size), so a caller can grow its buffer and retry; and ``data``, the sample's bytes
    where they had to be read whole to learn the size (a remote file), so that the retry
    copies them instead of downloading the file again (None otherwise).
    """

    def __init__(self, key: str, nbytes: int, capacity: int, data: bytes | None = None) -> None:
        super().__init__(
            f"sample {key!r} is {nbytes} bytes but the buffer holds only {capacity}; "
            f"pass a buffer of at least {nbytes} bytes (use nbytes(i) to size it)"
        )
        self.key = key
        self.nbytes = nbytes
        self.capacity = capacity
        self.data = data


MAX_FILE_BYTES = 1 << 30
"""The default limit on one sample's bytes (1 GiB). Far above any image within the default
pixel limit (an uncompressed 16-bit RGBA TIFF of 89.5 Mpx is 716 MB); it stops a hostile
or mistaken file (a 2 GB sparse "image", a database dump) from being read whole into
memory by every thread that meets it."""

_max_file_bytes: int | None = MAX_FILE_BYTES


def set_max_file_bytes(limit: int | None) -> None:
    """Set the per-sample byte limit for every index in this process (None: no limit).

    Like Pillow's ``Image.MAX_IMAGE_PIXELS``, a process-wide safety limit: raise it for
    datasets of very large files (and raise ``LoaderOptions.max_pixels`` with it).
    """
    global _max_file_bytes
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise ValueError(f"the file size limit must be an int >= 1 or None, got {limit!r}")
    _max_file_bytes = limit


def max_file_bytes() -> int | None:
    """The per-sample byte limit in force (`set_max_file_bytes`)."""
    return _max_file_bytes


def check_size(key: str, size: int) -> None:
    """Refuse a sample over the byte limit before any of it is read."""
    limit = _max_file_bytes
    if limit is not None and size > limit:
        raise _over_limit(key, size, limit)


def _over_limit(key: str, size: int, limit: int, *, grew: bool = False) -> ValueError:
    if grew:
        what = f"grew past the {limit:,}-byte limit for one sample while it was read"
    else:
        what = f"is {size:,} bytes, over the {limit:,}-byte limit for one sample"
    return ValueError(f"sample {key!r} {what}; gpu_loader.sources.set_max_file_bytes(n) raises it")


def open_regular(key: str, path: str, what: str = "sample") -> io.FileIO:
    """Open a local file for unbuffered reading, refusing anything but a regular file.

    A FIFO would block ``open`` until a writer came (an epoch that never ends), and a
    character device such as /dev/zero never ends at all: both are refused here with the
    sample's key. Opened non-blocking, so a FIFO fails at once; that flag changes nothing
    for a regular file.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        if special := _special_file(key, path, exc, what):
            raise special from None
        raise
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise _not_regular(key, path, mode, what)
        return io.FileIO(fd, "rb", closefd=True)  # owns fd from here
    except BaseException:
        os.close(fd)
        raise


def _special_file(key: str, path: str, exc: OSError, what: str) -> OSError | None:
    """The not-a-regular-file error for an ``open`` that failed before any ``fstat``
    could say what the file is: a socket (or a device without a driver) gives ENXIO or
    ENODEV, "No such device or address", which named no reason. None otherwise."""
    if exc.errno not in (errno.ENXIO, errno.ENODEV):
        return None
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return None
    return None if stat.S_ISREG(mode) else _not_regular(key, path, mode, what)


def _not_regular(key: str, path: str, mode: int, what: str) -> OSError:
    kind = _KINDS.get(stat.S_IFMT(mode), "not a regular file")
    return OSError(errno.EINVAL, f"{what} {key!r} is a {kind}, not a regular file", path)


_KINDS = {
    stat.S_IFDIR: "folder",
    stat.S_IFCHR: "character device",
    stat.S_IFBLK: "block device",
    stat.S_IFIFO: "FIFO (named pipe)",
    stat.S_IFSOCK: "socket",
}


def is_url(location: str) -> bool:
    """True when ``location`` has a URL scheme (``s3://``, ``memory://``, ``file://`` ...)."""
    return _URL_RE.match(location) is not None


def local_path(location: str) -> str | None:
    """The local file path behind ``location``, or None when it needs fsspec.

    ``file://`` URLs (and fsspec's other name for them, ``local://``) are local files, so
    they take the fast path too.
    """
    if location.startswith(LOCAL_SCHEMES):
        return location.partition("://")[2]
    return None if is_url(location) else location


LOCAL_SCHEMES = ("file://", "local://")
"""URL schemes of local files (fsspec's ``LocalFileSystem`` goes by both names)."""


def absolute(path: str) -> str:
    """``path`` made absolute (from the working folder) and tidied without changing what
    it names: "." and repeated "/" go, and ".." takes the component before it away only
    where that is no symlink. `os.path.abspath` takes it away in any case, which after a
    symlink names another file (QA63: ``lnk/..`` is the parent of the link's target, and
    the keys of a folder read through it named files that did not exist, or others)."""
    if not os.path.isabs(path):
        path = os.path.join(os.getcwd(), path)
    parts: list[str] = []
    for part in path.split("/"):
        if part in ("", "."):
            continue
        if part == "..":
            if not parts:  # the root's parent is the root
                continue
            if parts[-1] != ".." and not os.path.islink("/" + "/".join(parts)):
                parts.pop()
                continue
        parts.append(part)
    return "/" + "/".join(parts)


def anchored(location: str) -> str:
    """``location`` with a relative local path made absolute: a plain path, or a
    ``file://`` URL's (``file://d/x.jpg``, which fsspec and `local_path` read from the
    working folder). Other URLs are returned as they are. For what an index keeps, so a
    later ``os.chdir`` does not change what it names (QA54)."""
    if location.startswith(LOCAL_SCHEMES):
        scheme, _, path = location.partition("://")
        return location if os.path.isabs(path) else f"{scheme}://{absolute(path)}"
    return location if is_url(location) else absolute(location)


def add_key_note(exc: BaseException, key: str) -> None:
    """Attach the sample key to an exception raised while reading it."""
    add_note(exc, f"sample: {key}")


def not_found(key: str, location: str) -> FileNotFoundError:
    return FileNotFoundError(errno.ENOENT, f"sample {key!r} not found", location)


def byte_view(buf: Buffer, key: str) -> memoryview:
    """A writable, flat, unsigned-byte view of ``buf`` (no copy)."""
    # numpy's stubs for python 3.11 do not declare the buffer protocol ndarray has.
    view = memoryview(buf)  # type: ignore[arg-type]
    if view.readonly:
        raise ValueError(
            f"readinto for sample {key!r} needs a writable buffer, got a read-only one"
        )
    if not view.c_contiguous:
        raise ValueError(
            f"readinto for sample {key!r} needs a contiguous buffer; "
            "pass np.ascontiguousarray(...) or a bytearray"
        )
    if view.ndim != 1 or view.format != "B":
        view = view.cast("B")
    return view


# fsspec's chained URLs: "simplecache::s3://b/k", "zip://member::s3://b/a.zip".
_CHAINED_RE = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*::|::[A-Za-z][A-Za-z0-9+.-]*://")


def chained(url: str) -> bool:
    """Whether ``url`` chains fsspec protocols (``zip://a::s3://b``, ``simplecache::s3://b``),
    not a name that merely holds ``::``. A last link that is a local path, as fsspec
    takes it (``zip://a::/data/z.zip``), chains after a file system that reads another
    file (an archive's ``fo``, a cache's ``target_protocol``): no "::" there is a name."""
    if "::" not in url:
        return False
    if _CHAINED_RE.search(url) is not None:
        return True
    return _wraps_a_file(url.partition("://")[0]) if is_url(url) else False


@functools.lru_cache(maxsize=64)
def _wraps_a_file(protocol: str) -> bool:
    import inspect

    import fsspec

    try:
        cls = fsspec.get_filesystem_class(protocol)
        params = inspect.signature(cls.__init__).parameters
    except (ImportError, ValueError, TypeError):  # unknown or not installed: a name then
        return False
    return "fo" in params or "target_protocol" in params


def _path_link(url: str) -> tuple[list[str], int]:
    """``url``'s links (one unless chained) and the index of the first with a path
    (``proto://...``), -1 when none has one. A chain's last link that is a relative local
    path (``zip://::d.zip``) is made absolute: keys must not change with ``os.chdir`` (QA)."""
    links = url.split("::") if chained(url) else [url]
    if len(links) > 1 and links[-1] and "://" not in links[-1]:
        links[-1] = anchored(links[-1])
    return links, next((k for k, link in enumerate(links) if "://" in link), -1)


def url_affixes(root: str) -> tuple[str, str]:
    """``(prefix, suffix)`` with ``prefix + relative path + suffix`` the URL of a file under
    the fsspec URL ``root``. In a chained URL the path belongs to the first link that has
    one (``zip://c/a.jpg::memory://z.zip``): appended to the whole chain it named the
    archive's own path as a folder, and every read failed (QA)."""
    links, k = _path_link(root)
    if k < 0:
        return _as_folder(root), ""
    head = "::".join([*links[:k], _as_folder(links[k])])
    rest = links[k + 1 :]
    return head, "::" + "::".join(rest) if rest else ""


def _as_folder(url: str) -> str:
    """``url`` ending in one "/", so that a relative path appended names a file in it; a
    file system's root as written (``memory://``, ``file:///``: QA, stripped to
    ``file:/``, keys named nothing, also behind ``simplecache::``)."""
    if not url.partition("://")[2].strip("/"):
        return url
    return url.rstrip("/") + "/"


def path_link(url: str) -> str:
    """The link of a chained URL that holds its path (``zip://l/t.csv::s3://b/z.zip`` ->
    ``zip://l/t.csv``; ``simplecache::s3://b/s.tar`` -> ``s3://b/s.tar``); ``url`` itself
    when it is not chained. What names the file, its extension included."""
    links, k = _path_link(url)
    return links[k] if k >= 0 else url


def url_parent(url: str) -> str:
    """The URL of the folder ``url`` names a file in (``memory://a/l.csv`` -> ``memory://a``;
    in a chained URL, the link that holds the path: ``zip://l/t.csv::s3://b/z.zip`` ->
    ``zip://l::s3://b/z.zip``)."""
    links, k = _path_link(url)
    if k >= 0:
        protocol, _, path = links[k].partition("://")
        links[k] = f"{protocol}://{posixpath.dirname(path)}"  # memory://l.csv -> memory://
    return "::".join(links)


def fsspec_fs(url: str, *, fresh: bool = False) -> tuple[Any, str]:
    """The fsspec filesystem and in-filesystem path for ``url`` (instances are cached by
    fsspec), with the path's ``.`` and ``..`` segments resolved, as the OS resolves a
    local path's (a CSV's ``../imgs/a.jpg`` next to ``memory://lists/train.csv``).
    ``fresh``: an archive's file system is opened again, not this thread's (`_archive_fs`),
    for a listing, which must see the archive as it is now.

    A ``::`` that does not chain a protocol is part of a name ("x::y.jpg", which a
    listing returns): fsspec's `url_to_fs` would split the URL there."""
    import fsspec
    import fsspec.core

    if "::" in url and not chained(url):
        protocol = url.partition("://")[0]
        cls = fsspec.get_filesystem_class(protocol)
        # Stripped with the "::" hidden: some file systems leave a path holding one as it
        # is (memory:// then drops its leading "/").
        inner = cls._strip_protocol(url.replace("::", "\x00")).replace("\x00", "::")
        fs = cls(**cls._get_kwargs_from_urls(url))
    elif (archive := _archive_fs(url, fresh=fresh)) is not None:
        fs, inner = archive
        # An archive's names are its members' as written: "./a/x.jpg" from `tar -C d .`
        # is no "a/x.jpg" there (QA54). Looked up in its listing, which it holds in memory.
        if _resolve_dots(inner) != inner and fs.exists(inner):
            return fs, inner
    else:
        fs, inner = fsspec.core.url_to_fs(url)
    return fs, _resolve_dots(inner)


_ARCHIVES_PER_THREAD = 8
_archives = threading.local()


def _archive_fs(url: str, *, fresh: bool = False) -> tuple[Any, str] | None:
    """For a member of an archive (``zip://c/a.jpg::s3://b/z.zip``), this thread's file
    system over that archive and the member's path; None for any other URL.

    fsspec caches no archive file system (``cachable = False``), so `url_to_fs` opened
    and parsed the whole archive again for every member read: 63 ms a read in a zip of
    10,000 members, 192 ms in a tar of 5,000, an epoch quadratic in the archive's size
    (QA54). One per thread, not one shared: a tar file system reads through one file
    object, seeking. The last `_ARCHIVES_PER_THREAD` archives a thread read stay open,
    until the thread ends (an epoch's threads end with it), or, for a local archive,
    until it changes (size, modification time or inode: a notebook that rewrites it and
    lists it again sees the new one). A listing asks for a ``fresh`` one, which then
    replaces the thread's: a remote archive rewritten and indexed again is seen anew (QA56:
    the main thread, which never ends, kept listing the old one), but one rewritten while
    an index of it is in use is read through the listing that index was made from."""
    import fsspec
    import fsspec.core

    if not chained(url):
        return None
    links, k = _path_link(url)
    if k != 0 or len(links) < 2:
        return None
    protocol = links[0].partition("://")[0]
    try:
        cls = fsspec.get_filesystem_class(protocol)
    except (ImportError, ValueError):
        return None
    if getattr(cls, "cachable", True):
        return None  # fsspec keeps the instance itself
    archive = "::".join([f"{protocol}://", *links[1:]])
    stamp = None
    if len(links) == 2 and (path := local_path(links[1])) is not None:
        try:
            st = os.stat(path)
            stamp = (st.st_size, st.st_mtime_ns, st.st_ino)
        except OSError:
            pass  # fsspec says what is wrong with it
    opened: dict[str, tuple[Any, Stamp | None]] | None = getattr(_archives, "by_url", None)
    if opened is None:
        opened = _archives.by_url = {}
    held = opened.pop(archive, None)
    if held is not None and held[1] == stamp and not fresh:
        fs = held[0]
    else:
        fs = fsspec.core.url_to_fs(archive)[0]
        while len(opened) >= _ARCHIVES_PER_THREAD:
            opened.pop(next(iter(opened)))
    opened[archive] = (fs, stamp)  # the most recent last
    return fs, cls._strip_protocol(links[0])


def _resolve_dots(path: str) -> str:
    """``path`` without its ``.`` segments and with each ``..`` taking the segment before
    it away; empty segments (``a//b``, a key some object stores allow) are kept."""
    parts = path.split("/")
    if "." not in parts and ".." not in parts:
        return path
    out: list[str] = []
    for part in parts:
        if part == ".":
            continue
        if part == ".." and out and out[-1] != "..":
            if out[-1]:  # a name: "..", its parent
                out.pop()
            continue  # above the root (or after an empty segment): nothing to take away
        out.append(part)
    return "/".join(out)


# --------------------------------------------------------------------------- whole files


def file_size(location: str) -> int:
    """Size of a local file (one ``stat``); raises FileNotFoundError for a missing one."""
    path = local_path(location)
    if path is None:
        raise ValueError(f"file_size is for local files, got the URL {location!r}")
    return os.stat(path).st_size


def read_file(key: str, location: str) -> bytes:
    """All bytes of one file (local path or URL)."""
    path = None
    try:
        path = local_path(location)
        if path is not None:
            return _read_local(key, path)
        return _read_url_capped(key, location)
    except OSError as exc:
        error = _read_error(key, location, path, exc)
        if error is exc:
            raise
        raise error from None


def _read_error(key: str, location: str, path: str | None, exc: OSError) -> OSError:
    """What `read_file` raises for ``exc``: a missing file or a special one in their own
    words, any other error with the key noted on it (``path``: the local path, if any)."""
    if path is not None and (special := _special_file(key, path, exc, "sample")):
        return special  # never a FileNotFoundError's (ENXIO, ENODEV only)
    return _keyed_error(key, location, exc)


def read_local_files(
    keys: Sequence[str], paths: Sequence[str]
) -> tuple[list[bytes | Exception], list[float]] | None:
    """`read_file` on local files (``keys``, each its own location; ``paths``: their
    `local_path`s), all in one native call (one release of the GIL for the
    lot: per file, its retake waited behind the threads holding it, ~0.2-0.3 ms a tiny
    file on the 2-core dev machine): per file its bytes or the error `read_file` raises,
    and each read's seconds. None without the native backend."""
    from gpu_loader.ops._backend import native_module

    native = native_module()
    if native is None:
        return None
    limit = _file_limit()
    got, seconds = native.read_regulars(paths, -1 if limit is None else limit)
    out = [_local_outcome(k, p, one, limit) for k, p, one in zip(keys, paths, got, strict=True)]
    return out, seconds


def _local_outcome(
    key: str, path: str, got: bytes | tuple[int, int, int] | int | Exception, limit: int | None
) -> bytes | Exception:
    """One `read_regulars` result as `read_file` would give it: its bytes, or the error,
    with no traceback (QA74: raised in the caller's frame, it held every file of the call)."""

    def read() -> bytes:
        if isinstance(got, Exception):  # the path's conversion (a NUL in it)
            raise got
        if isinstance(got, int):
            if got < 0:
                raise MemoryError(f"out of memory reading {key!r}")
            raise OSError(got, os.strerror(got), path)  # its subclass, as the OS says
        return _local_bytes(key, path, got, limit)

    return _outcome(read, lambda exc: _read_error(key, key, path, exc))


def _outcome(read: Callable[[], bytes], mapped: Callable[[OSError], OSError]) -> bytes | Exception:
    """``read()``'s bytes, or the error it raised (an OSError as ``mapped`` words it, which
    its one-by-one twin raises from None) with no traceback: returned in a list for a
    whole run, one would hold the frames, and with them every file of the run."""
    try:
        return read()
    except OSError as exc:
        error: Exception = mapped(exc)
        if error is not exc:
            error.__suppress_context__ = True
    except Exception as exc:
        error = exc
    return error.with_traceback(None)


def read_list_file(location: str) -> bytes:
    """All bytes of a file that lists samples (a CSV): the per-sample byte limit is for
    images, not for a list of ten million URLs. Regular local files only, as for samples."""
    path = local_path(location)
    if path is None:
        fs, inner = fsspec_fs(location, fresh=True)
        return fs.cat_file(inner)  # type: ignore[no-any-return]
    with open_regular(location, path, what="file list") as f:
        return f.readall()


def _read_local(key: str, path: str) -> bytes:
    """A local file's bytes: one native call where the extension is built (Python's file
    calls release and retake the GIL once per system call, and with many threads each
    retake waits), else Python's; the same checks either way."""
    from gpu_loader.ops._backend import native_module

    limit = _file_limit()
    native = native_module()
    if native is None:
        with open_regular(key, path) as f:
            size = os.fstat(f.fileno()).st_size
            if limit is None:
                return f.readall()
            if size > limit:
                raise _over_limit(key, size, limit)
            return _read_capped(f, key, limit)  # a file may hold more than fstat said
    return _local_bytes(key, path, native.read_regular(path, -1 if limit is None else limit), limit)


def _file_limit() -> int | None:
    """The per-file byte limit, read once (another thread may change it meanwhile);
    beyond any file size, None: no limit."""
    limit = _max_file_bytes
    if limit is not None and limit >= _C_LONG_MAX:
        return None
    return limit


def _local_bytes(
    key: str, path: str, got: bytes | tuple[int, int, int], limit: int | None
) -> bytes:
    """A native read's bytes, or the error for the file it refused (mode, size, grew)
    under ``limit``."""
    if isinstance(got, bytes):
        return got
    mode, size, grew = got
    if not stat.S_ISREG(mode):
        raise _not_regular(key, path, mode, "sample")
    if limit is None:  # only a file that is not regular is refused without a limit
        raise AssertionError(f"read_regular refused {key!r} without a reason")
    raise _over_limit(key, size, limit, grew=bool(grew))


_C_LONG_MAX = 2**63 - 1  # a larger limit is no limit (no file is larger; nor does it fit C)


def _read_capped(f: io.FileIO, key: str, limit: int) -> bytes:
    """Read to EOF, refusing the file once it passes ``limit`` bytes (a /proc file claims
    0 bytes, and a file may grow while it is read)."""
    chunks: list[bytes] = []
    total = 0
    while True:
        chunk = f.read(limit + 1 - total)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)
        total += len(chunk)
        if total > limit:
            raise _over_limit(key, total, limit, grew=True)


def _read_url_capped(key: str, location: str) -> bytes:
    """A whole file through fsspec, refused once it passes the byte limit.

    A size request per sample would cost a round trip on object stores, so the read asks
    for one byte more than the limit (a ranged read) and refuses what reaches it.
    """
    fs, inner = fsspec_fs(location)
    limit = _max_file_bytes
    data = fs.cat_file(inner) if limit is None else fs.cat_file(inner, start=0, end=limit + 1)
    if not isinstance(data, bytes | bytearray):  # QA: a str, or None, was a TypeError in decode
        raise TypeError(
            f"sample {key!r}: the file system ({type(fs).__name__}) returned "
            f"{type(data).__name__}, not bytes"
        )
    if limit is not None and len(data) > limit:
        raise ValueError(
            f"sample {key!r} is more than {limit:,} bytes, the limit for one sample; "
            "gpu_loader.sources.set_max_file_bytes(n) raises it"
        )
    return bytes(data)


def readinto_file(key: str, location: str, buf: Buffer) -> int:
    """Read one whole file into ``buf``; returns the number of bytes written."""
    view = byte_view(buf, key)
    try:
        path = local_path(location)
        if path is None:
            return copy_into(key, read_file(key, location), view)
        with open_regular(key, path) as f:
            size = os.fstat(f.fileno()).st_size
            check_size(key, size)
            if size > view.nbytes:
                raise BufferTooSmallError(key, size, view.nbytes)
            return _readinto_exact(key, f, view[:size])
    except FileNotFoundError:
        raise not_found(key, location) from None
    except OSError as exc:
        add_key_note(exc, key)
        raise


# --------------------------------------------------------------------------- byte ranges


Stamp = tuple[int, int, int]
"""A local file's (size, mtime in ns, inode): what `file_stamp` reads at indexing."""


def file_stamp(fd: int) -> Stamp:
    st = os.fstat(fd)
    return st.st_size, st.st_mtime_ns, st.st_ino


def _check_stamp(key: str, location: str, fd: int, stamp: Stamp | None) -> None:
    """Refuse a read from a local file that changed since it was indexed: offsets into a
    tar shard rewritten in place would read other members' bytes, quietly (QA: two
    members swapped, each delivered with the other's pixels)."""
    if stamp is not None:
        _check_stamp_of(key, location, file_stamp(fd), stamp)


def _check_stamp_of(key: str, location: str, found: Stamp, stamp: Stamp | None) -> None:
    """`_check_stamp` with the file's stamp as read."""
    if stamp is not None and found != stamp:
        raise OSError(
            errno.ESTALE,
            f"sample {key!r}: {location!r} changed (size, modification time or inode) since "
            "it was indexed; build the index again (e.g. a new TarShards) after rewriting it",
        )


def read_range(
    key: str, location: str, offset: int, size: int, stamp: Stamp | None = None
) -> bytes:
    """``size`` bytes at ``offset`` of a file: random access into a tar shard. A local
    file must still match ``stamp``, if given."""
    check_size(key, size)
    try:
        path = local_path(location)
        if path is None:
            fs, inner = fsspec_fs(location)
            data: bytes = fs.cat_file(inner, start=offset, end=offset + size)
        else:
            with open_regular(key, path) as f:
                _check_stamp(key, location, f.fileno(), stamp)
                data = os.pread(f.fileno(), size, offset)
    except OSError as exc:
        error = _keyed_error(key, location, exc)
        if error is exc:
            raise
        raise error from None
    if len(data) != size:
        raise _short(key, location, offset, size, len(data))
    return data


def _keyed_error(key: str, location: str, exc: OSError) -> OSError:
    """What `read_range` (and `read_file`, special files aside) raises for ``exc``: a
    missing file in its own words, any other error with the key noted on it."""
    if isinstance(exc, FileNotFoundError):
        return not_found(key, location)
    add_key_note(exc, key)
    return exc


def _short(key: str, location: str, offset: int, size: int, got: int) -> EOFError:
    return EOFError(
        f"sample {key!r}: expected {size} bytes at offset {offset} of {location!r}, "
        f"got {got}; the file was truncated or changed after it was indexed"
    )


def read_local_ranges(
    keys: Sequence[str],
    locations: Sequence[str],
    offsets: Sequence[int],
    sizes: Sequence[int],
    stamps: Sequence[Stamp | None],
) -> tuple[list[bytes | Exception], list[float]] | None:
    """`read_range` on ranges of local files (tar members), all in one native call (one
    release of the GIL for the lot): per range its bytes or the error `read_range` raises
    (without a traceback), and each read's seconds. None without the native backend or
    with a location that is not a local file."""
    from gpu_loader.ops._backend import native_module

    native = native_module()
    paths = [local_path(location) for location in locations]
    if native is None or None in paths:
        return None
    checked: list[Exception | None] = []
    for key, size in zip(keys, sizes, strict=True):
        try:
            check_size(key, size)
            checked.append(None)
        except Exception as exc:
            checked.append(exc)
    got, seconds = native.read_ranges(
        paths, offsets, [-1 if c is not None else n for c, n in zip(checked, sizes, strict=True)]
    )
    out: list[bytes | Exception] = []
    for i, one in enumerate(got):
        error = checked[i]
        if error is None:
            where = (locations[i], paths[i] or "", offsets[i], sizes[i])
            out.append(_range_outcome(keys[i], *where, stamps[i], one))
        else:
            out.append(error.with_traceback(None))
    return out, seconds


def _range_outcome(
    key: str,
    location: str,
    path: str,
    offset: int,
    size: int,
    stamp: Stamp | None,
    got: tuple[bytes | int | None, int, int, int, int, int],
) -> bytes | Exception:
    """One `read_ranges` result as `read_range` gives it: the bytes, or its error without
    a traceback (so that it holds none of the run's bytes)."""
    data, stage, mode, st_size, mtime_ns, ino = got

    def read() -> bytes:
        if stage == 0:  # open failed, as `open_regular`'s os.open
            assert isinstance(data, int)
            exc = OSError(data, os.strerror(data), path)
            if special := _special_file(key, path, exc, "sample"):
                special.__suppress_context__ = True  # `open_regular` raises it from None
                raise special
            raise exc
        if stage == 1:  # its fstat failed (os.fstat names no file)
            assert isinstance(data, int)
            raise OSError(data, os.strerror(data))
        if stage == 2:
            raise _not_regular(key, path, mode, "sample")
        _check_stamp_of(key, location, (st_size, mtime_ns, ino), stamp)  # before the read
        if stage == 3:  # the read failed (os.pread names no file)
            assert isinstance(data, int)
            raise OSError(data, os.strerror(data))
        if stage != 4 or not isinstance(data, bytes):
            raise MemoryError(f"out of memory reading {key!r}")
        if len(data) != size:
            raise _short(key, location, offset, size, len(data))
        return data

    return _outcome(read, lambda exc: _keyed_error(key, location, exc))


def readinto_range(
    key: str, location: str, offset: int, size: int, buf: Buffer, stamp: Stamp | None = None
) -> int:
    """Like :func:`read_range` but into ``buf``; returns ``size``."""
    view = byte_view(buf, key)
    check_size(key, size)
    if size > view.nbytes:
        raise BufferTooSmallError(key, size, view.nbytes)
    path = local_path(location)
    if path is None:
        return copy_into(key, read_range(key, location, offset, size), view)
    try:
        with open_regular(key, path) as f:
            _check_stamp(key, location, f.fileno(), stamp)
            f.seek(offset)
            return _readinto_exact(key, f, view[:size])
    except FileNotFoundError:
        raise not_found(key, location) from None
    except OSError as exc:
        add_key_note(exc, key)
        raise


def copy_into(key: str, data: bytes, view: memoryview) -> int:
    if len(data) > view.nbytes:
        raise BufferTooSmallError(key, len(data), view.nbytes, data)
    view[: len(data)] = data
    return len(data)


def _readinto_exact(key: str, f: Any, view: memoryview) -> int:
    """Fill ``view`` completely: raw ``readinto`` may return short counts."""
    done = 0
    total = view.nbytes
    while done < total:
        n = f.readinto(view[done:])
        if not n:
            raise EOFError(
                f"sample {key!r}: file ended after {done} of {total} bytes; "
                "it was truncated or changed while being read"
            )
        done += n
    return done
