"""ImageFolder: torchvision's labelling rule, byte reads, sizes and errors, locally and via fsspec."""

from __future__ import annotations

import os
import pickle
import re
import socket
from collections.abc import Iterator
from pathlib import Path

import fsspec
import numpy as np
import pytest

from gpu_loader.ops._backend import forced
from gpu_loader.sources import BufferTooSmallError, ImageFolder, SampleIndex
from gpu_loader.sources._io import max_file_bytes, read_file, set_max_file_bytes
from tests.sources._data import same_outcome
from tests.sources.conftest import TREE_EXPECTED, copy_to_memory


@pytest.fixture(params=["native", "pillow"])
def reader(request: pytest.FixtureRequest) -> Iterator[str]:
    """Local reads take one native call where the extension is built, Python's file
    calls otherwise: both must read and refuse the same."""
    try:
        with forced(request.param):
            yield request.param
    except ImportError:
        pytest.skip("the native extension is not built")


def test_labels_follow_torchvision_rule(tree: Path) -> None:
    index = ImageFolder(tree)
    assert isinstance(index, SampleIndex)
    assert index.classes == ["Cat", "bird", "dog"]
    assert index.class_to_idx == {"Cat": 0, "bird": 1, "dog": 2}
    assert len(index) == len(TREE_EXPECTED)
    assert [index.key(i) for i in range(len(index))] == [
        os.path.join(tree, rel) for rel, _ in TREE_EXPECTED
    ]
    assert index.labels.tolist() == [label for _, label in TREE_EXPECTED]
    assert index.labels.dtype == np.int64
    assert [index.label(i) for i in range(len(index))] == index.labels.tolist()
    assert list(index.targets) == index.labels.tolist()  # torchvision's name
    assert index.targets is index.targets  # made once, not per access (loops index it)
    with pytest.raises(TypeError):
        index.targets[0] = 99  # type: ignore[index]  # read-only: cannot drift from labels
    with pytest.raises(AttributeError, match=r"build gpu_loader\.sources\.FileList"):
        index.targets = [0] * len(index)  # torchvision-style remapping: says what to do
    samples = [(index.key(i), index.label(i)) for i in range(len(index))]
    assert list(index.samples) == list(index.imgs) == samples  # imgs: the older name
    assert "_targets" not in pickle.loads(pickle.dumps(index)).__dict__


def test_labels_array_is_read_only(tree: Path) -> None:
    index = ImageFolder(tree)
    with pytest.raises(ValueError, match="read-only"):
        index.labels[0] = 5


def test_read_readinto_and_nbytes_agree_with_the_file(tree: Path, reader: str) -> None:
    index = ImageFolder(tree)
    for i in range(len(index)):
        expected = Path(index.key(i)).read_bytes()
        assert index.read(i) == expected
        assert index.nbytes(i) == len(expected)
        arr = np.zeros(len(expected) + 7, np.uint8)
        assert index.readinto(i, arr) == len(expected)
        assert arr[: len(expected)].tobytes() == expected
        assert not arr[len(expected) :].any()  # nothing written past the sample
        ba = bytearray(len(expected))
        assert index.readinto(i, memoryview(ba)) == len(expected)
        assert bytes(ba) == expected


def test_readinto_a_too_small_buffer_names_the_key(tree: Path) -> None:
    index = ImageFolder(tree)
    size = index.nbytes(0)
    assert size is not None
    with pytest.raises(BufferTooSmallError, match=r"x\.webp") as info:
        index.readinto(0, bytearray(size - 1))
    assert (info.value.nbytes, info.value.capacity) == (size, size - 1)


def test_readinto_refuses_read_only_and_strided_buffers(tree: Path) -> None:
    index = ImageFolder(tree)
    with pytest.raises(ValueError, match="writable"):
        index.readinto(0, memoryview(bytes(10_000)))
    with pytest.raises(ValueError, match="contiguous"):
        index.readinto(0, np.zeros(20_000, np.uint8)[::2])


