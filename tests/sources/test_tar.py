"""TarShards: random reads equal sequential reads, labels, hostile members, fsspec shards."""

from __future__ import annotations

import errno
import functools
import gzip
import io
import os
import tarfile
from pathlib import Path
from typing import Any, ClassVar

import fsspec
import numpy as np
import pytest

from gpu_loader.sources import BufferTooSmallError, SampleIndex, TarShards, expand_urls
from gpu_loader.sources._io import max_file_bytes, set_max_file_bytes
from gpu_loader.sources._tar import _is_header
from tests.sources._data import add_member, image_bytes, same_outcome, shard_bytes


def _samples(shard: int, count: int) -> list[tuple[str, str, bytes, int | None]]:
    exts = ["jpg", "png", "jpeg", "webp"]
    fmts = {"jpg": "JPEG", "jpeg": "JPEG", "png": "PNG", "webp": "WEBP"}
    out: list[tuple[str, str, bytes, int | None]] = []
    for k in range(count):
        ext = exts[k % len(exts)]
        data = image_bytes(100 * shard + k, fmts[ext], size=(5 + k, 4 + shard))
        out.append((f"s{shard}/{k:04d}", ext, data, (shard * 7 + k) % 5))
    return out


@pytest.fixture
def shards(tmp_path: Path) -> list[Path]:
    paths = []
    for s in range(3):
        path = tmp_path / f"train-{s:03d}.tar"
        path.write_bytes(shard_bytes(_samples(s, 4 + s)))
        paths.append(path)
    return paths


def _sequential(paths: list[Path]) -> list[tuple[str, bytes, int]]:
    """Reference: stream every shard with tarfile, pair images with their .cls."""
    out = []
    for path in paths:
        with tarfile.open(path) as tar:
            members = {m.name: tar.extractfile(m).read() for m in tar if m.isfile()}  # type: ignore[union-attr]
        for name, data in members.items():
            stem, ext = name.split(".", 1)
            if ext != "cls":
                out.append((f"{path}:{name}", data, int(members[f"{stem}.cls"])))
    return out


def test_random_reads_match_sequential_reads(shards: list[Path]) -> None:
    index = TarShards([str(p) for p in shards])
    assert isinstance(index, SampleIndex)
    expected = _sequential(shards)
    assert len(index) == len(expected) == 4 + 5 + 6
    assert [index.key(i) for i in range(len(index))] == [k for k, _, _ in expected]
    assert index.labels.tolist() == [label for _, _, label in expected]
    order = np.random.default_rng(0).permutation(len(index))
    for i in order:  # random access: every read seeks on its own
        key, data, label = expected[i]
        assert index.read(i) == data, key
        assert index.nbytes(i) == len(data)
        assert index.label(i) == label
        buf = np.zeros(len(data), np.uint8)
        assert index.readinto(i, buf) == len(data)
        assert buf.tobytes() == data


def test_readinto_too_small_names_the_member(shards: list[Path]) -> None:
    index = TarShards([str(shards[0])])
    with pytest.raises(BufferTooSmallError, match=r"train-000\.tar:s0/0000\.jpg"):
        index.readinto(0, bytearray(10))


def test_brace_pattern_and_single_path(shards: list[Path], tmp_path: Path) -> None:
    pattern = f"{tmp_path}/train-{{000..002}}.tar"
    assert expand_urls(pattern) == [str(p) for p in shards]
    assert len(TarShards(pattern)) == 15
    assert len(TarShards(shards[1])) == 5
    assert expand_urls("a-{x,y}-{8..10}") == [
        "a-x-8",
        "a-x-9",
        "a-x-10",
        "a-y-8",
        "a-y-9",
        "a-y-10",
    ]
    with pytest.raises(ValueError, match="backwards"):
        expand_urls("s-{5..1}.tar")


@pytest.mark.parametrize(
    ("pattern", "expected"),
    [
        ("x{a,{b,c}}.tar", ["xa.tar", "xb.tar", "xc.tar"]),  # nested: no shard twice
        ("s{1..010}", [f"s{n:03d}" for n in range(1, 11)]),  # padded to the wider end, as bash
        ("s{0..10}", [f"s{n}" for n in range(11)]),  # a lone 0 is no padding
        ("s{0..6..3}", ["s0", "s3", "s6"]),  # a step
        ("s{a}.tar", ["s{a}.tar"]),  # neither a list nor a range: literal
        ("{a}{0..1}", ["{a}0", "{a}1"]),
        ("p{1..3", ["p{1..3"]),  # unclosed: literal
    ],
)
def test_brace_patterns_expand_as_bash_does(pattern: str, expected: list[str]) -> None:
    assert expand_urls(pattern) == expected


