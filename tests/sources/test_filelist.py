"""FileList: explicit items and CSVs with relative paths, locally and through fsspec."""

from __future__ import annotations

import os
from pathlib import Path

import fsspec
import numpy as np
import pytest

from gpu_loader.sources import FileList, SampleIndex
from tests.sources._data import image_bytes, write


def test_items_keep_order_labels_and_bytes(tmp_path: Path) -> None:
    a = write(tmp_path / "a.jpg", image_bytes(1))
    b = write(tmp_path / "b.png", image_bytes(2, "PNG"))
    index = FileList([(a, 3), (str(b), np.int64(0)), (a, 1)])
    assert isinstance(index, SampleIndex)
    assert [index.key(i) for i in range(3)] == [str(a), str(b), str(a)]
    assert index.labels.tolist() == [3, 0, 1]
    assert index.read(1) == b.read_bytes()
    assert index.nbytes(0) == a.stat().st_size
    assert index.classes == []


@pytest.mark.parametrize(
    ("items", "error", "match"),
    [
        ([("a.jpg", 1.0)], TypeError, "must be an int, got 1.0"),
        ([("a.jpg", True)], TypeError, "must be an int"),
        ([("a.jpg",)], TypeError, "item 0 must be a"),
        ([(3, 1)], TypeError, "path must be a str"),
        ([("", 1)], ValueError, "path is empty"),
        ([("a\x00.jpg", 1)], ValueError, "holds a NUL byte"),
        ([("a.jpg", 2**70)], ValueError, r"'a\.jpg'.*does not fit in int64"),
    ],
)
def test_bad_items_are_refused(items: list[tuple[object, ...]], error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        FileList(items)  # type: ignore[arg-type]


def test_classes_must_cover_labels() -> None:
    assert FileList([("a.jpg", 1)], classes=["x", "y"]).classes == ["x", "y"]
    with pytest.raises(ValueError, match="each label must index"):
        FileList([("a.jpg", 2)], classes=["x", "y"])


def test_csv_with_relative_absolute_and_url_paths(tmp_path: Path) -> None:
    data = tmp_path / "data"
    write(data / "img" / "a.jpg", image_bytes(1))
    elsewhere = write(tmp_path / "other" / "b.jpg", image_bytes(2))
    csv = data / "list.csv"
    csv.write_text(
        "path,label,comment\n"
        "img/a.jpg,4,relative to the CSV\n"
        "\n"
        f"{elsewhere},2,absolute\n"
        "memory://bucket/c.jpg, 7 ,url\n"
    )
    index = FileList.from_csv(csv)
    assert [index.key(i) for i in range(3)] == [
        os.path.join(data, "img/a.jpg"),
        str(elsewhere),
        "memory://bucket/c.jpg",
    ]
    assert index.labels.tolist() == [4, 2, 7]
    assert index.read(0) == (data / "img" / "a.jpg").read_bytes()
    assert index.nbytes(2) is None  # remote size would cost a request


def test_csv_label_column_may_come_first(tmp_path: Path) -> None:
    write(tmp_path / "a.jpg", image_bytes(1))
    (tmp_path / "l.csv").write_text("label,path\n5,a.jpg\n")
    index = FileList.from_csv(tmp_path / "l.csv")
    assert index.key(0) == os.path.join(tmp_path, "a.jpg")
    assert index.label(0) == 5


def test_a_csv_is_not_held_to_the_per_sample_limit_and_any_line_ending_reads(
    tmp_path: Path,
) -> None:
    from gpu_loader.sources._io import max_file_bytes, set_max_file_bytes

    write(tmp_path / "a.jpg", image_bytes(1))
    write(tmp_path / "b.jpg", image_bytes(2))
    rows = "".join(f"{name},{label}\r" for name, label in (("a.jpg", 3), ("b.jpg", 4)))
    (tmp_path / "l.csv").write_bytes(("path,label\r" + rows).encode())  # old Mac lines
    limit = max_file_bytes()
    try:
        set_max_file_bytes(16)  # smaller than the list: a limit for images, not for lists
        index = FileList.from_csv(tmp_path / "l.csv")
    finally:
        set_max_file_bytes(limit)
    assert [index.label(i) for i in range(len(index))] == [3, 4]
    assert index.key(1) == os.path.join(tmp_path, "b.jpg")
    os.mkfifo(tmp_path / "pipe.csv")  # a list is opened as samples are: never waits
    with pytest.raises(OSError, match=r"file list .*pipe\.csv' is a FIFO"):
        FileList.from_csv(tmp_path / "pipe.csv")


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("file,class\na.jpg,1\n", "header row naming"),
        ("", "header row naming"),
        ("path,label\na.jpg,one\n", "line 2: label 'one' is not an integer"),
        ("path,label\na.jpg,1\nb.jpg\n", "line 3: too few columns"),
        # These named the FileList item (0-based) and not the CSV or its line.
        ('path,label\na.jpg,1\n"",2\n', "line 3: the path is empty"),
        # (Python 3.10's csv module refuses the line itself: "line contains NUL")
        ("path,label\na\x00.jpg,1\n", r"line 2: (path 'a\\x00\.jpg' holds a|line contains) NUL"),
        (f"path,label\na.jpg,{2**70}\n", "line 2 does not fit in int64"),
        # QA63: past 4,300 digits Python's own error, naming neither the CSV nor the line.
        ("path,label\na.jpg," + "1" * 5000 + "\n", r"line 2 does not fit .*5,000 digits"),
        # QA64: said "...", as if cut, of a label shown whole; leading zeros shown alone.
        ("path,label\na.jpg,12345678901234567890\n", r"got 12345678901234567890 \(20 digits\)"),
        ("path,label\na.jpg,-0000" + "9" * 30 + "\n", r"got -9{20}\.\.\. \(30 digits\)"),
        ("path,label\na.jpg,1_000\n", "line 2: label '1_000' is not an integer"),
        ('path,label\n"a\nb.jpg",1\nc.jpg,x\n', "line 4: label 'x'"),  # lines, not rows
        # A quote left open took every later row into one path, with no error.
        ('label,path\n0,"a.jpg\n1,b.jpg\n2,c.jpg\n', "line 2: a quote .* never closed"),
        ('path,label\n"a b.jpg" ,1\n', "line 2: text after a quoted field's closing quote"),
        ("path,label\na.jpg,\uff13\n", "line 2: label '\uff13' is not an integer"),
    ],
)
def test_bad_csv_is_a_clear_error(tmp_path: Path, text: str, match: str) -> None:
    (tmp_path / "l.csv").write_text(text)
    with pytest.raises(ValueError, match=match):
        FileList.from_csv(tmp_path / "l.csv")


