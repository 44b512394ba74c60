"""open_index picks the index type; is_url tells URLs from local paths."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpu_loader.sources import FileList, ImageFolder, TarShards, is_url, open_index
from tests.sources._data import image_bytes, shard_bytes, write


def test_open_index_by_shape(tree: Path, tmp_path: Path) -> None:
    assert isinstance(open_index(tree), ImageFolder)
    write(tmp_path / "a.jpg", image_bytes(0))
    (tmp_path / "l.csv").write_text("path,label\na.jpg,0\n")
    assert isinstance(open_index(tmp_path / "l.csv"), FileList)
    for k in range(2):
        write(tmp_path / f"s-{k}.tar", shard_bytes([("x", "jpg", image_bytes(k), k)]))
    shards = open_index(f"{tmp_path}/s-{{0..1}}.tar")
    assert isinstance(shards, TarShards) and len(shards) == 2
    with pytest.raises(ValueError, match=r"not all \.tar"):
        open_index(f"{tmp_path}/{{a,b}}")
    with pytest.raises(ValueError, match="empty"):
        open_index("")
    # A compressed shard is a tar shard that must be decompressed, not a missing folder.
    import gzip

    for name in ("c.tar.gz", "c.tgz"):
        (tmp_path / name).write_bytes(gzip.compress((tmp_path / "s-0.tar").read_bytes()))
        with pytest.raises(ValueError, match="so decompress it first"):
            open_index(tmp_path / name)
    with pytest.raises(ValueError, match="so decompress it first"):
        open_index(f"{tmp_path}/c.{{tar.gz,tgz}}")


def test_a_folder_or_list_with_braces_in_its_name_is_not_a_pattern(tmp_path: Path) -> None:
    # QA: "x{a,b}" was expanded first, then refused as "not all .tar shards".
    write(tmp_path / "x{a,b}" / "cls" / "a.jpg", image_bytes(0))
    (tmp_path / "x{a,b}" / "l{1}.csv").write_text("path,label\ncls/a.jpg,0\n")
    assert len(open_index(tmp_path / "x{a,b}")) == 1
    assert isinstance(open_index(f"{tmp_path}/x{{a,b}}/l{{1}}.csv"), FileList)
    with pytest.raises(ValueError, match=r"not all \.tar"):
        open_index(f"{tmp_path}/{{a,b}}")  # nothing of that name: still a pattern


@pytest.mark.parametrize(
    ("location", "expected"),
    [
        ("s3://bucket/x.jpg", True),
        ("memory://x", True),
        ("file:///tmp/x", True),
        ("gcs+x://a", True),
        ("/tmp/x.jpg", False),
        ("rel/x.jpg", False),
        ("C://odd", False),  # a Windows drive, not a scheme
        ("weird:name.jpg", False),
    ],
)
def test_is_url(location: str, expected: bool) -> None:
    assert is_url(location) is expected