def test_a_pattern_naming_a_shard_twice_is_refused() -> None:
    with pytest.raises(ValueError, match="more than once"):
        expand_urls("x{a,b,a}.tar")


@pytest.mark.timeout(20)
@pytest.mark.parametrize("pattern", ["s{0..999999999999}.tar", "s{000..999}{000..999}{0..9}.tar"])
def test_a_pattern_past_a_million_names_is_refused_before_it_is_built(pattern: str) -> None:
    # A typo's range was expanded whole first: MemoryError, or the machine's memory (QA).
    with pytest.raises(ValueError, match=r"more than 1,000,000 names; is a range mistyped"):
        expand_urls(pattern)
    assert len(expand_urls("s{000..999}{000..999}.tar")) == 1_000_000  # the limit itself


def test_brace_ranges_take_ascii_digits_only() -> None:
    assert expand_urls("s{\u0660..\u0663}.tar") == ["s{\u0660..\u0663}.tar"]  # literal, as bash


def test_a_list_naming_a_shard_twice_and_labels_outside_classes_are_refused(
    shards: list[Path],
) -> None:
    one = str(shards[0])
    os.link(one, shards[0].parent / "hard-link.tar")  # QA: a hard link passed as another
    hard = str(shards[0].parent / "hard-link.tar")
    for twice in (
        [one, one],
        [one, f"file://{one}"],
        [one, f"local://{one}"],  # fsspec's other name for file:// (QA54)
        [one, one.replace("/train-", "/./train-")],
        [one, hard],
    ):
        with pytest.raises(ValueError, match="names one shard twice"):
            TarShards(twice)
    labels = TarShards([one]).labels
    assert TarShards([f"local://{one}"]).read(0) == TarShards([one]).read(0)
    low, high = int(labels.min()), int(labels.max())
    with pytest.raises(ValueError, match=rf"labels span {low}\.\.{high} but 2 classes were named"):
        TarShards([one], classes=["a", "b"])
    named = TarShards([one], classes=[str(k) for k in range(int(labels.max()) + 1)])
    assert named.labels.tolist() == labels.tolist()


def test_one_memory_shard_spelled_two_ways_is_refused(
    memfs: tuple[fsspec.AbstractFileSystem, str],
) -> None:
    # QA: these pairs were taken as two shards, each sample coming twice per epoch.
    fs, base = memfs
    fs.pipe_file(f"{base}/s.tar", shard_bytes([("x", "jpg", image_bytes(0), 0)]))
    url = f"memory://{base.lstrip('/')}/s.tar"
    others = [f"memory:///{base.lstrip('/')}/s.tar", f"memory://{base.lstrip('/')}/./s.tar"]
    others.append(f"simplecache::{url}")  # a cache in front is the same shard
    for other in others:
        with pytest.raises(ValueError, match="names one shard twice"):
            TarShards([url, other])
    assert len(TarShards([url])) == 1
    assert len(TarShards([f"simplecache::{url}"])) == 1


@pytest.mark.parametrize("outer", ["zip", "tar"])
def test_a_shard_inside_another_archive_is_indexed_and_read(tmp_path: Path, outer: str) -> None:
    # QA54: "seek of closed file": the outer archive's file system, dropped once the
    # shard was open, closed the file the shard was read through.
    import zipfile

    data = image_bytes(3)
    inner = shard_bytes([("x", "jpg", data, 1), ("y", "jpg", image_bytes(4), 2)])
    packed = io.BytesIO()
    if outer == "zip":
        with zipfile.ZipFile(packed, "w") as archive:
            archive.writestr("in.tar", inner)
    else:
        with tarfile.open(fileobj=packed, mode="w") as archive:
            add_member(archive, "in.tar", inner)
    (tmp_path / f"outer.{outer}").write_bytes(packed.getvalue())
    index = TarShards([f"{outer}://in.tar::{tmp_path}/outer.{outer}"])
    assert index.labels.tolist() == [1, 2]
    assert index.read(0) == data


