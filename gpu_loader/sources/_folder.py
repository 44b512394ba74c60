"""ImageFolder: one sub-folder per class, labels from sorted folder names (torchvision's rule)."""

from __future__ import annotations

import contextlib
import logging
import os
import posixpath
from collections import Counter
from collections.abc import Sequence
from pathlib import PurePath

import numpy as np

from gpu_loader.sources import _io
from gpu_loader.sources._base import FileIndex, apple_double

_log = logging.getLogger("gpu_loader.sources")

# torchvision.datasets.folder.IMG_EXTENSIONS, matched case-insensitively like torchvision.
IMG_EXTENSIONS: tuple[str, ...] = (
    ".jpg",
    ".jpeg",
    ".png",
    ".ppm",
    ".bmp",
    ".pgm",
    ".tif",
    ".tiff",
    ".webp",
)


class ImageFolder(FileIndex):
    """``root/<class>/**/<file>.<ext>``, labelled exactly as ``torchvision.datasets.ImageFolder``.

    Classes are the sorted names of ``root``'s sub-folders; files are taken in the order
    of ``sorted(os.walk(class_dir))`` then sorted names, and only with a recognised image
    extension. ``root`` may be a local folder or any fsspec URL (``memory://``, ``s3://``).
    Keys are the files' paths (or URLs); the fingerprint uses paths relative to ``root``
    so a dataset moved to another mount still resumes. A class folder without images is
    an error unless ``allow_empty=True`` (it then keeps its label but has no samples).
    Unlike torchvision, macOS resource forks (``._x.jpg``) are passed over.
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        extensions: Sequence[str] = IMG_EXTENSIONS,
        allow_empty: bool = False,
    ) -> None:
        root_s = os.fspath(root)
        if isinstance(extensions, str):  # one extension, as torchvision also allows
            extensions = (extensions,)
        exts = tuple(e.lower() for e in extensions)
        if not exts or not all(e.startswith(".") for e in exts):
            raise ValueError(
                f"`extensions` must be non-empty and start with '.', got {extensions!r}"
            )
        self.root = root_s
        self.extensions = exts
        other: Counter[str] = Counter()
        path = _io.local_path(root_s)
        suffix = ""
        if path is not None:
            classes, files = _scan_local(path, exts, allow_empty, other)
            # absolute, so the keys still name the files after a change of working
            # directory (the fingerprint's names are relative to the root either way)
            prefix = os.path.join(_io.absolute(path), "")
            if root_s.startswith(_io.LOCAL_SCHEMES):
                prefix = f"{root_s.partition('://')[0]}://{prefix}"
        else:
            try:
                classes, files, lead = _scan_fsspec(root_s, exts, allow_empty, other)
            except (OSError, ValueError):
                raise
            except Exception as exc:  # zipfile.BadZipFile, tarfile.ReadError: name the root
                raise ValueError(
                    f"ImageFolder root {root_s!r} could not be listed: {type(exc).__name__}: {exc}"
                ) from exc
            prefix, suffix = _io.url_affixes(root_s)
            prefix += lead
        self.class_to_idx = {name: i for i, name in enumerate(classes)}
        self.passed_over: dict[str, int] = dict(sorted(other.items()))
        """Files in the class folders that are not samples because their extension is not
        in `extensions`, counted by extension (lower case; "" for none; dot files, such as
        ``.DS_Store`` and macOS resource forks ``._x.jpg``, are not counted). `gpu-loader
        verify` names them: a ``.gif`` left out without a word looks like a file checked."""
        n = len(files)
        super().__init__(
            [f[0] for f in files],
            np.fromiter((f[1] for f in files), np.int64, n),
            np.fromiter((f[2] for f in files), np.int64, n),
            list(classes),
            prefix,
            suffix,
        )

    @property
    def samples(self) -> tuple[tuple[str, int], ...]:
        """``(key, label)`` per sample, as torchvision's ``ImageFolder.samples`` (a tuple,
        made on each access: keep it if you index it in a loop)."""
        return tuple((self.key(i), label) for i, label in enumerate(self.targets))

    @property
    def imgs(self) -> tuple[tuple[str, int], ...]:
        """torchvision's older name for `samples`."""
        return self.samples

    @property
    def targets(self) -> tuple[int, ...]:
        """The labels under torchvision's name for them: a tuple made once (code written for
        torchvision reads ``targets[i]`` in loops), read-only so it cannot drift from the
        labels the loader uses."""
        if self._targets is None:
            self._targets = tuple(self.labels.tolist())
        return self._targets

    @targets.setter
    def targets(self, value: object) -> None:
        raise AttributeError(
            "ImageFolder.targets is read-only: the loader reads each sample's label from "
            "the index, so a list assigned here would not reach it. To remap labels, build "
            "gpu_loader.sources.FileList([(path, new_label), ...]) (paths: index.key(i))"
        )

    _targets: tuple[int, ...] | None = None

    def __getstate__(self) -> dict[str, object]:
        state = dict(self.__dict__)
        state.pop("_targets", None)  # made again on first use
        return state