def test_a_label_s_leading_zeros_do_not_count_as_digits(tmp_path: Path) -> None:
    (tmp_path / "l.csv").write_text("path,label\na.jpg,-" + "0" * 30 + "7\n")
    assert FileList.from_csv(tmp_path / "l.csv").labels.tolist() == [-7]


def test_missing_csv_and_missing_sample(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"nope\.csv"):
        FileList.from_csv(tmp_path / "nope.csv")
    index = FileList([(tmp_path / "gone.jpg", 0)])
    with pytest.raises(FileNotFoundError, match=r"gone\.jpg"):
        index.read(0)
    with pytest.raises(FileNotFoundError, match=r"gone\.jpg"):
        index.readinto(0, bytearray(10))


def test_csv_in_memory_resolves_relative_urls(memfs: tuple[fsspec.AbstractFileSystem, str]) -> None:
    fs, base = memfs
    jpg = image_bytes(5)
    fs.pipe_file(f"{base}/set/img/a.jpg", jpg)
    fs.pipe_file(f"{base}/set/list.csv", b"path,label\nimg/a.jpg,1\nimg/missing.jpg,0\n")
    index = FileList.from_csv(f"memory://{base}/set/list.csv")
    assert index.key(0) == f"memory://{base}/set/img/a.jpg"
    assert index.read(0) == jpg
    buf = np.zeros(len(jpg) + 1, np.uint8)
    assert index.readinto(0, buf) == len(jpg)
    assert buf[: len(jpg)].tobytes() == jpg
    with pytest.raises(FileNotFoundError, match=r"missing\.jpg"):
        index.read(1)