def test_a_member_name_holding_a_newline_is_a_sample(tmp_path: Path) -> None:
    # QA54: "new\nline/a.jpg" was dropped as if its name started with a dot: the key
    # pattern's "." did not match a newline.
    data = image_bytes(5)
    path = tmp_path / "n.tar"
    path.write_bytes(shard_bytes([("new\nline/a", "jpg", data, 2), ("b\n", "jpg", data, 1)]))
    index = TarShards([str(path)])
    assert [index.key(i) for i in range(len(index))] == [
        f"{path}:new\nline/a.jpg",
        f"{path}:b\n.jpg",
    ]
    assert index.labels.tolist() == [2, 1] and index.read(0) == data


def test_missing_cls_gives_label_minus_one_and_extra_members_are_ignored(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        tar.addfile(tarfile.TarInfo("dir"))  # a directory entry: skipped
        add_member(tar, "a.jpg", image_bytes(1))
        add_member(tar, "a.json", b"{}")
        add_member(tar, "b.json", b"{}")  # no image: not a sample
        add_member(tar, "README", b"no extension")
        add_member(tar, "c.png", image_bytes(2, "PNG"))
        add_member(tar, "c.cls", b" 3\n")
        add_member(tar, "d.JPG", image_bytes(3))  # extensions in any case
        add_member(tar, "d.cls", b"4")
    path = tmp_path / "x.tar"
    path.write_bytes(out.getvalue())
    with caplog.at_level("WARNING", logger="gpu_loader.sources"):
        index = TarShards([str(path)])
    keys = [index.key(i).split(":")[-1] for i in range(len(index))]
    assert keys == ["a.jpg", "c.png", "d.JPG"]
    assert index.labels.tolist() == [-1, 3, 4]
    # QA65: a tar of class folders was all -1 without a word.
    assert "1 of 3 samples have no .cls member and get label -1" in caplog.text


def test_images_and_labels_no_sample_takes_are_named_in_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # QA: four labelled samples of five vanished from the index without a word.
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        for name, fmt in (("good.jpg", "JPEG"), ("pic.gif", "GIF"), ("scan.tif", "TIFF")):
            add_member(tar, name, image_bytes(len(name), fmt))
            add_member(tar, name.split(".")[0] + ".cls", b"1")
        add_member(tar, "img.v2.jpg", image_bytes(7))  # key "img", extension "v2.jpg"
        add_member(tar, "img.cls", b"2")
        add_member(tar, ".hidden.jpg", image_bytes(8))  # no key at all
        add_member(tar, "meta.json", b"{}")  # a companion file: not an image, no warning
        # Companions of an indexed sample: another format beside its .jpg, a mask.
        add_member(tar, "good.tif", image_bytes(9, "TIFF"))
        add_member(tar, "good.seg.png", image_bytes(10, "PNG"))
        add_member(tar, "._good.jpg", b"macOS resource fork")  # not an image: no word
        add_member(tar, "sub/._deep.jpg", b"macOS resource fork")  # nor in a folder
        add_member(tar, "sub/.jpg", image_bytes(11))  # no key: lost, not a sample "sub/"
    path = tmp_path / "odd.tar"
    path.write_bytes(out.getvalue())
    with caplog.at_level("WARNING", logger="gpu_loader.sources"):
        index = TarShards([str(path)])
    members = [index.key(i).split(":")[-1] for i in range(len(index))]
    assert members == ["good.jpg", "pic.gif", "scan.tif"]  # every format, in archive order
    assert index.labels.tolist() == [1, 1, 1]
    (warning,) = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert "3 image member(s) no sample takes ('img.v2.jpg', '.hidden.jpg', 'sub/.jpg')" in warning
    assert "1 label(s) without an image ('img.cls')" in warning and "odd.tar" in warning
    assert "meta.json" not in warning and "indexed 3 sample(s)" in warning
    assert "good" not in warning
    caplog.clear()
    with caplog.at_level("WARNING", logger="gpu_loader.sources"):
        TarShards([str(p) for p in _plain_shards(tmp_path)])
    assert not caplog.records  # ordinary shards: nothing to say


def test_two_images_of_the_other_formats_for_one_key_are_refused(tmp_path: Path) -> None:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        add_member(tar, "a.gif", image_bytes(1, "GIF"))
        add_member(tar, "a.bmp", image_bytes(2, "BMP"))
    path = tmp_path / "two.tar"
    path.write_bytes(out.getvalue())
    with pytest.raises(ValueError, match="two images for the key 'a'"):
        TarShards([str(path)])


def _plain_shards(tmp_path: Path) -> list[Path]:
    path = tmp_path / "plain.tar"
    path.write_bytes(shard_bytes(_samples(0, 4)))
    return [path]


@pytest.mark.parametrize("name", ["/etc/passwd.jpg", "../up.jpg", "a/../../b.jpg", "C:/x.jpg"])
def test_hostile_member_names_are_refused(tmp_path: Path, name: str) -> None:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        add_member(tar, "fine.jpg", image_bytes(1))
        add_member(tar, name, image_bytes(2))
    path = tmp_path / "bad.tar"
    path.write_bytes(out.getvalue())
    with pytest.raises(ValueError, match="escapes the archive") as info:
        TarShards([str(path)])
    assert repr(name) in str(info.value)


def labelled(tar: tarfile.TarFile, cls: bytes) -> None:
    add_member(tar, "k.jpg", b"1")
    add_member(tar, "k.cls", cls)


def test_links_duplicates_and_bad_labels_are_refused(tmp_path: Path) -> None:
    def shard(build: object) -> str:
        out = io.BytesIO()
        with tarfile.open(fileobj=out, mode="w") as tar:
            build(tar)  # type: ignore[operator]
        path = tmp_path / f"s{len(list(tmp_path.iterdir()))}.tar"
        path.write_bytes(out.getvalue())
        return str(path)

    def link(tar: tarfile.TarFile) -> None:
        info = tarfile.TarInfo("evil.jpg")
        info.type, info.linkname = tarfile.SYMTYPE, "/etc/passwd"
        tar.addfile(info)

    def sparse(tar: tarfile.TarFile) -> None:
        # `isreg()` holds for a GNU sparse member too: its stored bytes are not the file.
        data = image_bytes(1)
        info = tarfile.TarInfo("holes.jpg")
        info.type, info.size = tarfile.GNUTYPE_SPARSE, len(data)
        tar.addfile(info, io.BytesIO(data))

    with pytest.raises(ValueError, match=r"'evil\.jpg' is a link"):
        TarShards([shard(link)])
    with pytest.raises(ValueError, match=r"'holes\.jpg' is a sparse file"):
        TarShards([shard(sparse)])
    with pytest.raises(ValueError, match="two images for the key 'k'"):
        TarShards([shard(lambda t: (add_member(t, "k.jpg", b"1"), add_member(t, "k.png", b"2")))])
    with pytest.raises(ValueError, match="integer label, got 'cat'"):
        TarShards([shard(lambda t: (add_member(t, "k.jpg", b"1"), add_member(t, "k.cls", b"cat")))])
    for text in ("1_0", "\uff13"):  # int() takes both; a CSV list's labels may not
        with pytest.raises(ValueError, match=f"integer label, got '{text}'"):
            TarShards([shard(functools.partial(labelled, cls=text.encode()))])
    with pytest.raises(ValueError, match="two labels for the key 'k'"):
        TarShards([shard(lambda t: [add_member(t, n, d) for n, d in LABELS_TWICE])])
    with pytest.raises(ValueError, match=r"member 'k\.cls'.* does not fit in int64"):
        TarShards([shard(lambda t: (add_member(t, "k.jpg", b"1"), add_member(t, "k.cls", HUGE)))])
    with pytest.raises(ValueError, match=r"'k\.cls' should hold an integer label, but it is 4,096"):
        TarShards([shard(lambda t: (add_member(t, "k.jpg", b"1"), add_member(t, "k.cls", FILL)))])
    # A colon is an ordinary character in a POSIX name (only "C:/..." is a drive path).
    colon = TarShards(
        [shard(lambda t: (add_member(t, "a:b.jpg", b"1"), add_member(t, "a:b.cls", b"3")))]
    )
    assert colon.key(0).endswith("a:b.jpg") and colon.label(0) == 3


LABELS_TWICE = [("k.jpg", b"1"), ("k.cls", b"0"), ("k.cls", b"7")]
HUGE = b"99999999999999999999999"
FILL = b"1" + b" " * 4095


def test_a_fifo_given_as_a_shard_is_refused_at_once(tmp_path: Path) -> None:
    fifo = tmp_path / "s.tar"
    os.mkfifo(fifo)  # opening it to read would wait for a writer forever
    with pytest.raises(OSError, match=r"tar shard .*s\.tar' is a FIFO \(named pipe\)"):
        TarShards([str(fifo)])


def test_a_member_over_the_byte_limit_is_refused_before_reading(shards: list[Path]) -> None:
    index = TarShards([str(p) for p in shards])
    limit = max_file_bytes()
    set_max_file_bytes(index.nbytes(0) - 1)
    try:
        with pytest.raises(ValueError, match=rf"sample {index.key(0)!r} is .* over the"):
            index.read(0)
    finally:
        set_max_file_bytes(limit)
    assert index.read(0)  # back under the limit


def test_compressed_and_missing_shards_are_clear_errors(shards: list[Path], tmp_path: Path) -> None:
    gz = tmp_path / "c.tar.gz"
    gz.write_bytes(gzip.compress(shards[0].read_bytes()))
    with pytest.raises(ValueError, match="not an uncompressed tar"):
        TarShards([str(gz)])
    with pytest.raises(FileNotFoundError, match=r"nope\.tar"):
        TarShards([str(tmp_path / "nope.tar")])
    with pytest.raises(ValueError, match="at least one shard"):
        TarShards([])
    with pytest.raises(ValueError, match="so decompress it first"):
        TarShards([str(gz)])
    junk = tmp_path / "junk.tar"
    junk.write_bytes(b"this is not a tar file at all" * 40)
    with pytest.raises(ValueError, match=r"junk\.tar.*not a tar file, or it is truncated"):
        TarShards([str(junk)])
    with tarfile.open(shards[0]) as tar:  # cut inside the largest member's data
        big = max(tar.getmembers(), key=lambda m: m.size)
    cut = tmp_path / "cut.tar"
    cut.write_bytes(shards[0].read_bytes()[: big.offset_data + big.size // 2])
    with pytest.raises(ValueError, match=r"cut\.tar.*truncated or corrupt"):
        TarShards([str(cut)])
    with tarfile.open(shards[0]) as tar:  # one byte short of the last member's data
        last = tar.getmembers()[-1]
    cut.write_bytes(shards[0].read_bytes()[: last.offset_data + last.size - 1])
    with pytest.raises(ValueError, match=r"cut\.tar.*truncated or corrupt"):
        TarShards([str(cut)])


def test_a_damaged_or_cut_member_header_is_not_the_end_of_the_shard(
    shards: list[Path], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # tarfile stops quietly at a header it cannot read after the first: the samples after
    # it vanished, and a cut before an image's .cls left the image with label -1.
    data = shards[2].read_bytes()
    with tarfile.open(shards[2]) as tar:
        headers = [m.offset for m in tar.getmembers()]
    middle = headers[len(headers) // 2]
    flipped = bytearray(data)
    flipped[middle + 10] ^= 0x01  # inside the name field: the checksum no longer matches
    bad = tmp_path / "bad.tar"
    bad.write_bytes(bytes(flipped))
    with pytest.raises(ValueError, match=rf"bad\.tar.*header at byte {middle:,} .* damaged"):
        TarShards([str(bad)])
    part = tmp_path / "part.tar"
    part.write_bytes(data[: middle + 100])
    with pytest.raises(ValueError, match=rf"part\.tar.*header at byte {middle:,} .* cut short"):
        TarShards([str(part)])
    # Cut on a header boundary, it looks like an archive without its end marker: read,
    # and said.
    edge = tmp_path / "edge.tar"
    edge.write_bytes(data[:middle])
    with caplog.at_level("WARNING", logger="gpu_loader.sources"):
        index = TarShards([str(edge)])
    assert 0 < len(index) < len(TarShards([str(shards[2])]))
    assert f"edge.tar' ends at byte {middle} without tar's end-of-archive marker" in caplog.text


def test_data_after_the_end_marker_is_refused_not_lost(shards: list[Path], tmp_path: Path) -> None:
    # tarfile takes one zero block as the end of the archive: shards joined with `cat`,
    # or a member header zeroed in place, indexed the members before it and lost the rest
    # with no error and no warning (QA).
    first, second = shards[0].read_bytes(), shards[1].read_bytes()
    joined = tmp_path / "joined.tar"
    joined.write_bytes(first + second)
    with pytest.raises(
        ValueError, match=rf"joined\.tar.*cat \(a member header at byte {len(first):,}"
    ):
        TarShards([str(joined)])
    with tarfile.open(shards[2]) as tar:
        middle = tar.getmembers()[2].offset
    zeroed = bytearray(shards[2].read_bytes())
    zeroed[middle : middle + 512] = bytes(512)
    hole = tmp_path / "hole.tar"
    hole.write_bytes(bytes(zeroed))
    with pytest.raises(ValueError, match=rf"hole\.tar.*marker at byte {middle:,}.*zeroed"):
        TarShards([str(hole)])
    padded = tmp_path / "padded.tar"  # zeros past the record's padding are still the end
    padded.write_bytes(first + bytes(200_000))
    assert len(TarShards([str(padded)])) == len(TarShards([str(shards[0])]))
    # POSIX leaves what follows the two zero blocks undefined (QA: a conforming archive
    # with junk in its last record's padding was refused as two joined ones).
    with tarfile.open(shards[0]) as tar:
        last = tar.getmembers()[-1]
    marker = last.offset_data + -(-last.size // 512) * 512
    assert first[marker:] == bytes(len(first) - marker)  # the two zero blocks, and padding
    junk = tmp_path / "junk.tar"
    junk.write_bytes(first + b"\x07junk" * 400)
    assert len(TarShards([str(junk)])) == len(TarShards([str(shards[0])]))
    stale = tmp_path / "stale.tar"  # a writer that reused its record buffer (QA)
    stale.write_bytes(_with_stale_padding(_padded_shard(tarfile.PAX_FORMAT)))
    assert len(TarShards([str(stale)])) == _PADDED_SAMPLES


_RECORD = tarfile.RECORDSIZE
_PADDED_SAMPLES = 10  # 2 KiB each with their extended headers: 2 records, then padding


def _padded_shard(fmt: int) -> bytes:
    """A shard whose last record is mostly padding, with long names (an extended header
    per member) in GNU and PAX formats."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=fmt) as tar:
        for k in range(_PADDED_SAMPLES):
            add_member(tar, f"{'k' * 110}{k:03d}.jpg", bytes([k]) * 300)
    data = out.getvalue()
    assert len(data) - _end_marker(data) > _RECORD // 2  # the last record mostly padding
    return data


def _end_marker(data: bytes) -> int:
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        tar.getmembers()
        return tar.offset


def _with_stale_padding(data: bytes) -> bytes:
    """``data`` as a writer that reuses its record buffer leaves it: the padding after the
    two zero blocks holds the bytes one record back."""
    out = bytearray(data)
    end = _end_marker(data)
    for at in range(end + 1024, len(out), 512):
        out[at : at + 512] = out[at - _RECORD : at - _RECORD + 512]
    headers = [
        at for at in range(end + 1024, len(out), 512) if _is_header(bytes(out[at : at + 512]))
    ]
    assert len(headers) >= 2  # the test copies headers, extended ones included
    return bytes(out)


@pytest.mark.parametrize("fmt", [tarfile.GNU_FORMAT, tarfile.PAX_FORMAT])
def test_a_stale_header_copy_after_the_end_is_padding_but_a_joined_shard_is_not(
    tmp_path: Path, fmt: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A writer reusing its record buffer leaves copies of the record before in the last
    # one's padding. Matched by member name, a stale GNU long-name or PAX block (no member
    # has its name) read as another archive; matched against any recent block, another
    # shard joined with `cat` with the same member names, sizes and mtimes passed for
    # stale copies, and its samples were lost (QA).
    stale = tmp_path / "stale.tar"
    stale.write_bytes(_with_stale_padding(_padded_shard(fmt)))
    assert len(TarShards([str(stale)])) == _PADDED_SAMPLES
    samples = _samples(0, 3)
    same_sizes = [(key, ext, bytes(255 - b for b in data), n) for key, ext, data, n in samples]
    joined = tmp_path / "joined.tar"
    for second in (shard_bytes(same_sizes), shard_bytes(samples)):  # another, and itself
        joined.write_bytes(shard_bytes(samples) + second)
        with pytest.raises(ValueError, match=r"joined\.tar.*tar files joined with cat"):
            TarShards([str(joined)])
    # A copy from further back than the largest record looked at is not stale.
    monkeypatch.setattr("gpu_loader.sources._tar.STALE_WINDOW", 512)
    with pytest.raises(ValueError, match=r"stale\.tar.*tar files joined with cat"):
        TarShards([str(stale)])


class _FailingRead(io.BytesIO):
    """A shard file whose third read raises what its name says."""

    def __init__(self, data: bytes, kind: str) -> None:
        super().__init__(data)
        self.kind, self.reads = kind, 0

    def read(self, size: int | None = -1) -> bytes:
        self.reads += 1
        if self.reads >= 3 and self.kind == "timeout":
            raise TimeoutError("read timed out")
        if self.reads >= 3 and self.kind == "runtime":
            raise RuntimeError("connection pool closed")
        if self.reads >= 3 and self.kind == "value":
            raise ValueError("bad byte range")
        return super().read(size)


def test_a_filesystem_failing_mid_scan_is_named_by_shard(shards: list[Path]) -> None:
    # A timeout while scanning one of several shards said "read timed out" and not which
    # shard; a filesystem's error that is no OSError (a credentials error) a traceback (QA).
    from fsspec.implementations.memory import MemoryFileSystem

    class FailingFS(MemoryFileSystem):
        protocol = ("failscan",)
        store: ClassVar[dict[str, object]] = {}
        pseudo_dirs: ClassVar[list[str]] = [""]

        @classmethod
        def _strip_protocol(cls, path: str) -> str:
            return "/" + path.removeprefix("failscan://").strip("/")

        def _open(self, path: str, mode: str = "rb", **kwargs: Any) -> Any:
            if "r" not in mode:  # pipe_file, writing the shard
                return super()._open(path, mode, **kwargs)
            return _FailingRead(self.cat_file(path), path.rsplit("/", 1)[-1].split(".")[0])

    fsspec.register_implementation("failscan", FailingFS, clobber=True)
    fs = fsspec.filesystem("failscan")
    for name in ("ok", "timeout", "runtime", "value"):
        fs.pipe_file(f"/s/{name}.tar", shards[0].read_bytes())
    assert len(TarShards("failscan://s/ok.tar")) == len(TarShards([str(shards[0])]))
    with pytest.raises(TimeoutError, match=r"tar shard 'failscan://s/timeout\.tar' .*timed out"):
        TarShards("failscan://s/{ok,timeout}.tar")
    with pytest.raises(OSError, match=r"'failscan://s/runtime\.tar' .*RuntimeError: connection"):
        TarShards("failscan://s/{ok,runtime}.tar")
    with pytest.raises(ValueError, match=r"'failscan://s/value\.tar' .*ValueError: bad byte"):
        TarShards("failscan://s/{ok,value}.tar")


def test_truncated_shard_after_indexing_names_the_key(shards: list[Path]) -> None:
    index = TarShards([str(shards[2])])
    shards[2].write_bytes(shards[2].read_bytes()[:600])
    with pytest.raises(OSError, match=r"train-002\.tar:s2/0005.* changed .*since it was indexed"):
        index.read(5)
    with pytest.raises(OSError, match=r"train-002\.tar:s2/0005.* changed"):
        index.readinto(5, bytearray(1 << 16))


def test_a_shard_rewritten_in_place_is_refused_not_read_at_old_offsets(
    shards: list[Path],
) -> None:
    # QA: the same member names and sizes, contents swapped: each sample was delivered
    # with another's bytes, and nothing said so.
    index = TarShards([str(shards[2])])
    first = index.read(0)
    data = shards[2].read_bytes()
    stat = shards[2].stat()
    shards[2].write_bytes(data)  # the same bytes, written again: a newer mtime
    os.utime(shards[2], ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))
    for read in (index.read, lambda i: index.readinto(i, bytearray(1 << 16))):
        with pytest.raises(OSError, match=r"train-002\.tar:s2/0000.* changed") as info:
            read(0)
        assert info.value.errno == errno.ESTALE
    assert TarShards([str(shards[2])]).read(0) == first  # a new index reads it again


def test_memory_shards_match_local(
    shards: list[Path], memfs: tuple[fsspec.AbstractFileSystem, str]
) -> None:
    fs, base = memfs
    urls = []
    for p in shards:
        fs.pipe_file(f"{base}/{p.name}", p.read_bytes())
        urls.append(f"memory://{base}/{p.name}")
    remote, local = TarShards(urls, index_threads=2), TarShards([str(p) for p in shards])
    assert len(remote) == len(local)
    assert remote.fingerprint() == local.fingerprint()  # shard base names, not locations
    assert remote.key(0) == f"{urls[0]}:s0/0000.jpg"
    for i in reversed(range(len(local))):
        assert remote.read(i) == local.read(i)
        buf = bytearray(local.nbytes(i) or 0)
        assert remote.readinto(i, buf) == len(buf)
        assert bytes(buf) == local.read(i)
    assert remote.labels.tolist() == local.labels.tolist()


def test_fingerprint_changes_with_labels(shards: list[Path], tmp_path: Path) -> None:
    a = TarShards([str(shards[0])])
    other = tmp_path / "copy" / shards[0].name
    other.parent.mkdir()
    samples = _samples(0, 4)
    other.write_bytes(shard_bytes(samples))
    assert TarShards([str(other)]).fingerprint() == a.fingerprint()
    samples[1] = (*samples[1][:3], 4 if samples[1][3] != 4 else 3)
    other.write_bytes(shard_bytes(samples))
    assert TarShards([str(other)]).fingerprint() != a.fingerprint()


def test_concurrent_reads_from_threads_match(shards: list[Path]) -> None:
    from concurrent.futures import ThreadPoolExecutor

    index = TarShards([str(p) for p in shards])
    expected = [data for _, data, _ in _sequential(shards)]
    order = np.random.default_rng(1).permutation(len(index)).tolist() * 4

    def read(i: int) -> tuple[int, bytes]:
        buf = bytearray(index.nbytes(i) or 0)
        index.readinto(i, buf)
        return i, bytes(buf)

    with ThreadPoolExecutor(max_workers=4) as pool:
        for i, data in pool.map(read, order):
            assert data == expected[i]


def test_a_runs_members_read_in_one_call_give_what_each_read_alone_gives(
    shards: list[Path], tmp_path: Path
) -> None:
    # `TarShards._read_local_run` (the CPU path's read runs: one release of the GIL for a
    # run) gives per member the bytes or the error `read` gives alone: type, words, notes;
    # none holds a traceback (with it, the run's bytes). Members of a good shard, of one
    # rewritten since indexing (mtime), of a missing one, of one turned into a folder or
    # a FIFO, one over the byte limit, and one cut short with no stamp to catch it.
    from gpu_loader.ops._backend import native_module

    if native_module() is None:
        pytest.skip("the native extension is not built")
    index = TarShards([str(p) for p in shards])
    n = len(index)
    shard_of = {i: index.key(i).rpartition(".tar:")[0] + ".tar" for i in range(n)}
    first = {s: min(i for i in range(n) if shard_of[i] == s) for s in set(shard_of.values())}
    good, stale, gone = (first[str(p)] for p in shards)
    data = shards[1].read_bytes()
    st = shards[1].stat()
    shards[1].write_bytes(data)
    os.utime(shards[1], ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    shards[2].unlink()
    everything = list(range(n))

    def check(indices: list[int]) -> list[object]:
        got = index._read_local_run(indices)
        assert got is not None
        results, seconds = got
        assert len(results) == len(seconds) == len(indices)
        expected = [_read_or_error(index, i) for i in indices]
        assert all(same_outcome(e, r) for e, r in zip(expected, results, strict=True)), (
            expected,
            results,
        )
        return list(results)

    results = check(everything)
    assert isinstance(results[good], bytes) and results[good] == index.read(good)
    assert isinstance(results[stale], OSError) and results[stale].errno == errno.ESTALE
    assert isinstance(results[gone], FileNotFoundError)
    limit = max_file_bytes()
    try:
        set_max_file_bytes(1)
        assert all(isinstance(r, ValueError) for r in check(everything))
    finally:
        set_max_file_bytes(limit)
    shards[2].mkdir()
    assert isinstance(check([gone])[0], OSError)
    shards[2].rmdir()
    os.mkfifo(shards[2])
    assert "FIFO" in str(check([gone])[0])
    # Cut short with no stamp (a shard indexed without one): the short read's EOFError.
    cut = TarShards([str(shards[0])])
    cut._stamps = [None] * len(cut._stamps)
    shards[0].write_bytes(shards[0].read_bytes()[:600])
    got = cut._read_local_run(range(len(cut)))
    assert got is not None
    assert any(isinstance(r, EOFError) for r in got[0])
    assert all(same_outcome(_read_or_error(cut, i), r) for i, r in enumerate(got[0]))


def _read_or_error(index: TarShards, i: int) -> object:
    try:
        return index.read(i)
    except Exception as exc:
        return exc
