"""FileList: an explicit list of ``(path_or_url, label)``, in code or from a CSV."""

from __future__ import annotations

import codecs
import csv
import io
import os
from collections.abc import Iterable, Iterator, Sequence

import numpy as np

from gpu_loader.sources import _io
from gpu_loader.sources._base import FileIndex, check_label, check_labels_index, parse_label


class FileList(FileIndex):
    """Samples given as ``(path_or_url, label)`` pairs, kept in the given order.

    Paths may be local (read with the zero-copy fast path) or any fsspec URL; both kinds
    may be mixed. ``classes`` optionally names the labels (``classes[label]``). With
    ``root`` (a folder or URL) every path must be relative to it: keys are the joined
    paths, and `fingerprint` covers the paths as given, so the data may move with its list
    and a saved run still resumes. Without ``root``, relative local paths are taken
    relative to the working directory when the list is made (the keys are absolute, so a
    later ``os.chdir`` does not change what they name).
    """

    def __init__(
        self,
        items: Iterable[tuple[str | os.PathLike[str], int]],
        *,
        classes: Sequence[str] | None = None,
        root: str | os.PathLike[str] | None = None,
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
            if "\x00" in location:  # no file system takes it: say so now, not per read
                raise ValueError(f"FileList item {n}: path {location!r} holds a NUL byte")
            if root is not None and _absolute(location):
                raise ValueError(
                    f"FileList item {n}: {location!r} is not relative to `root`; give "
                    "relative paths with `root`, or no `root`"
                )
            if location.startswith(_io.LOCAL_SCHEMES):  # file://d/x.jpg: from the cwd now
                location = _io.anchored(location)
            locations.append(location)
            labels.append(check_label(label, f"FileList item {n} ({location!r})"))
        names = list(classes) if classes is not None else []
        check_labels_index(labels, names, "FileList")
        suffix = ""
        if root is not None:
            prefix, suffix = _affixes(_io.anchored(os.fspath(root)))
        elif locations and not any(_absolute(entry) for entry in locations):
            prefix = os.path.join(os.getcwd(), "")  # the names, and so the fingerprint, as given
        else:
            prefix = ""
            locations = [_join(os.getcwd(), entry) for entry in locations]
        super().__init__(locations, np.array(labels, np.int64), None, names, prefix, suffix)

    @classmethod
    def from_csv(
        cls, path: str | os.PathLike[str], *, classes: Sequence[str] | None = None
    ) -> FileList:
        """Read a CSV with the header ``path,label`` (extra columns are ignored).

        Paths are taken as written, less the spaces right after a comma (quote a path to
        keep them); labels are integers in decimal digits.

        Relative paths are taken relative to the CSV's own folder (or URL; for a symlink,
        the folder of the file it leads to), so a dataset
        folder with its CSV inside can be moved as a whole: when every path is relative,
        the fingerprint covers them as written, and a saved run resumes from the new place.
        """
        location = os.fspath(path)
        try:
            data = _io.read_list_file(location)  # a list, not a sample: no per-sample limit
        except FileNotFoundError:
            raise FileNotFoundError(f"CSV file {location!r} not found") from None
        except (OSError, ValueError):
            raise
        except Exception as exc:  # zipfile.BadZipFile around it, say: name the CSV
            raise ValueError(
                f"CSV file {location!r} could not be read: {type(exc).__name__}: {exc}"
            ) from exc
        try:
            text = data.decode("utf-8-sig")
        except UnicodeDecodeError as exc:
            # utf-8-sig counts from after a BOM it skipped
            at = exc.start + (len(codecs.BOM_UTF8) if data.startswith(codecs.BOM_UTF8) else 0)
            line = data.count(b"\n", 0, at) + 1
            raise ValueError(
                f"CSV {location!r} line {line}: not UTF-8 text (byte {data[at]:#04x} "
                f"at offset {at}); save the list as UTF-8"
            ) from None
        # newline="": the csv module ends lines at \n, \r\n or an old Mac \r itself, and a
        # quoted path keeps the \r or \n it holds (translating them named another file)
        # skipinitialspace: "a.jpg, 3" and a header "label, path" read as meant
        # strict: a quote left open ran to the end of the file, taking every later row
        # into one path (QA); now "unexpected end of data" on the line it began
        reader = csv.reader(io.StringIO(text, newline=""), skipinitialspace=True, strict=True)
        rows = _rows(reader, location)
        header = [h.strip() for h in next(rows, [])]
        if "path" not in header or "label" not in header:
            raise ValueError(
                f"CSV {location!r} must start with a header row naming the columns "
                f"'path' and 'label', got {header!r}"
            )
        p_col, l_col = header.index("path"), header.index("label")
        base = _base_of(location)
        items: list[tuple[str, int]] = []
        for row in rows:
            line = reader.line_num  # where the row ends (a quoted path may span lines)
            if not row or all(not c.strip() for c in row):
                continue  # blank lines are harmless
            if len(row) <= max(p_col, l_col):
                raise ValueError(f"CSV {location!r} line {line}: too few columns in {row!r}")
            where = f"CSV {location!r} line {line}"
            label = parse_label(row[l_col], where)
            if label is None:
                raise ValueError(f"{where}: label {row[l_col]!r} is not an integer")
            entry = row[p_col]  # as written: no strip, a quoted " a.jpg" names " a.jpg"
            if not entry.strip():
                raise ValueError(f"{where}: the path is empty")
            if "\x00" in entry:
                raise ValueError(f"{where}: path {entry!r} holds a NUL byte")
            items.append((entry, label))
        if all(not _absolute(entry) for entry, _ in items):
            return cls(items, classes=classes, root=base)
        return cls([(_join(base, entry), label) for entry, label in items], classes=classes)


def _rows(reader: Iterator[list[str]], location: str) -> Iterator[list[str]]:
    """``reader``'s rows, its own errors (Python 3.10: "line contains NUL") as a
    ValueError naming the CSV and line, as every other CSV error is."""
    while True:
        start = getattr(reader, "line_num", -1) + 1  # the line the next row begins on
        try:
            row = next(reader)
        except StopIteration:
            return
        except csv.Error as exc:
            line = getattr(reader, "line_num", "?")
            if str(exc) == "unexpected end of data":  # strict: the file ended inside quotes
                raise ValueError(
                    f"CSV {location!r} line {start}: a quote opened in this row is never "
                    f"closed (the file ends inside it, at line {line})"
                ) from None
            if "expected after '\"'" in str(exc):  # strict: '"a b.jpg" ,1'
                raise ValueError(
                    f"CSV {location!r} line {line}: text after a quoted field's closing "
                    'quote (a quote inside a field is written twice: "a ""b"".jpg")'
                ) from None
            raise ValueError(f"CSV {location!r} line {line}: {exc}") from None
        yield row


def _absolute(entry: str) -> bool:
    return _io.is_url(entry) or os.path.isabs(entry)


def _base_of(location: str) -> str:
    """The folder (or URL) a CSV at ``location`` sits in; absolute for a local file, so
    its samples' keys survive a change of working directory (a ``file://`` one too).
    For a symlink, the folder of the file it leads to: a list's relative paths are
    written from where the list is (QA63: a linked list named every image under the
    link's folder, where none was)."""
    location = _io.anchored(location)
    local = _io.local_path(location)
    if local is not None and os.path.islink(local):
        target = _link_target(local)
        location = location[: len(location) - len(local)] + target
    if _io.is_url(location):
        return _io.url_parent(location)
    return os.path.dirname(location)


def _link_target(path: str) -> str:
    """Where the symlink ``path`` finally leads, its folders above kept as written (a
    loop of links is left for the open to report)."""
    for _ in range(40):  # the kernel's own limit on links in a row
        if not os.path.islink(path):
            break
        path = _io.absolute(os.path.join(os.path.dirname(path), os.readlink(path)))
    return path


def _affixes(base: str) -> tuple[str, str]:
    """``(prefix, suffix)`` with prefix + relative path + suffix the key of a file under
    ``base`` (a suffix only for a chained URL: QA, a CSV inside a zip read its paths as
    ``zip://l.csv::memory:/imgs/a.jpg``)."""
    if _io.is_url(base):
        return _io.url_affixes(base)
    return os.path.join(base, ""), ""


def _join(base: str, entry: str) -> str:
    local_base = _io.local_path(base)
    if entry.startswith(_io.LOCAL_SCHEMES) and local_base is not None:
        scheme, _, rest = entry.partition("://")
        if not os.path.isabs(rest):  # a list's file://imgs/a.jpg: from the list's folder,
            return f"{scheme}://{os.path.join(local_base, rest)}"  # as imgs/a.jpg (QA63)
    if _absolute(entry):
        return entry
    prefix, suffix = _affixes(base)
    return prefix + entry + suffix