def test_a_url_csv_s_dot_dot_paths_are_read_where_they_point(
    memfs: tuple[fsspec.AbstractFileSystem, str],
) -> None:
    # The key "memory://.../lists/../imgs/a.jpg" went to fsspec as written, and every
    # sample was "not found"; a local CSV's worked, the OS resolving the "..".
    fs, base = memfs
    jpg = image_bytes(6)
    fs.pipe_file(f"{base}/imgs/a.jpg", jpg)
    fs.pipe_file(f"{base}/lists/train.csv", b"path,label\n../imgs/a.jpg,0\n./../imgs/a.jpg,1\n")
    index = FileList.from_csv(f"memory://{base}/lists/train.csv")
    assert index.read(0) == index.read(1) == jpg
    assert index.readinto(0, np.zeros(len(jpg), np.uint8)) == len(jpg)
    rooted = FileList([("../imgs/a.jpg", 0)], root=f"memory://{base}/lists")
    assert rooted.read(0) == jpg


def test_a_url_whose_name_holds_a_double_colon_is_read(
    memfs: tuple[fsspec.AbstractFileSystem, str],
) -> None:
    # fsspec reads "::" as a chain of protocols: the listed file could not be read.
    fs, base = memfs
    jpg = image_bytes(7)
    fs.pipe_file(f"{base}/x::y.jpg", jpg)
    assert FileList([(f"memory://{base}/x::y.jpg", 0)]).read(0) == jpg  # memory:///t-...
    assert FileList([(f"memory://{base.lstrip('/')}/x::y.jpg", 0)]).read(0) == jpg


def test_a_chained_url_is_a_url(memfs: tuple[fsspec.AbstractFileSystem, str]) -> None:
    # "simplecache::memory://..." was taken for a local path: "not found".
    fs, base = memfs
    jpg = image_bytes(8)
    fs.pipe_file(f"{base}/imgs/a.jpg", jpg)
    fs.pipe_file(f"{base}/lists/train.csv", b"path,label\n../imgs/a.jpg,0\n")
    assert FileList([(f"simplecache::memory://{base}/imgs/a.jpg", 0)]).read(0) == jpg
    assert FileList.from_csv(f"simplecache::memory://{base}/lists/train.csv").read(0) == jpg


def test_a_csv_inside_a_zip_reads_its_paths_inside_it(
    memfs: tuple[fsspec.AbstractFileSystem, str],
) -> None:
    # The CSV's folder was taken from the whole chain: keys like
    # zip://lists/train.csv::memory:/../imgs/a.jpg, and every read failed (QA). In a chained
    # URL the path lives in the zip link.
    import io
    import zipfile

    fs, base = memfs
    jpg, png = image_bytes(8), image_bytes(9, "PNG")
    packed = io.BytesIO()
    with zipfile.ZipFile(packed, "w") as archive:
        archive.writestr("imgs/a.jpg", jpg)
        archive.writestr("imgs/b.png", png)
        archive.writestr("lists/train.csv", "path,label\n../imgs/a.jpg,0\n../imgs/b.png,1\n")
        archive.writestr("top.csv", "path,label\nimgs/b.png,1\n")
    fs.pipe_file(f"{base}/z.zip", packed.getvalue())
    archive_url = f"memory://{base}/z.zip"
    nested = FileList.from_csv(f"zip://lists/train.csv::{archive_url}")
    assert [nested.read(i) for i in range(2)] == [jpg, png]
    assert nested.key(1) == f"zip://lists/../imgs/b.png::{archive_url}"
    top = FileList.from_csv(f"zip://top.csv::{archive_url}")
    assert top.key(0) == f"zip://imgs/b.png::{archive_url}" and top.read(0) == png
    rooted = FileList([("imgs/a.jpg", 0)], root=f"zip://::{archive_url}")
    assert rooted.read(0) == jpg
    from gpu_loader.sources import open_index  # what --data and ImageLoader(str) take

    opened = open_index(f"zip://lists/train.csv::{archive_url}")  # was taken for a folder
    assert isinstance(opened, FileList) and opened.read(1) == png