# (path relative to root, label, size or -1)
_Found = tuple[str, int, int]


def _no_classes(root: str) -> FileNotFoundError:
    return FileNotFoundError(
        f"ImageFolder found no class folders in {root!r}; expected root/<class>/<image> "
        "(one sub-folder per class)"
    )


def _no_files(root: str, empty: list[str], exts: tuple[str, ...]) -> FileNotFoundError:
    return FileNotFoundError(
        f"ImageFolder found no image files for the classes {', '.join(empty)} in {root!r}; "
        f"supported extensions are {', '.join(exts)} (pass extensions=... to change them, "
        "or allow_empty=True to keep empty classes)"
    )


def _scan_local(
    root: str, exts: tuple[str, ...], allow_empty: bool, other: Counter[str]
) -> tuple[list[str], list[_Found]]:
    if not os.path.isdir(root):
        raise FileNotFoundError(f"ImageFolder root {root!r} is not a folder")
    classes = sorted(entry.name for entry in os.scandir(root) if entry.is_dir())
    if not classes:
        raise _no_classes(root)
    files: list[_Found] = []
    empty: list[str] = []
    skip = len(os.path.join(root, ""))  # walk paths start with root: slicing beats relpath
    above = _folders_above(root)
    for label, name in enumerate(classes):
        before = len(files)
        for dirpath, fnames in sorted(_walk(os.path.join(root, name), above)):
            rel_dir = os.path.join(dirpath[skip:], "")
            for fname in sorted(fnames):
                if _is_sample(fname, exts, other):
                    # size -1: stat lazily in nbytes(), listing 1M files stays one walk.
                    files.append((rel_dir + fname, label, -1))
        if len(files) == before:
            empty.append(name)
    if empty and not allow_empty:
        raise _no_files(root, empty, exts)
    return classes, files


def _is_sample(name: str, exts: tuple[str, ...], other: Counter[str]) -> bool:
    """Whether the file ``name`` in a class folder is a sample (an extension of ``exts``,
    not a resource fork); if not, it is counted in ``other`` by its lower-case extension
    ("" for none), unless it is a dot file (``.DS_Store``, ``._x.jpg``, ``.gitkeep``)."""
    if name.lower().endswith(exts) and not apple_double(name):
        return True
    if not name.startswith("."):
        other[os.path.splitext(name)[1].lower()] += 1
    return False


def _folders_above(root: str) -> frozenset[tuple[int, int]]:
    """``(device, inode)`` of ``root`` and of every folder above it, up to ``/``: both
    those the path goes through as written and those above it on disk (QA64: with only
    the latter, a root reached through a symlink entered a link back to the folder
    holding that symlink; with only the former, one written "lnk/.." entered a link back
    to its real parent)."""
    found = set()
    # As written: up to the component a first ".." takes back ("a/lnk/.." goes through
    # "a", but "a/lnk", the link's target, is no folder above it).
    written = PurePath(_io.absolute(root))
    if ".." in written.parts:
        written = PurePath(*written.parts[: written.parts.index("..") - 1])
    for start in (written, PurePath(os.path.realpath(root))):
        for folder in (start, *start.parents):
            with contextlib.suppress(OSError):
                info = os.stat(folder)
                found.add((info.st_dev, info.st_ino))
    return frozenset(found)


def _walk(top: str, above: frozenset[tuple[int, int]]) -> list[tuple[str, list[str]]]:
    """``(folder, file names)`` as ``os.walk(top, followlinks=True)`` finds them, except
    that a symlinked folder leading back to one of its own ancestors (or to a folder
    ``above`` the walk: the dataset root and the folders over it) is not entered (a
    loop): os.walk would list the ancestor's files again under ever longer paths until
    the OS refused the path, each a sample (and a link to the root, under another class's
    label). Said once per link on the log."""
    found: list[tuple[str, list[str]]] = []
    stack: list[tuple[str, frozenset[tuple[int, int]]]] = [(top, above)]
    while stack:
        path, ancestors = stack.pop()
        try:
            info = os.stat(path)
            entries = list(os.scandir(path))
        except OSError:
            continue  # as os.walk: an unreadable folder is skipped
        ident = (info.st_dev, info.st_ino)
        if ident in ancestors:
            _log.warning("ImageFolder: %s leads back to a folder above it; not entered", path)
            continue
        files: list[os.DirEntry[str]] = []
        folders: list[os.DirEntry[str]] = []
        for entry in entries:
            try:
                is_dir = entry.is_dir()  # follows symlinks, as os.walk(followlinks=True)
            except OSError:
                is_dir = False
            (folders if is_dir else files).append(entry)
        found.append((path, [e.name for e in files]))
        stack.extend((e.path, ancestors | {ident}) for e in folders)
    return found