def test_readinto_accepts_multi_byte_arrays(tree: Path) -> None:
    index = ImageFolder(tree)
    data = index.read(1)
    words = np.zeros(len(data) // 4 + 1, np.uint32)
    assert index.readinto(1, words) == len(data)
    assert words.view(np.uint8)[: len(data)].tobytes() == data


def test_missing_file_raises_file_not_found_with_key(tree: Path) -> None:
    index = ImageFolder(tree)
    Path(index.key(2)).unlink()
    with pytest.raises(FileNotFoundError, match=r"y\.jpg"):
        index.read(2)
    with pytest.raises(FileNotFoundError, match=r"y\.jpg"):
        index.readinto(2, bytearray(1 << 16))
    with pytest.raises(FileNotFoundError, match=r"y\.jpg"):
        index.nbytes(2)


def test_out_of_range_index_is_an_index_error(tree: Path) -> None:
    index = ImageFolder(tree)
    with pytest.raises(IndexError, match="out of range"):
        index.key(len(index))
    with pytest.raises(IndexError):
        index.read(-1)
    assert index.key(np.int64(1)) == index.key(1)


def test_empty_class_and_missing_root_are_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="not a folder"):
        ImageFolder(tmp_path / "nope")
    with pytest.raises(FileNotFoundError, match="no class folders"):
        ImageFolder(tmp_path)
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="classes empty"):
        ImageFolder(tmp_path)


def test_extensions_can_be_narrowed(tree: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"classes Cat .*allow_empty"):
        ImageFolder(tree, extensions=(".jpg", ".jpeg"))
    index = ImageFolder(tree, extensions=(".jpg", ".jpeg"), allow_empty=True)
    assert index.classes == ["Cat", "bird", "dog"]  # Cat keeps label 0 with no samples
    assert index.labels.tolist() == [1, 2, 2, 2]
    rels = [os.path.relpath(index.key(i), tree) for i in range(len(index))]
    assert rels == ["bird/zz/y.jpg", "dog/Z.JPG", "dog/b.jpg", "dog/sub/c.jpeg"]
    with pytest.raises(ValueError, match="extensions"):
        ImageFolder(tree, extensions=("jpg",))
    one = ImageFolder(tree, extensions=".jpeg", allow_empty=True)  # a str: one extension
    assert [os.path.relpath(one.key(i), tree) for i in range(len(one))] == ["dog/sub/c.jpeg"]


def test_files_passed_over_are_counted_by_extension(
    tree: Path, memfs: tuple[fsspec.AbstractFileSystem, str]
) -> None:
    # `gpu-loader verify` names what it did not check (QA58: a .gif left out in silence).
    # Only the class folders count: the root's own files are no samples of any class.
    (tree / "dog" / "anim.GIF").write_bytes(b"GIF89a")
    (tree / "bird" / "README").write_bytes(b"notes")
    (tree / "bird" / "._y.jpg").write_bytes(b"\x00\x05\x16\x07")  # a resource fork
    (tree / "bird" / ".DS_Store").write_bytes(b"Bud1")  # dot files are not counted
    want = {"": 1, ".gif": 1, ".txt": 1}
    assert ImageFolder(tree).passed_over == want
    assert ImageFolder(copy_to_memory(memfs[0], tree, memfs[1] + "/m")).passed_over == want
    narrow = ImageFolder(tree, extensions=(".jpg", ".jpeg"), allow_empty=True)
    assert narrow.passed_over == {**want, ".bmp": 1, ".png": 1, ".webp": 1}