def test_fingerprint_depends_on_keys_and_labels() -> None:
    base = FileList([("a.jpg", 0), ("b.jpg", 1)]).fingerprint()
    assert FileList([("a.jpg", 0), ("b.jpg", 1)]).fingerprint() == base
    assert FileList([("a.jpg", 0), ("b.jpg", 2)]).fingerprint() != base
    assert FileList([("b.jpg", 1), ("a.jpg", 0)]).fingerprint() != base
    assert FileList([("a.jpg", 0)]).fingerprint() != base


def test_a_moved_csv_folder_keeps_its_fingerprint_and_reads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    jpg = image_bytes(3)
    write(tmp_path / "set" / "img" / "a b.jpg", jpg)
    write(tmp_path / "set" / "list.csv", b"path,label\nimg/a b.jpg,4\n")
    here = FileList.from_csv(tmp_path / "set" / "list.csv")
    (tmp_path / "set").rename(tmp_path / "moved")
    monkeypatch.chdir(tmp_path / "moved")
    there = FileList.from_csv("list.csv")  # a relative CSV path, from inside the folder
    assert there.fingerprint() == here.fingerprint()  # so a saved run resumes
    assert os.path.isabs(there.key(0)) and there.read(0) == jpg
    monkeypatch.chdir(tmp_path)  # keys are absolute: a later chdir does not break reads
    assert there.read(0) == jpg


def test_a_csv_at_the_root_of_a_url_filesystem() -> None:
    import uuid

    fs, name = fsspec.filesystem("memory"), uuid.uuid4().hex
    jpg = image_bytes(6)
    fs.pipe_file(f"/{name}/a.jpg", jpg)
    fs.pipe_file(f"/{name}.csv", f"path,label\n{name}/a.jpg,2\n".encode())
    try:
        index = FileList.from_csv(f"memory://{name}.csv")
        assert index.key(0) == f"memory://{name}/a.jpg" and index.read(0) == jpg
        # Spelled with the root's slash, the keys lost one: memory:/<name>/a.jpg (QA).
        index = FileList.from_csv(f"memory:///{name}.csv")
        assert index.key(0) == f"memory:///{name}/a.jpg" and index.read(0) == jpg
        for root in ("memory://", "memory:///"):
            rooted = FileList([(f"{name}/a.jpg", 2)], root=root)
            assert rooted.key(0) == f"{root}{name}/a.jpg" and rooted.read(0) == jpg
    finally:
        fs.rm(f"/{name}", recursive=True)
        fs.rm(f"/{name}.csv")


def test_root_needs_relative_paths(tmp_path: Path) -> None:
    write(tmp_path / "a.jpg", image_bytes(1))
    index = FileList([("a.jpg", 0)], root=tmp_path)
    assert index.key(0) == str(tmp_path / "a.jpg") and index.nbytes(0) is not None
    assert index.fingerprint() == FileList([("a.jpg", 0)], root="/elsewhere").fingerprint()
    with pytest.raises(ValueError, match="not relative to `root`"):
        FileList([(str(tmp_path / "a.jpg"), 0)], root=tmp_path)


def test_repr_gives_the_label_range_when_classes_are_unnamed() -> None:
    assert repr(FileList([("/a.jpg", 0), ("/b.jpg", 2)])) == (
        "FileList(2 samples, labels 0..2, unnamed)"
    )
    named = FileList([("/a.jpg", 0), ("/b.jpg", 1)], classes=["cat", "dog"])
    assert repr(named) == "FileList(2 samples, 2 classes)"