def _scan_fsspec(
    root: str, exts: tuple[str, ...], allow_empty: bool, other: Counter[str]
) -> tuple[list[str], list[_Found], str]:
    """Classes and files as `_scan_local`'s, and what the keys take between ``root`` and
    the relative paths: "./" in an archive whose every member is "./<class>/...", else
    "" (the relative paths, and so the fingerprint, are the same either way)."""
    fs, inner = _io.fsspec_fs(root, fresh=True)
    inner = inner.rstrip("/")
    if not fs.isdir(inner):
        raise FileNotFoundError(f"ImageFolder root {root!r} is not a folder")
    entries = fs.ls(inner, detail=True)
    names = [_child_name(e["name"], inner) for e in entries if e["type"] == "directory"]
    lead = ""
    if names == ["."] and not [e for e in entries if e["type"] != "directory"]:
        # An archive made with `tar -cf d.tar -C dir .`: every member is "./<class>/...".
        # The classes are in that "." (QA54: one class "." whose every read failed).
        inner, lead = (f"{inner}/." if inner else "."), "./"
        entries = fs.ls(inner, detail=True)
        names = [_child_name(e["name"], inner) for e in entries if e["type"] == "directory"]
    # A folder with no name (an object key "root//x.jpg", a zip member named "/x/y.jpg")
    # is no class: as one, its search found the whole root again, each file a second
    # time under its label (QA54). No local folder has one, nor "." or "..".
    if odd := [n for n in names if n in ("", ".", "..")]:
        _log.warning(
            "ImageFolder: %s lists %d folder(s) named %s, which cannot be classes; passed over "
            "('' comes from an archive member with an absolute name or an object key "
            "holding '//', '.' from members named './...' beside others)",
            root,
            len(odd),
            " and ".join(sorted({repr(n) for n in odd})),
        )
    classes = sorted(n for n in names if n not in ("", ".", ".."))
    if not classes:
        raise _no_classes(root)
    files: list[_Found] = []
    empty: list[str] = []
    unreadable: list[str] = []
    # Under a chained root a key's "::" splits its URL: such a name has no key (QA54).
    colons = _io.chained(root)
    for label, name in enumerate(classes):
        folder = f"{inner}/{name}/" if inner else f"{name}/"
        found = fs.find(folder.rstrip("/"), detail=True)
        chosen = []
        for path, info in found.items():
            base = posixpath.basename(path)
            if info.get("type") != "file":
                continue
            if not _is_sample(base, exts, other):
                continue
            if not path.startswith(folder) or (colons and "::" in path):
                # A zip member "/Cat/x.jpg", found under Cat, whose key (root +
                # relative path) would name "Cat/x.jpg", which the archive lacks.
                unreadable.append(path)
                continue
            size = info.get("size")
            chosen.append((path, -1 if size is None else int(size)))
        if not chosen:
            empty.append(name)
        # Same order as sorted(os.walk(...)) then sorted names: by (folder, file name).
        chosen.sort(key=lambda ps: posixpath.split(ps[0]))
        for path, size in chosen:
            files.append((path[len(inner) :].lstrip("/"), label, size))
    if unreadable:
        _log.warning(
            "ImageFolder: %s lists %d file(s) no key can name (%s: an archive member "
            "with an absolute name, or a name holding '::' under a chained URL, where '::' "
            "separates the links); passed over",
            root,
            len(unreadable),
            ", ".join(map(repr, unreadable[:3])) + (", ..." if len(unreadable) > 3 else ""),
        )
    if empty and not allow_empty:
        raise _no_files(root, empty, exts)
    return classes, files, lead


def _child_name(name: str, parent: str) -> str:
    """The name of ``name``, an entry that ``fs.ls(parent)`` listed: relative to
    ``parent`` where it starts with it, so an empty one ("/aa/" under "/aa", from an object
    key "aa//x.jpg") stays empty rather than its basename, the parent's own name."""
    if parent and name.startswith(parent):
        rest = name[len(parent) :]
        if rest.startswith("/"):
            return rest[1:].rstrip("/")
    return posixpath.basename(name.rstrip("/"))