@pytest.mark.parametrize("kind", ["zip", "tar"])
def test_an_archive_is_opened_once_per_thread_not_once_per_read(
    tree: Path, memfs: tuple[fsspec.AbstractFileSystem, str], kind: str
) -> None:
    # fsspec caches no archive file system: every read opened and parsed the archive
    # again (QA54: 63 ms a read in a zip of 10,000 members, an epoch quadratic in it).
    import io
    import tarfile
    import threading
    import zipfile

    fs, base = memfs
    packed = io.BytesIO()
    if kind == "zip":
        with zipfile.ZipFile(packed, "w") as archive:
            for rel, _ in TREE_EXPECTED:
                archive.writestr(rel, (tree / rel).read_bytes())
    else:
        with tarfile.open(fileobj=packed, mode="w") as archive:
            for rel, _ in TREE_EXPECTED:
                archive.add(tree / rel, arcname=rel)
    fs.pipe_file(f"{base}/a.{kind}", packed.getvalue())
    cls = fsspec.get_filesystem_class(kind)
    made: list[str] = []
    real_init = cls.__init__

    def counted(self: object, *args: object, **kw: object) -> None:
        made.append(threading.current_thread().name)
        real_init(self, *args, **kw)

    index = ImageFolder(f"{kind}://::memory://{base}/a.{kind}")
    expected = [(tree / rel).read_bytes() for rel, _ in TREE_EXPECTED]
    errors: list[BaseException] = []

    def read_all() -> None:
        try:
            for _ in range(3):
                for i in range(len(index)):
                    assert index.read(i) == expected[i]
        except BaseException as exc:
            errors.append(exc)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(cls, "__init__", counted)
        threads = [threading.Thread(target=read_all, name=f"r{n}") for n in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert errors == []
    assert sorted(made) == ["r0", "r1", "r2"]  # one each, for 3 x 8 reads each


def test_a_tar_of_dot_reads_through_a_chained_url(tree: Path, tmp_path: Path) -> None:
    # `tar -cf d.tar -C dir .` names every member "./<class>/...": read as one class "."
    # whose every read failed, the "./" taken off as a path's is (QA54).
    import tarfile

    with tarfile.open(tmp_path / "d.tar", "w") as archive:
        for rel, _ in TREE_EXPECTED:
            archive.add(tree / rel, arcname=f"./{rel}")
    for root in (f"tar://::{tmp_path}/d.tar", f"tar://.::{tmp_path}/d.tar"):
        index = ImageFolder(root)
        assert index.classes == ["Cat", "bird", "dog"]
        assert index.fingerprint() == ImageFolder(tree).fingerprint()
        for i, (rel, _) in enumerate(TREE_EXPECTED):
            assert index.key(i) == f"tar://./{rel}::{tmp_path}/d.tar"
            assert index.read(i) == (tree / rel).read_bytes()


def test_a_local_archive_rewritten_is_read_afresh_in_the_same_thread(
    tree: Path, tmp_path: Path
) -> None:
    # A thread keeps the archives it read open: one rewritten since must not be read
    # through its old listing (a notebook that rewrites a zip and indexes it again).
    import zipfile

    path = tmp_path / "d.zip"
    rels = [rel for rel, _ in TREE_EXPECTED]
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr(rels[0], b"old")
    first = ImageFolder(f"zip://::{path}", allow_empty=True)
    assert len(first) == 1 and first.read(0) == b"old"
    with zipfile.ZipFile(path, "w") as archive:
        for rel in rels:
            archive.writestr(rel, (tree / rel).read_bytes())
    again = ImageFolder(f"zip://::{path}")
    assert again.fingerprint() == ImageFolder(tree).fingerprint()
    assert [again.read(i) for i in range(len(again))] == [(tree / r).read_bytes() for r in rels]


def test_a_remote_archive_rewritten_is_listed_afresh_in_the_same_thread(
    tree: Path, memfs: tuple[fsspec.AbstractFileSystem, str]
) -> None:
    # The thread's kept file system has no stamp for a remote archive: an index made
    # again listed the old archive for as long as the (main) thread lived (QA56).
    import io
    import zipfile

    fs, base = memfs
    rels = [rel for rel, _ in TREE_EXPECTED]

    def put(names: list[str]) -> None:
        packed = io.BytesIO()
        with zipfile.ZipFile(packed, "w") as archive:
            for rel in names:
                archive.writestr(rel, (tree / rel).read_bytes())
        fs.pipe_file(f"{base}/d.zip", packed.getvalue())

    put([r for r in rels if not r.startswith("dog/")])
    root = f"zip://::memory://{base}/d.zip"
    assert ImageFolder(root).classes == ["Cat", "bird"]
    put(rels)
    again = ImageFolder(root)
    assert again.fingerprint() == ImageFolder(tree).fingerprint()
    assert [again.read(i) for i in range(len(again))] == [(tree / r).read_bytes() for r in rels]


def test_a_folder_with_no_name_is_no_class_and_a_name_no_key_can_hold_no_sample(
    tree: Path, memfs: tuple[fsspec.AbstractFileSystem, str], caplog: pytest.LogCaptureFixture
) -> None:
    # An object key "root//x.jpg" and a zip member "/x/y.jpg" list a folder named "": as a
    # class, its search found the whole root again, each file a second time under label 0
    # and every real label one higher (QA54).
    import io
    import zipfile

    fs, base = memfs
    root = copy_to_memory(fs, tree, base + "/data")
    fs.pipe_file(f"{base}/data//stray.jpg", (tree / TREE_EXPECTED[0][0]).read_bytes())
    packed = io.BytesIO()
    with zipfile.ZipFile(packed, "w") as archive:
        for rel, _ in TREE_EXPECTED:
            archive.writestr(rel, (tree / rel).read_bytes())
        archive.writestr("/Cat/stray.jpg", (tree / TREE_EXPECTED[0][0]).read_bytes())
        # "::" splits a chained URL: no key can name this one (it was listed, then every
        # read of it was "not found").
        archive.writestr("Cat/g::h.jpg", (tree / TREE_EXPECTED[0][0]).read_bytes())
    fs.pipe_file(f"{base}/z.zip", packed.getvalue())
    for url in (root, f"zip://::memory://{base}/z.zip"):
        caplog.clear()
        index = ImageFolder(url)
        assert index.classes == ["Cat", "bird", "dog"]
        assert index.labels.tolist() == [label for _, label in TREE_EXPECTED]
        assert index.fingerprint() == ImageFolder(tree).fingerprint()
        assert "folder(s) named ''" in caplog.text
    assert "'Cat/g::h.jpg'" in caplog.text and "2 file(s) no key can name" in caplog.text


@pytest.mark.parametrize("inside", ["", "data"])
def test_a_folder_inside_a_zip_reads_through_a_chained_url(
    tree: Path, memfs: tuple[fsspec.AbstractFileSystem, str], inside: str
) -> None:
    # Keys were root + "/" + name: zip://::memory://z.zip/Cat/a.jpg names the archive as a
    # folder, and every read failed with "FileExistsError: /z.zip" (QA). The path belongs
    # in the zip link: zip://Cat/a.jpg::memory://z.zip.
    import io
    import zipfile

    packed = io.BytesIO()
    with zipfile.ZipFile(packed, "w") as archive:
        for rel, _ in TREE_EXPECTED:
            archive.writestr(f"{inside}/{rel}".lstrip("/"), (tree / rel).read_bytes())
    memfs[0].pipe_file(f"{memfs[1]}/z.zip", packed.getvalue())
    archive_url = f"memory://{memfs[1]}/z.zip"
    for root in (f"zip://{inside}::{archive_url}", f"zip://{inside}/::{archive_url}"):
        index = ImageFolder(root)
        assert index.labels.tolist() == [label for _, label in TREE_EXPECTED]
        assert index.fingerprint() == ImageFolder(tree).fingerprint()
        link = root.split("::")[0]  # zip:// and zip:/// (a root as written), zip://data/
        folder = link if link in ("zip://", "zip:///") else link.rstrip("/") + "/"
        for i, (rel, _) in enumerate(TREE_EXPECTED):
            assert index.key(i) == f"{folder}{rel}::{archive_url}"
            assert index.read(i) == (tree / rel).read_bytes()
    cached = ImageFolder(f"simplecache::{copy_to_memory(memfs[0], tree, memfs[1] + '/plain')}")
    assert cached.key(0).startswith("simplecache::memory://")  # the path is in the last link
    assert cached.read(0) == (tree / TREE_EXPECTED[0][0]).read_bytes()
    # A file system's root behind a cache keeps its slash (QA: simplecache::file:/// made
    # keys simplecache::file://tmp/..., read relative to the working folder).
    from gpu_loader.sources import FileList

    first = tree / TREE_EXPECTED[0][0]
    rooted = FileList([(str(first).lstrip("/"), 0)], root="simplecache::file:///")
    assert rooted.key(0) == f"simplecache::file://{first}" and rooted.read(0) == first.read_bytes()


def test_a_chain_whose_last_link_is_a_local_path_reads_as_fsspec_takes_it(
    tree: Path, tmp_path: Path, memfs: tuple[fsspec.AbstractFileSystem, str]
) -> None:
    # zip://::/data/z.zip, which fsspec opens, was taken for a zip URL with "::" in a
    # name: "IsADirectoryError: [Errno 21] Is a directory" naming the working folder (QA).
    import zipfile

    from gpu_loader.sources import open_index

    with zipfile.ZipFile(tmp_path / "z.zip", "w") as archive:
        for rel, _ in TREE_EXPECTED:
            archive.writestr(rel, (tree / rel).read_bytes())
    index = ImageFolder(f"zip://::{tmp_path}/z.zip")
    assert index.labels.tolist() == [label for _, label in TREE_EXPECTED]
    for i, (rel, _) in enumerate(TREE_EXPECTED):
        assert index.key(i) == f"zip://{rel}::{tmp_path}/z.zip"
        assert index.read(i) == (tree / rel).read_bytes()
    assert len(open_index(f"zip://::{tmp_path}/z.zip")) == len(TREE_EXPECTED)
    # A relative last link is made absolute, as a relative root is (QA: a later chdir
    # made every read fail).
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(tmp_path)
        relative = ImageFolder("zip://::z.zip")
        mp.chdir("/")
        assert relative.key(0) == index.key(0) and relative.read(0) == index.read(0)
    # After a file system that reads no other file, "::" is still part of a name.
    memfs[0].pipe_file(f"{memfs[1]}/odd::/cat/a.jpg", (tree / TREE_EXPECTED[0][0]).read_bytes())
    odd = ImageFolder(f"memory://{memfs[1]}/odd::")
    assert odd.key(0) == f"memory://{memfs[1]}/odd::/cat/a.jpg" and odd.read(0)


def test_a_url_read_shorter_than_its_listing_is_a_read_error(
    tree: Path, memfs: tuple[fsspec.AbstractFileSystem, str]
) -> None:
    # A whole-file read that came back short was blamed on the decoder ("truncated"), and
    # a file system returning str a TypeError there, naming nothing (QA).
    from fsspec.implementations.memory import MemoryFileSystem

    url = copy_to_memory(memfs[0], tree, memfs[1])
    index = ImageFolder(url)
    whole = index.read(0)
    memfs[0].pipe_file(f"{memfs[1]}/{TREE_EXPECTED[0][0]}", whole[:-5])  # cut since listed
    for read in (lambda: index.read(0), lambda: index.readinto(0, bytearray(len(whole)))):
        with pytest.raises(EOFError, match=rf"{re.escape(index.key(0))}.*{len(whole) - 5:,} of"):
            read()
    assert index.read(1) == (tree / TREE_EXPECTED[1][0]).read_bytes()  # the others read

    class TextFS(MemoryFileSystem):
        protocol = ("textfs",)

        def cat_file(
            self, path: str, start: int | None = None, end: int | None = None, **kw: object
        ) -> object:
            return "not bytes"

    fsspec.register_implementation("textfs", TextFS, clobber=True)
    with pytest.raises(TypeError, match=r"sample 'textfs://x\.jpg'.*returned str, not bytes"):
        read_file("textfs://x.jpg", "textfs://x.jpg")


def test_fingerprint_is_stable_and_independent_of_location(
    tree: Path, tmp_path: Path, memfs: tuple[fsspec.AbstractFileSystem, str]
) -> None:
    local = ImageFolder(tree)
    assert local.fingerprint() == ImageFolder(tree).fingerprint()
    url = copy_to_memory(memfs[0], tree, memfs[1])
    remote = ImageFolder(url)
    assert remote.fingerprint() == local.fingerprint()
    (tree / "dog" / "extra.png").write_bytes(local.read(4))
    assert ImageFolder(tree).fingerprint() != local.fingerprint()


def test_memory_url_end_to_end(tree: Path, memfs: tuple[fsspec.AbstractFileSystem, str]) -> None:
    url = copy_to_memory(memfs[0], tree, memfs[1])
    index = ImageFolder(url)
    assert index.classes == ["Cat", "bird", "dog"]
    assert [index.key(i) for i in range(len(index))] == [f"{url}/{r}" for r, _ in TREE_EXPECTED]
    assert index.labels.tolist() == [label for _, label in TREE_EXPECTED]
    for i, (rel, _) in enumerate(TREE_EXPECTED):
        expected = (tree / rel).read_bytes()
        assert index.read(i) == expected
        assert index.nbytes(i) == len(expected)  # from the listing, no extra request
        buf = bytearray(len(expected))
        assert index.readinto(i, buf) == len(expected)
        assert bytes(buf) == expected
    with pytest.raises(BufferTooSmallError, match="memory://"):
        index.readinto(0, bytearray(3))
    memfs[0].rm(f"{memfs[1]}/dog/a.png")
    with pytest.raises(FileNotFoundError, match=r"dog/a\.png"):
        index.read(4)


def test_file_url_uses_the_local_fast_path(tree: Path) -> None:
    index = ImageFolder(f"file://{tree}")
    assert index.key(0) == f"file://{tree}/Cat/x.webp"
    assert index.read(0) == (tree / "Cat" / "x.webp").read_bytes()
    assert index.nbytes(0) == (tree / "Cat" / "x.webp").stat().st_size
    assert index.fingerprint() == ImageFolder(tree).fingerprint()


def test_special_files_are_refused_with_their_key_at_once(tree: Path, reader: str) -> None:
    os.mkfifo(tree / "dog" / "pipe.jpg")  # opening it to read would wait for a writer forever
    (tree / "dog" / "zero.jpg").symlink_to("/dev/zero")  # never ends: would fill memory
    with socket.socket(socket.AF_UNIX) as server:  # open() fails with ENXIO, before fstat
        server.bind(str(tree / "dog" / "sock.jpg"))
    index = ImageFolder(tree)
    keys = [index.key(i) for i in range(len(index))]
    kinds = [("pipe.jpg", "FIFO (named pipe)"), ("zero.jpg", "character device")]
    kinds.append(("sock.jpg", "socket"))
    for name, kind in kinds:
        i = next(i for i, k in enumerate(keys) if k.endswith(name))
        with pytest.raises(OSError, match=rf"sample {keys[i]!r} is a {re.escape(kind)}"):
            index.read(i)
        with pytest.raises(OSError, match=re.escape(kind)):
            index.readinto(i, bytearray(64))


def test_a_file_over_the_byte_limit_is_refused_before_reading(tree: Path, reader: str) -> None:
    big = tree / "dog" / "huge.jpg"
    with big.open("wb") as f:  # sparse: 3 GB claimed, nothing written
        f.truncate(3 << 30)
    index = ImageFolder(tree)
    i = next(i for i in range(len(index)) if index.key(i).endswith("huge.jpg"))
    with pytest.raises(ValueError, match=r"is 3,221,225,472 bytes, over the 1,073,741,824"):
        index.read(i)
    with pytest.raises(ValueError, match="set_max_file_bytes"):
        index.readinto(i, bytearray(16))
    with pytest.raises(ValueError, match="an int >= 1 or None"):
        set_max_file_bytes(0)


def test_local_reads_at_the_limit_and_their_errors(tmp_path: Path, reader: str) -> None:
    data = bytes(range(256)) * 40
    path = tmp_path / "a.jpg"
    path.write_bytes(data)
    limit = max_file_bytes()
    try:
        set_max_file_bytes(len(data))  # exactly at the limit: read whole
        assert read_file("k", str(path)) == data
        set_max_file_bytes(len(data) - 1)
        with pytest.raises(ValueError, match=rf"sample 'k' is {len(data):,} bytes, over the"):
            read_file("k", str(path))
    finally:
        set_max_file_bytes(limit)
    empty = tmp_path / "empty.jpg"
    empty.write_bytes(b"")
    assert read_file("e", str(empty)) == b""
    odd = os.fsencode(tmp_path) + b"/\xff\xfe.jpg"  # a name that is not UTF-8
    with open(odd, "wb") as f:
        f.write(b"x")
    assert read_file("odd", os.fsdecode(odd)) == b"x"
    with pytest.raises(FileNotFoundError, match="sample 'gone' not found"):
        read_file("gone", str(tmp_path / "gone.jpg"))
    with pytest.raises(OSError, match="sample 'dir' is a folder") as info:
        read_file("dir", str(tmp_path))
    assert info.value.filename == str(tmp_path)
    with pytest.raises(NotADirectoryError) as notdir:
        read_file("nd", str(path / "x.jpg"))
    assert notdir.value.filename == str(path / "x.jpg")
    assert "sample: nd" in getattr(notdir.value, "__notes__", [])
    with pytest.raises(ValueError, match="null"):
        read_file("nul", str(tmp_path / "a\0.jpg"))
    if os.path.exists("/proc/self/cmdline"):  # regular, but claims 0 bytes: read to EOF
        assert read_file("proc", "/proc/self/cmdline") == Path("/proc/self/cmdline").read_bytes()
        # ... and held to the limit all the same, whatever its size said.
        status = len(Path("/proc/self/status").read_bytes())
        try:
            set_max_file_bytes(status // 2)
            with pytest.raises(ValueError, match=r"'proc' grew past the [\d,]+-byte limit"):
                read_file("proc", "/proc/self/status")
            set_max_file_bytes(2**64)  # beyond any file: no limit, on both paths
            assert read_file("k", str(path)) == data
        finally:
            set_max_file_bytes(limit)


def test_a_runs_local_files_read_in_one_call_give_what_each_read_alone_gives(
    tmp_path: Path,
) -> None:
    # `read_local_files` (the CPU path's read runs: one release of the GIL for a run) gives
    # per file the bytes or the error `read_file` gives, type, words, notes and file name.
    from gpu_loader.ops._backend import native_module
    from gpu_loader.sources import _io

    if native_module() is None:
        pytest.skip("the native extension is not built")
    good = tmp_path / "a.jpg"
    good.write_bytes(bytes(range(256)) * 8)
    (tmp_path / "empty.jpg").write_bytes(b"")
    (tmp_path / "big.jpg").write_bytes(b"x" * 5000)
    os.mkfifo(tmp_path / "fifo.jpg")
    (tmp_path / "loop.jpg").symlink_to(tmp_path / "loop.jpg")
    odd = os.fsdecode(os.fsencode(tmp_path) + b"/\xff.jpg")  # a name that is not UTF-8
    Path(odd).write_bytes(b"odd")
    names = ["a.jpg", "empty.jpg", "big.jpg", "gone.jpg", "fifo.jpg", "loop.jpg", "a.jpg/x"]
    keys = [str(tmp_path / n) for n in names] + [str(tmp_path), str(tmp_path / "n\0.jpg"), odd]

    def alone(key: str) -> object:
        try:
            return _io.read_file(key, key)
        except Exception as exc:
            return exc

    limit = max_file_bytes()
    try:
        set_max_file_bytes(4096)
        got = _io.read_local_files(keys, keys)
        assert got is not None
        results, seconds = got
        assert len(results) == len(seconds) == len(keys) and min(seconds) >= 0
        expected = [alone(k) for k in keys]
        assert [type(r) for r in results] == [type(e) for e in expected]
        assert all(same_outcome(e, r) for e, r in zip(expected, results, strict=True))
        assert results[0] == good.read_bytes() and results[1] == b"" and results[-1] == b"odd"
        assert "over the 4,096-byte limit" in str(results[2])
        assert isinstance(results[3], FileNotFoundError) and "not found" in str(results[3])
    finally:
        set_max_file_bytes(limit)
    assert _io.read_local_files([], []) == ([], [])


def test_a_limit_changed_during_a_read_words_the_one_it_was_read_with(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Another thread may call set_max_file_bytes while a read is in the native call.
    from gpu_loader.ops._backend import native_module
    from gpu_loader.sources import _io

    native = native_module()
    if native is None:
        pytest.skip("the native extension is not built")
    path = tmp_path / "a.jpg"
    path.write_bytes(b"x" * 500)

    class Racing:
        def read_regular(self, location: str, cap: int) -> object:
            got = native.read_regular(location, cap)
            set_max_file_bytes(None)  # lifted meanwhile
            return got

    monkeypatch.setattr("gpu_loader.ops._backend.native_module", lambda: Racing())
    limit = max_file_bytes()
    try:
        set_max_file_bytes(100)
        with pytest.raises(ValueError, match="is 500 bytes, over the 100-byte limit"):
            _io.read_file("k", str(path))
    finally:
        set_max_file_bytes(limit)


def test_a_url_over_the_byte_limit_is_refused_with_its_key(
    tree: Path, memfs: tuple[fsspec.AbstractFileSystem, str]
) -> None:
    url = copy_to_memory(memfs[0], tree, memfs[1])
    index = ImageFolder(url)
    sizes = [len(index.read(i)) for i in range(len(index))]
    big = max(range(len(index)), key=sizes.__getitem__)
    small = min(range(len(index)), key=sizes.__getitem__)
    limit = max_file_bytes()
    set_max_file_bytes(sizes[big] - 1)
    try:
        with pytest.raises(ValueError, match=rf"{re.escape(repr(index.key(big)))} is more than"):
            index.read(big)
        with pytest.raises(ValueError, match="set_max_file_bytes"):
            index.readinto(big, bytearray(sizes[big]))
        assert index.read(small) == (tree / TREE_EXPECTED[small][0]).read_bytes()
        set_max_file_bytes(sizes[big])  # exactly at the limit: read whole
        assert len(index.read(big)) == sizes[big]
    finally:
        set_max_file_bytes(limit)


def test_a_symlinked_folder_looping_back_is_not_entered(
    tree: Path, caplog: pytest.LogCaptureFixture
) -> None:
    before = [ImageFolder(tree).key(i) for i in range(len(ImageFolder(tree)))]
    (tree / "dog" / "sub" / "back").symlink_to(tree / "dog")  # dog/sub/back -> dog
    (tree / "bird" / "elsewhere").symlink_to(tree / "Cat")  # not a loop: followed
    with caplog.at_level("WARNING", logger="gpu_loader.sources"):
        index = ImageFolder(tree)
    keys = [index.key(i) for i in range(len(index))]
    assert sorted(keys) == sorted([*before, str(tree / "bird" / "elsewhere" / "x.webp")])
    assert "leads back to a folder above it" in caplog.text and "back" in caplog.text


def test_a_root_through_a_symlink_and_dot_dot_reads_the_files_it_lists(tmp_path: Path) -> None:
    # QA63: the classes were listed where the OS resolves "lnk/.." (the link target's
    # parent), and the keys built from the text tidied to the link's own folder: every
    # sample "not found", or, where that folder had a file of the same name, its bytes.
    real = tmp_path / "real" / "ds"
    (real / "cat").mkdir(parents=True)
    (real / "cat" / "x.jpg").write_bytes(b"\xff\xd8 the listed file")
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "lnk").symlink_to(real / "cat")
    (tmp_path / "a" / "cat").mkdir()
    (tmp_path / "a" / "cat" / "x.jpg").write_bytes(b"\xff\xd8 another file")
    index = ImageFolder(f"{tmp_path}/a/lnk/..")
    assert index.classes == ["cat"] and index.read(0) == b"\xff\xd8 the listed file"


def test_a_link_back_above_a_root_reached_through_a_symlink_is_not_entered(
    tmp_path: Path,
) -> None:
    # QA64: the folders above the root were taken on disk only, so a link back to the
    # folder holding the symlink the root was named through listed that folder's files.
    (tmp_path / "real" / "cls").mkdir(parents=True)
    (tmp_path / "real" / "cls" / "r.jpg").write_bytes(b"\xff\xd8")
    (tmp_path / "data" / "junk").mkdir(parents=True)
    (tmp_path / "data" / "junk" / "j.jpg").write_bytes(b"\xff\xd8")
    (tmp_path / "data" / "lnk").symlink_to(tmp_path / "real")
    (tmp_path / "real" / "cls" / "back").symlink_to(tmp_path / "data")
    index = ImageFolder(tmp_path / "data" / "lnk")
    assert [index.key(i) for i in range(len(index))] == [str(tmp_path / "data/lnk/cls/r.jpg")]
    # Written "lnk/..", the folders above are those above the link's target's parent.
    (tmp_path / "real" / "cls" / "back").unlink()
    (tmp_path / "real" / "cls" / "back").symlink_to(tmp_path / "real")
    (tmp_path / "real" / "cls" / "x.jpg").write_bytes(b"\xff\xd8")
    (tmp_path / "real" / "stray.jpg").write_bytes(b"\xff\xd8")  # in no class
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "lnk").symlink_to(tmp_path / "real" / "cls")
    index = ImageFolder(f"{tmp_path}/a/lnk/..")
    assert [index.key(i) for i in range(len(index))] == [
        f"{tmp_path}/a/lnk/../cls/{name}" for name in ("r.jpg", "x.jpg")
    ]


def test_a_link_to_the_root_is_not_entered_so_no_file_gets_another_label(
    tree: Path, caplog: pytest.LogCaptureFixture
) -> None:
    expected = ImageFolder(tree)
    (tree / "bird" / "up").symlink_to(tree)  # bird/up/dog/... would be labelled bird
    (tree / "dog" / "top").symlink_to(tree.parent)  # above the root
    with caplog.at_level("WARNING", logger="gpu_loader.sources"):
        index = ImageFolder(tree)
    assert [index.key(i) for i in range(len(index))] == [
        expected.key(i) for i in range(len(expected))
    ]
    assert index.labels.tolist() == expected.labels.tolist()
    assert caplog.text.count("leads back to a folder above it") == 2


def test_a_file_name_that_is_not_utf8_loads(tree: Path) -> None:
    raw = os.path.join(os.fsencode(tree / "dog"), b"caf\xe9.jpg")  # Latin-1, not UTF-8
    with open(raw, "wb") as f:
        f.write((tree / "dog" / "b.jpg").read_bytes())
    index = ImageFolder(tree)
    assert len(index.fingerprint()) == 32
    i = next(i for i in range(len(index)) if "caf" in index.key(i))
    assert index.read(i) == (tree / "dog" / "b.jpg").read_bytes()


def test_a_relative_root_keeps_naming_its_files_after_a_chdir(
    tree: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # QA: keys stayed relative ("train/cat/a.jpg"): after a chdir every read failed.
    monkeypatch.chdir(tree.parent)
    index = ImageFolder("train")
    monkeypatch.chdir(tree / "dog")
    assert index.key(0) == os.path.join(tree, TREE_EXPECTED[0][0])
    assert index.read(0) == (tree / TREE_EXPECTED[0][0]).read_bytes()
    assert index.root == "train"  # as given, as torchvision keeps it


def test_macos_resource_forks_are_passed_over(
    tree: Path, memfs: tuple[fsspec.AbstractFileSystem, str]
) -> None:
    # QA: a folder copied from a Mac indexed each "._x.jpg" (not an image) as a sample,
    # and the default failure limit then stopped the epoch; TarShards passed them over.
    for rel, _ in TREE_EXPECTED:
        folder, name = os.path.split(rel)
        (tree / folder / f"._{name}").write_bytes(b"\x00\x05\x16\x07 AppleDouble")
    for index in (ImageFolder(tree), ImageFolder(copy_to_memory(memfs[0], tree, memfs[1]))):
        assert len(index) == len(TREE_EXPECTED)
        assert not any("/._" in index.key(i) for i in range(len(index)))


def test_an_archive_root_that_is_no_archive_is_named(tmp_path: Path) -> None:
    # QA54: a bare "BadZipFile: File is not a zip file", naming neither root nor CSV.
    from gpu_loader.sources import FileList

    (tmp_path / "not.zip").write_bytes(b"garbage" * 10)
    root = f"zip://::{tmp_path}/not.zip"
    with pytest.raises(ValueError, match=re.escape(f"ImageFolder root {root!r}")):
        ImageFolder(root)
    csv = f"zip://l.csv::{tmp_path}/not.zip"
    with pytest.raises(ValueError, match=re.escape(f"CSV file {csv!r} could not be read")):
        FileList.from_csv(csv)