def test_a_csv_that_is_not_utf8_names_its_line(tmp_path: Path) -> None:
    csv_path = tmp_path / "list.csv"
    csv_path.write_bytes(b"path,label\na.jpg,0\ncaf\xe9.jpg,1\n")  # Latin-1 on line 3
    with pytest.raises(ValueError, match=r"list\.csv' line 3: not UTF-8 text \(byte 0xe9"):
        FileList.from_csv(csv_path)
    csv_path.write_bytes(b"\xef\xbb\xbfpath,label\na.jpg,0\ncaf\xe9.jpg,1\n")  # with a BOM
    with pytest.raises(ValueError, match=r"line 3: not UTF-8 text \(byte 0xe9 at offset 25\)"):
        FileList.from_csv(csv_path)


def test_a_csv_path_is_taken_as_written(tmp_path: Path) -> None:
    # QA: a quoted " a.jpg" was stripped to "a.jpg", and a quoted "a\rb.jpg" read as
    # "a\nb.jpg": each delivered another file's pixels when that file existed.
    names = [" a.jpg", "a.jpg", "a\rb.jpg", "a\nb.jpg"]
    for n, name in enumerate(names):
        write(tmp_path / name, image_bytes(n))
    rows = "".join(f'"{name}",{n}\r\n' for n, name in enumerate(names))
    (tmp_path / "l.csv").write_bytes(("path,label\r\n" + rows).encode())
    index = FileList.from_csv(tmp_path / "l.csv")
    assert [index.key(i) for i in range(4)] == [os.path.join(tmp_path, n) for n in names]
    assert [index.read(i) for i in range(4)] == [(tmp_path / n).read_bytes() for n in names]
    # A space after a comma is not part of the field, in the header or a row.
    (tmp_path / "h.csv").write_text("label, path\n3, a.jpg\n")
    spaced = FileList.from_csv(tmp_path / "h.csv")
    assert (spaced.key(0), spaced.label(0)) == (os.path.join(tmp_path, "a.jpg"), 3)


def test_relative_paths_keep_naming_their_files_after_a_chdir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # QA: the keys stayed relative, so a chdir after the index was made failed every read.
    write(tmp_path / "imgs" / "a.jpg", image_bytes(1))
    other = write(tmp_path / "b.jpg", image_bytes(2))
    monkeypatch.chdir(tmp_path)
    relative = FileList([("imgs/a.jpg", 0)])
    mixed = FileList([("imgs/a.jpg", 0), (str(other), 1)])
    monkeypatch.chdir(tmp_path / "imgs")
    assert relative.read(0) == mixed.read(0) == (tmp_path / "imgs" / "a.jpg").read_bytes()
    assert relative.key(0) == os.path.join(tmp_path, "imgs", "a.jpg")
    # The names as given still make the fingerprint: the list moves with its data.
    assert relative.fingerprint() == FileList([("imgs/a.jpg", 0)], root="/else").fingerprint()


def test_relative_file_urls_and_roots_keep_naming_their_files_after_a_chdir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # QA54: a file:// URL with a relative path, a CSV named by one, a relative `root` and
    # a relative tar shard stayed relative, and every read after a chdir was not found.
    from gpu_loader.sources import TarShards, open_index
    from tests.sources._data import shard_bytes

    data = write(tmp_path / "imgs" / "a.jpg", image_bytes(1)).read_bytes()
    (tmp_path / "imgs" / "list.csv").write_text("path,label\na.jpg,0\n")
    (tmp_path / "s.tar").write_bytes(shard_bytes([("k", "jpg", data, 3)]))
    monkeypatch.chdir(tmp_path)
    indexes = [
        FileList([("file://imgs/a.jpg", 0)]),
        FileList([("a.jpg", 0)], root="imgs"),
        FileList([("a.jpg", 0)], root="file://imgs"),
        FileList.from_csv("file://imgs/list.csv"),
        TarShards("s.tar"),
        open_index("file://s.tar"),
    ]
    monkeypatch.chdir(tmp_path / "imgs")
    for index in indexes:
        assert index.read(0) == data, index.key(0)
        assert str(tmp_path) in index.key(0)


def test_fingerprints_tell_name_and_label_apart() -> None:
    from gpu_loader.sources._base import fingerprint_of

    assert fingerprint_of(["a1"], np.array([2])) != fingerprint_of(["a"], np.array([12]))
    assert fingerprint_of(["a"], np.array([1])) == fingerprint_of(["a"], np.array([1]))


def test_a_csv_line_of_spaces_is_skipped_and_a_header_without_label_is_named(
    tmp_path: Path,
) -> None:
    write(tmp_path / "a.jpg", image_bytes(1))
    write(tmp_path / "b.jpg", image_bytes(2))
    (tmp_path / "l.csv").write_text("path,label\na.jpg,0\n   \nb.jpg,1\n")
    assert FileList.from_csv(tmp_path / "l.csv").labels.tolist() == [0, 1]
    (tmp_path / "m.csv").write_text("path,class\na.jpg,0\n")
    with pytest.raises(ValueError, match="naming the columns 'path' and 'label'"):
        FileList.from_csv(tmp_path / "m.csv")


def test_a_csv_path_of_spaces_is_named_empty(tmp_path: Path) -> None:
    (tmp_path / "l.csv").write_text('path,label\n"   ",3\n')  # quoted: kept as written
    with pytest.raises(ValueError, match="line 2: the path is empty"):
        FileList.from_csv(tmp_path / "l.csv")


def test_a_linked_csv_takes_its_relative_paths_from_the_file_it_leads_to(
    tmp_path: Path,
) -> None:
    # QA63: `ln -s data/list.csv linked.csv` named every image under the link's folder.
    data = tmp_path / "data"
    write(data / "img" / "a.jpg", image_bytes(1))
    (data / "list.csv").write_text("path,label\nimg/a.jpg,3\n")
    (tmp_path / "links").mkdir()
    hop = tmp_path / "links" / "hop.csv"
    hop.symlink_to("../data/list.csv")  # relative to the link's own folder
    (tmp_path / "linked.csv").symlink_to(hop)  # a link to a link
    index = FileList.from_csv(tmp_path / "linked.csv")
    assert index.key(0) == os.path.join(data, "img/a.jpg")
    assert index.read(0) == (data / "img" / "a.jpg").read_bytes()


def test_dot_dot_after_a_symlink_names_the_link_target_s_parent(tmp_path: Path) -> None:
    # QA63: "lnk/.." was tidied as text to the link's own folder: a CSV beside the
    # target read its images from there (not found, or other files of the same name).
    (tmp_path / "real" / "ds").mkdir(parents=True)
    write(tmp_path / "real" / "ds" / "cat" / "x.jpg", image_bytes(1))
    (tmp_path / "real" / "ds" / "l.csv").write_text("path,label\ncat/x.jpg,0\n")
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "lnk").symlink_to("../real/ds/cat")
    write(tmp_path / "a" / "cat" / "x.jpg", image_bytes(2))  # what the text tidy named
    index = FileList.from_csv(f"{tmp_path}/a/lnk/../l.csv")
    assert index.read(0) == (tmp_path / "real" / "ds" / "cat" / "x.jpg").read_bytes()
    # A ".." after a plain folder, and "." and "//", are still tidied away.
    plain = FileList.from_csv(f"{tmp_path}/real/./ds/cat/..//l.csv")
    assert plain.key(0) == os.path.join(tmp_path, "real/ds/cat/x.jpg")


def test_a_csv_s_relative_file_url_is_taken_from_the_csv_s_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # QA63: "file://imgs/a.jpg" in a list was read from the working folder, unlike
    # "imgs/a.jpg" beside it: found only when run from the list's own folder.
    data = write(tmp_path / "lists" / "imgs" / "a.jpg", image_bytes(1)).read_bytes()
    (tmp_path / "lists" / "l.csv").write_text("path,label\nfile://imgs/a.jpg,1\nimgs/a.jpg,2\n")
    monkeypatch.chdir(tmp_path)
    for named in (tmp_path / "lists" / "l.csv", f"file://{tmp_path}/lists/l.csv"):
        index = FileList.from_csv(named)
        assert index.read(0) == index.read(1) == data, index.key(0)
