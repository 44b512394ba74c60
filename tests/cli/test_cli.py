"""The `gpu-loader` command end to end, in subprocesses, on a tiny generated dataset."""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gpu_loader.cuda import cuda_available
from gpu_loader.datasets import make_image_folder

SCRIPT = Path(sys.executable).with_name("gpu-loader")


def run(
    *args: str, cache: Path, timeout: float = 240, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    command = [str(SCRIPT)] if SCRIPT.exists() else [sys.executable, "-m", "gpu_loader.cli"]
    env = {**os.environ, "GPU_LOADER_CACHE": str(cache), **(env or {})}
    return subprocess.run(
        [*command, *args], capture_output=True, text=True, timeout=timeout, env=env, check=False
    )


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_image_folder(
        tmp_path_factory.mktemp("tiny"),
        num_images=40,
        num_classes=3,
        seed=1,
        min_side=64,
        max_side=160,
    )


def test_console_script_is_installed() -> None:
    assert SCRIPT.exists(), "pip install -e . should create the gpu-loader entry point"


def test_help_lists_every_command(tmp_path: Path) -> None:
    result = run("--help", cache=tmp_path)
    assert result.returncode == 0
    for command in ("demo", "make-dataset", "bench", "inspect", "verify"):
        assert command in result.stdout
        sub = run(command, "--help", cache=tmp_path)
        assert sub.returncode == 0 and "usage: gpu-loader " + command in sub.stdout


def test_demo_reports_numbers_and_writes_json(tiny: Path, tmp_path: Path) -> None:
    out = tmp_path / "stats.json"
    log = tmp_path / "log.jsonl"
    result = run(
        "demo",
        "--data",
        str(tiny),
        "--epochs",
        "2",
        "--batch-size",
        "8",
        "--size",
        "64",
        "--step-ms",
        "5",
        "--no-progress",
        "--json",
        str(out),
        "--log-jsonl",
        str(log),
        cache=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    text = result.stdout
    for needle in ("throughput", "data stall", "GPU", "bottleneck", "decode", "failures"):
        assert needle in text
    # "no GPU (why)" without NVML, the utilisation where a GPU is (as on a CUDA machine)
    assert re.search(r"^GPU +: (no GPU|util \d)", text, re.MULTILINE), text
    document = json.loads(out.read_text())
    stats = document["stats"]
    # The path the loader took is said: the GPU one only on a CUDA machine.
    decoded_on = "gpu" if cuda_available() else "cpu"
    assert document["settings"]["decode_on"] == decoded_on
    assert f"decode on {decoded_on}," in text
    assert stats["samples"] == 80 and stats["batches"] == 10
    assert 0.0 <= stats["stall_fraction"] <= 1.0
    assert stats["samples_per_s"] > 0
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    assert lines and lines[-1]["samples"] == 80
    assert {line["epoch"] for line in lines} == {0, 1}  # each line says which epoch


def test_make_dataset_then_inspect(tmp_path: Path) -> None:
    out = tmp_path / "made"
    made = run(
        "make-dataset",
        str(out),
        "--num",
        "12",
        "--classes",
        "2",
        "--min-side",
        "64",
        "--max-side",
        "128",
        cache=tmp_path,
    )
    assert made.returncode == 0, made.stderr
    files = [p for p in out.rglob("*") if p.suffix in {".jpg", ".png"}]
    assert len(files) == 12
    inspected = run(
        "inspect", "--data", str(out), "--samples", "12", "--size", "32", cache=tmp_path
    )
    assert inspected.returncode == 0, inspected.stderr
    assert "recommended: LoaderOptions(io_threads=" in inspected.stdout
    # The rate quoted is the loader's own on those images, not the stages' alone.
    assert "img/s measured through ImageLoader on these 12 images" in inspected.stdout
    # All 12 decoded: the note says the sample is small, not that images failed (QA).
    assert "note: only 12 images sampled; rates from so few are rough" in inspected.stdout
    # --data takes what ImageLoader takes: here a CSV list, as a file:// URL (a Path
    # argument had turned it into file:/...).
    listing = out / "list.csv"
    (out / "bad.jpg").write_bytes(b"not a jpeg")
    listing.write_text(
        "path,label\nbad.jpg,0\ngone.jpg,1\n"
        + "".join(f"{p.relative_to(out)},{i % 2}\n" for i, p in enumerate(files))
    )
    listed = run(
        "inspect", "--data", f"file://{listing}", "--samples", "8", "--size", "32", cache=tmp_path
    )
    assert listed.returncode == 0, listed.stderr
    assert "inspected 8 of 14 images" in listed.stdout
    # One image is one image (QA63: "on these 1 images", "only 1 images sampled").
    alone = run("inspect", "--data", f"file://{listing}", "--samples", "1", "--size", "32",
                cache=tmp_path)  # fmt: skip
    assert "on this 1 image" in alone.stdout or "of the 1 image sampled" in alone.stderr
    assert "1 images" not in alone.stdout + alone.stderr
    # Bad files are named with their key and error, not only counted (QA).
    # 2 in 8 is past the loader's default limit of 1%: a run would stop, not skip them.
    assert "bad files (2 of 8 sampled, 25.0%; more than the loader's default" in listed.stdout
    assert "bad.jpg: decode: DecodeError:" in listed.stdout
    assert "gone.jpg: read: FileNotFoundError:" in listed.stdout
    assert "CPU backend: native (C, libjpeg-turbo " in inspected.stdout
    assert "decode" in inspected.stdout and "read" in inspected.stdout


def test_bench_quick_writes_json_and_png(tmp_path: Path) -> None:
    out = tmp_path / "bench"
    result = run(
        "bench", "--only", "cpu_loaders", "--quick", "--out", str(out), cache=tmp_path, timeout=400
    )
    assert result.returncode == 0, result.stdout + result.stderr
    data = json.loads((out / "cpu_loaders.json").read_text())
    systems = {row["system"] for row in data["rows"] if row.get("img_per_s")}
    assert {"gpu_loader", data["baseline"]} <= systems  # dataloader_pillow_w<CPUs>
    assert data["machine"]["cpu_count"] >= 1
    png = (out / "cpu_loaders.png").read_bytes()
    assert png.startswith(b"\x89PNG")
    assert "| train | gpu_loader |" in result.stdout


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (("demo", "--data", "/no/such/folder"), "no such folder"),
        (("demo", "--epochs", "zero"), "invalid int value"),
        (("demo", "--epochs", "0", "--data", "."), "--epochs must be > 0"),
        (("inspect",), "required"),
        (("bench", "--only", "nonsense"), "unknown benchmark"),
        (("frobnicate",), "invalid choice"),
        (("verify", "--data", "oci://bucket/train"), "Install ocifs"),  # fsspec lacks its backend
        (("demo", "--data", "oci://bucket/train"), "Install ocifs"),
        (("make-dataset", "/proc/gpu-loader-test", "--num", "3"), "cannot write the dataset"),
        (("make-dataset", "/dev/null/x", "--num", "3"), "cannot write the dataset"),
        (("inspect", "--data", ".", "--size", "0"), "--size must be > 0"),
        # QA58: minutes of 10.8 GB outputs, then exit 1 without naming --size.
        (("inspect", "--data", ".", "--size", "30000"), "--size must be at most 8192"),
        (("demo", "--data", ".", "--size", "30000"), "--size must be at most 8192"),
        (("demo", "--max-failures", "2.5"), "a count >= 0 or a rate in (0, 1]"),
        (("demo", "--data", ".", "--json", "."), "is a folder; give a file path"),
        (("demo", "--threads", "0", "--data", "."), "--threads must be > 0"),
        (("demo", "--device", "tpu", "--data", "."), "--device must be auto, cpu, cuda"),
        (("bench", "--only", ""), "--only names no benchmark"),  # it ran every benchmark
        (("bench", "--only", "cpu_loaders", "--out", "/dev/null"), "exists and is not a folder"),
        (("demo", "--bogus"), "gpu-loader demo: error: unrecognized arguments: --bogus"),
        # QA63: a name with a newline split the error in two; a list named *.txt was
        # "not a folder"; a missing folder for a list did not name the flag.
        (("verify", "--data", "/no/such\nfolder"), "--data '/no/such\\nfolder': no such"),
        (("verify", "--data", "/etc/passwd"), "is a file, and --data takes a folder, a .csv"),
        (
            ("verify", "--data", ".", "--good-list", "/no/such/x.csv"),
            "--good-list /no/such/x.csv: folder /no/such does not exist",
        ),
        (("--bogus", "demo"), "gpu-loader: error: unrecognized arguments: --bogus"),
        # QA72: a file name too long for the file system was a traceback.
        (
            ("verify", "--data", ".", "--good-list", f"/tmp/{'a' * 300}.csv"),
            "cannot be a file here (File name too long)",
        ),
        (("demo", "--data", ".", "--json", f"/tmp/{'b' * 300}.json"), "File name too long"),
    ],
)
def test_errors_are_one_line_without_traceback(
    args: tuple[str, ...], needle: str, tmp_path: Path
) -> None:
    result = run(*args, cache=tmp_path)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert needle in lines[0]


@pytest.mark.skipif(cuda_available(), reason="needs a machine without CUDA")
def test_demo_refuses_a_missing_gpu_before_making_its_dataset(tmp_path: Path) -> None:
    # It generated the default dataset first (seconds to minutes), then refused (QA).
    result = run("demo", "--device", "cuda", "--num-images", "20", cache=tmp_path)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "--device cuda was asked for but no CUDA device is usable" in result.stderr
    assert not any(tmp_path.rglob("*.jpg"))


def test_verify_of_a_list_whose_backend_is_missing_writes_no_empty_clean_list(
    tmp_path: Path,
) -> None:
    # Every row failed with "Install ocifs ...", and --good-list got a header alone.
    listing, good = tmp_path / "urls.csv", tmp_path / "good.csv"
    listing.write_text("path,label\noci://bucket/a.jpg,0\noci://bucket/b.jpg,1\n")
    result = run("verify", "--data", str(listing), "--good-list", str(good), cache=tmp_path)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "oci://bucket/a.jpg" in result.stderr and "Install ocifs" in result.stderr
    assert not good.exists()


def test_a_misspelt_cpu_backend_is_one_error_not_every_file_bad(tiny: Path, tmp_path: Path) -> None:
    # verify reported all 40 files bad and wrote a clean list holding its header alone;
    # inspect said none of the images sampled could be decoded (QA).
    good = tmp_path / "good.csv"
    bogus = {"GPU_LOADER_CPU_BACKEND": "bogus"}
    for command in (
        ("verify", "--data", str(tiny), "--good-list", str(good)),
        ("inspect", "--data", str(tiny), "--samples", "4"),
        ("demo", "--data", str(tiny), "--epochs", "1"),
    ):
        result = run(*command, cache=tmp_path, env=bogus)
        assert result.returncode == 2 and "Traceback" not in result.stderr, command
        assert result.stderr.count("\n") == 1, result.stderr
        assert "$GPU_LOADER_CPU_BACKEND must be one of" in result.stderr, command
    assert not good.exists()


def test_a_backend_that_cannot_load_is_one_error_before_any_work(
    tiny: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # `native` chosen without the extension built: an ImportError, which verify then met at
    # every file ("all bad") and demo only after generating its 2,000 images (QA mutation).
    import gpu_loader.ops._backend as backend
    from gpu_loader.cli import main

    def unbuilt() -> None:
        raise ImportError("GPU_LOADER_CPU_BACKEND=native, but the native extension is not built")

    monkeypatch.setattr(backend, "native_module", unbuilt)
    monkeypatch.setenv("GPU_LOADER_CACHE", str(tmp_path))
    for args in (["verify", "--data", str(tiny)], ["demo", "--device", "cpu"]):
        assert main(args) == 2, args
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "native extension is not built" in err, err
    assert list(tmp_path.iterdir()) == []  # demo made no dataset first


def test_verify_of_one_file_says_file(tiny: Path, tmp_path: Path) -> None:
    one = tmp_path / "one.csv"
    one.write_text(f"path,label\n{sorted(tiny.rglob('*.jpg'))[0]},0\n")
    result = run("verify", "--data", str(one), cache=tmp_path)
    assert result.returncode == 0 and "checked 1 file in" in result.stdout, result.stdout


def test_demo_names_the_cache_folder_it_cannot_write(tmp_path: Path) -> None:
    # A file where the cache folder should be: a NotADirectoryError traceback (QA).
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("x")
    result = run("demo", "--num-images", "10", cache=blocker)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert f"cannot write the demo dataset into the cache folder {blocker}" in result.stderr
    assert "set GPU_LOADER_CACHE to a writable folder, or pass --data" in result.stderr


def test_an_empty_list_and_a_folder_as_an_output_file_are_clear_errors(tmp_path: Path) -> None:
    # verify passed an empty list (0 good, 0 bad, exit 0) where demo refused it (QA).
    header_only = tmp_path / "empty.csv"
    header_only.write_text("path,label\n")
    for command in ("verify", "inspect", "demo"):
        result = run(command, "--data", str(header_only), cache=tmp_path)
        assert result.returncode == 2 and "Traceback" not in result.stderr, command
        assert f"--data {header_only}: FileList(0 samples" in result.stderr, command
        assert "has no samples" in result.stderr
    folder = tmp_path / "out"
    folder.mkdir()
    result = run("verify", "--data", str(header_only), "--good-list", str(folder), cache=tmp_path)
    assert result.returncode == 2
    assert f"--good-list {folder}: is a folder; give a file path" in result.stderr
    missing = tmp_path / "nowhere" / "good.csv"
    result = run("verify", "--data", str(header_only), "--json", str(missing), cache=tmp_path)
    assert result.returncode == 2
    assert f"--json {missing}: folder {missing.parent} does not exist" in result.stderr


def test_verify_leaves_names_a_csv_cannot_hold_out_of_its_list_and_says_so(
    tiny: Path, tmp_path: Path
) -> None:
    # A good file whose name is not UTF-8 raised UnicodeEncodeError mid-write: a traceback,
    # and a --good-list cut at that row that a later run took as complete (QA).
    import shutil

    data = shutil.copytree(tiny, tmp_path / "data")
    first = sorted(data.rglob("*.jpg"))[0]
    odd = os.fsencode(first.parent) + b"/caf\xe9.jpg"
    with open(odd, "wb") as f:
        f.write(first.read_bytes())
    good = tmp_path / "good.csv"
    result = run("verify", "--data", str(data), "--good-list", str(good), cache=tmp_path)
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    assert "41 good, 0 bad" in result.stdout
    assert "1 good file is not in" in result.stdout and "caf\\udce9.jpg'" in result.stdout
    from gpu_loader.sources import FileList

    listed = FileList.from_csv(good)
    assert len(listed) == 40 and not any("caf" in listed.key(i) for i in range(40))


def test_a_key_with_a_newline_keeps_its_listing_line_whole(tiny: Path, tmp_path: Path) -> None:
    # A bad file named "x\ny.jpg" split its line of the listing in two (QA): quoted now.
    import shutil

    data = shutil.copytree(tiny, tmp_path / "data")
    folder = sorted(data.rglob("*.jpg"))[0].parent
    (folder / "x\ny.jpg").write_bytes(b"not an image")
    result = run("verify", "--data", str(data), cache=tmp_path)
    assert result.returncode == 1 and "1 bad" in result.stdout, result.stderr
    listed = [line for line in result.stdout.splitlines() if "y.jpg" in line]
    assert len(listed) == 1 and listed[0].startswith("  '"), result.stdout
    assert listed[0].split(": ")[0].endswith("x\\ny.jpg'")
    demo = run("demo", "--data", str(data), "--max-failures", "none", cache=tmp_path)
    assert demo.returncode == 0, demo.stderr
    listed = [line for line in demo.stdout.splitlines() if "y.jpg" in line]
    assert listed and all(line.split("  [")[0].endswith("x\\ny.jpg'") for line in listed)


def test_an_output_file_is_written_whole_or_left_as_it_was(tmp_path: Path) -> None:
    from gpu_loader.cli import _write_whole

    target = tmp_path / "good.csv"
    target.write_text("path,label\nkept.jpg,0\n")
    with pytest.raises(UnicodeEncodeError):  # fails midway through writing
        _write_whole(target, "path,label\n" + "a.jpg,0\n" * 1000 + "caf\udce9.jpg,0\n")
    assert target.read_text() == "path,label\nkept.jpg,0\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["good.csv"]  # no temporary left
    _write_whole(target, "path,label\nnew.jpg,1\n")
    assert target.read_text() == "path,label\nnew.jpg,1\n"
    assert target.stat().st_mode & 0o777 == 0o666 & ~_umask()
    fresh = tmp_path / "fresh.json"
    _write_whole(fresh, "[]")
    assert fresh.read_text() == "[]" and fresh.stat().st_mode & 0o777 == 0o666 & ~_umask()


def test_an_output_path_that_is_no_regular_file_is_written_into_not_replaced(
    tmp_path: Path,
) -> None:
    # Renamed over, --json /dev/stdout turned /dev/stdout into a file for every process on
    # the machine (QA, as root); a FIFO's reader waited for good; a link became a file.
    import stat
    import threading

    from gpu_loader.cli import CliError, _write_whole

    private = tmp_path / "private.csv"
    private.write_text("old")
    private.chmod(0o600)
    inode = private.stat().st_ino
    link = tmp_path / "link.csv"  # as /dev/stdout -> /proc/self/fd/1 -> a redirected file
    link.symlink_to(private)
    _write_whole(link, "new")
    assert link.is_symlink() and private.read_text() == "new"
    assert private.stat().st_mode & 0o777 == 0o600  # its mode kept, not widened
    assert private.stat().st_ino == inode  # written into: a shell's redirect keeps it
    other = tmp_path / "other.csv"  # a second name (hard link) sees the new list too
    os.link(private, other)
    _write_whole(private, "newer")
    assert other.read_text() == "newer"
    loop = tmp_path / "loop.csv"
    loop.symlink_to(loop)
    with pytest.raises(CliError, match=r"cannot write .*loop\.csv"):
        _write_whole(loop, "x")
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    got: list[str] = []
    # A daemon: should a regression rename over the FIFO, this reader must not hang pytest.
    reader = threading.Thread(target=lambda: got.append(fifo.read_text()), daemon=True)
    reader.start()
    _write_whole(fifo, "[1, 2]")
    reader.join(timeout=10)
    assert got == ["[1, 2]"] and fifo.is_fifo()
    null = tmp_path / "null"  # a stand-in for /dev/null (never the real one: a regression
    try:  # would replace it for the whole machine)
        os.mknod(null, stat.S_IFCHR | 0o666, os.makedev(1, 3))
    except PermissionError:
        pass  # no CAP_MKNOD: the FIFO stands for devices
    else:
        _write_whole(null, "gone")
        assert null.is_char_device()
    with pytest.raises(CliError, match=r"cannot write .*missing/x\.csv"):
        _write_whole(tmp_path / "missing" / "x.csv", "x")


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def test_a_filesystem_error_that_is_no_oserror_is_one_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # s3fs / gcsfs may pass a credentials error through as a plain Exception: a traceback.
    import fsspec
    from fsspec.implementations.memory import MemoryFileSystem

    from gpu_loader.cli import main

    class NoCredentialsError(Exception):
        pass

    class LockedFS(MemoryFileSystem):
        protocol = ("lockedfs",)

        @classmethod
        def _strip_protocol(cls, path: str) -> str:
            return "/" + path.removeprefix("lockedfs://").strip("/")

        def info(self, path: str, **kwargs: Any) -> Any:
            raise NoCredentialsError("Unable to locate credentials")

        ls = cat_file = info

    fsspec.register_implementation("lockedfs", LockedFS, clobber=True)
    code = main(["verify", "--data", "lockedfs://bucket/list.csv"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    assert (
        "CSV file 'lockedfs://bucket/list.csv' could not be read: NoCredentialsError: Unable "
        "to locate credentials"
    ) in err


def test_no_command_is_a_usage_error(tmp_path: Path) -> None:
    result = run(cache=tmp_path)
    assert result.returncode == 2 and "usage: gpu-loader" in result.stderr


def test_inspect_on_images_that_all_fail_says_so(tmp_path: Path) -> None:
    # Failed decodes were timed as throughput: thousands of img/s, and a recommendation.
    junk = tmp_path / "junk" / "a"
    junk.mkdir(parents=True)
    for i in range(4):
        (junk / f"{i}.jpg").write_bytes(b"junk")
    result = run("inspect", "--data", str(junk.parent), "--samples", "4", cache=tmp_path)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert "none of the 4 images sampled could be read and decoded" in result.stderr
    assert "0.jpg: decode: DecodeError" in result.stderr
    assert "recommended" not in result.stdout


def test_inspect_on_mostly_bad_images_says_its_rates_are_rough(tiny: Path, tmp_path: Path) -> None:
    junk = tmp_path / "junk" / "a"
    junk.mkdir(parents=True)
    for i in range(4):
        (junk / f"{i}.jpg").write_bytes(b"junk")
    (junk / "good.jpg").write_bytes(next(iter(sorted(tiny.rglob("*.jpg")))).read_bytes())
    result = run("inspect", "--data", str(junk.parent), "--samples", "5", cache=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "note: only 1 of the 5 images sampled decoded" in result.stdout


def test_empty_folder_is_a_clear_error(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    result = run("demo", "--data", str(empty), cache=tmp_path)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert str(empty) in result.stderr
    # A class folder without images: the fix offered is one the command can take, not
    # ImageFolder's own arguments (allow_empty=True), which it has no flag for (QA).
    (empty / "cats").mkdir()
    (empty / "dogs").mkdir()
    (empty / "dogs" / "a.jpg").write_bytes(b"x")
    result = run("verify", "--data", str(empty), cache=tmp_path)
    assert result.returncode == 2 and "no image files for the classes cats" in result.stderr
    assert "remove class folders that hold no images, or list the files in a CSV" in result.stderr
    assert "allow_empty" not in result.stderr


def test_demo_with_bad_files_stops_clearly_or_lists_them(tiny: Path, tmp_path: Path) -> None:
    import shutil

    data = tmp_path / "bad"
    shutil.copytree(tiny, data)
    bad = data / "class_00" / "zz_corrupt.jpg"
    bad.write_bytes(b"not a jpeg at all" * 10)
    args = ("demo", "--data", str(data), "--epochs", "1", "--batch-size", "8", "--size", "32")
    quick = ("--step-ms", "0", "--no-progress", "--device", "cpu")
    stopped = run(*args, *quick, cache=tmp_path)  # 1 of 41 is over the default 1% rate
    assert stopped.returncode == 1 and "Traceback" not in stopped.stderr  # 2: usage errors
    assert str(bad) in stopped.stderr and "--max-failures none" in stopped.stderr
    report = tmp_path / "report.json"
    listed = run(*args, *quick, "--max-failures", "none", "--json", str(report), cache=tmp_path)
    assert listed.returncode == 0, listed.stderr
    assert "failed samples (1):" in listed.stdout
    assert f"{bad}  [decode, epoch 0]" in listed.stdout
    (failed,) = json.loads(report.read_text())["failed"]  # with its error, not the key alone
    assert failed["key"] == str(bad) and failed["stage"] == "decode" and failed["epoch"] == 0
    assert "DecodeError" in failed["error"]


def test_make_dataset_again_replaces_the_earlier_images(tmp_path: Path) -> None:
    out = tmp_path / "made"
    sides = ("--min-side", "32", "--max-side", "48")
    for num, classes in (("12", "4"), ("5", "10")):
        made = run(
            "make-dataset", str(out), "--num", num, "--classes", classes, *sides, cache=tmp_path
        )
        assert made.returncode == 0, made.stderr
    files = sorted(p.relative_to(out).as_posix() for p in out.rglob("img_*"))
    assert len(files) == 5 and len({f.split("/")[0] for f in files}) == 5
    assert "5 images in 5 classes (--classes 10 > --num: one image each)" in made.stdout
    one = run("make-dataset", str(tmp_path / "one"), "--num", "1", *sides, cache=tmp_path)
    assert "1 image in 1 class (--classes 10 > --num" in one.stdout, one.stdout  # QA64
    assert "replacing an earlier generated dataset (12 images" in made.stderr
    again = run("make-dataset", str(out), "--num", "5", "--classes", "10", *sides, cache=tmp_path)
    assert again.returncode == 0 and "reused (it holds this dataset already)" in again.stderr
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("img_*")) == files
    (out / "notes.txt").write_text("mine")  # not the generator's: never deleted
    refused = run("make-dataset", str(out), "--num", "3", *sides, cache=tmp_path)
    assert refused.returncode == 2 and "notes.txt" in refused.stderr
    assert (out / "notes.txt").read_text() == "mine"


def test_make_dataset_errors_name_its_flags(tmp_path: Path) -> None:
    out = str(tmp_path / "never")
    for args, needle in (
        (("--heavy-fraction", "1.5"), "--heavy-fraction must be in [0, 1], got 1.5"),
        (("--min-side", "900", "--max-side", "100"), "--min-side and --max-side must satisfy"),
        (("--max-side", "100000"), "max_side <= 8192, got 200 and 100000"),
        (("--seed", "-1"), "--seed must be >= 0, got -1"),
    ):
        result = run("make-dataset", out, *args, cache=tmp_path)
        assert result.returncode == 2 and needle in result.stderr, result.stderr
    assert not (tmp_path / "never").exists()


def test_verify_lists_bad_files_and_writes_a_clean_list(tiny: Path, tmp_path: Path) -> None:
    import shutil

    data = shutil.copytree(tiny, tmp_path / "data")
    first = next(p for p in sorted(data.rglob("*.jpg")))
    whole = first.read_bytes()
    damaged = bytearray(whole)
    damaged[len(whole) // 2 : len(whole) // 2 + 64] = bytes(64)  # entropy data libjpeg flags
    (first.parent / "cut.jpg").write_bytes(whole[: len(whole) // 3])
    (first.parent / "damaged.jpg").write_bytes(bytes(damaged))
    (first.parent / "text.jpg").write_bytes(b"not an image")
    good_list, bad_json = tmp_path / "good.csv", tmp_path / "bad.json"
    result = run(
        "verify",
        "--data",
        str(data),
        "--good-list",
        str(good_list),
        "--json",
        str(bad_json),
        cache=tmp_path,
    )
    assert result.returncode == 1, result.stderr  # bad files: a script can tell
    assert "checked 43 files" in result.stdout and "40 good, 3 bad" in result.stdout
    for name in ("cut.jpg", "damaged.jpg", "text.jpg"):
        assert re.search(rf"{name}: decode: DecodeError: .*{name}", result.stdout), name
    bad = json.loads(bad_json.read_text())
    assert sorted(Path(b["key"]).name for b in bad) == ["cut.jpg", "damaged.jpg", "text.jpg"]
    assert bad_json.read_text().endswith("]\n")  # a text file's last line ends (QA68)
    # The clean list is one the loader takes, and it verifies clean.
    from gpu_loader.sources import FileList

    clean = FileList.from_csv(good_list)
    assert len(clean) == 40
    again = run("verify", "--data", str(good_list), cache=tmp_path)
    assert again.returncode == 0 and "40 good, 0 bad" in again.stdout
    # Off a terminal (a CI or cluster log) the progress is lines, not a bar's redraws:
    # it was one line of "\r"-joined counts.
    assert "\r" not in result.stderr + again.stderr


def test_bench_only_names_every_benchmark_in_its_help() -> None:
    from benchmarks.suite import BENCHMARKS
    from gpu_loader.cli import build_parser

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    only = next(a for a in sub.choices["bench"]._actions if "--only" in a.option_strings)
    assert only.help is not None and all(name in only.help for name in BENCHMARKS)


def _many_bad(tmp_path: Path, tiny: Path, bad: int) -> Path:
    """A copy of ``tiny``'s first class with ``bad`` undecodable files beside it."""
    import shutil

    root = tmp_path / "data"
    shutil.copytree(tiny / "class_00", root / "c")
    for i in range(bad):
        (root / "c" / f"bad_{i:04d}.jpg").write_bytes(b"not an image")
    return root


def test_verify_into_a_pipe_that_closes_writes_its_files_and_no_traceback(
    tiny: Path, tmp_path: Path
) -> None:
    # QA58: `verify ... | head -3` died with a BrokenPipeError traceback while it printed
    # the bad files, before it wrote --good-list and --json.
    root = _many_bad(tmp_path, tiny, 300)
    command = [str(SCRIPT)] if SCRIPT.exists() else [sys.executable, "-m", "gpu_loader.cli"]
    lists = ["--good-list", str(tmp_path / "g.csv"), "--json", str(tmp_path / "b.json")]
    tail = "| head -2; echo rc=${PIPESTATUS[0]} >&2"
    shell = " ".join([*command, "verify", "--data", str(root), *lists, tail])
    result = subprocess.run(
        ["bash", "-c", shell], capture_output=True, text=True, timeout=240, check=False
    )
    assert "Traceback" not in result.stderr and "rc=141" in result.stderr, result.stderr
    assert len(json.loads((tmp_path / "b.json").read_text())) == 300
    assert (tmp_path / "g.csv").read_text().startswith("path,label\n")


def test_verify_json_to_dev_stdout_keeps_the_report_and_the_json_whole(
    tiny: Path, tmp_path: Path
) -> None:
    # QA58: opened again, the redirected stdout's file was truncated (the report lost)
    # and written at its own position, over the report's next lines: invalid JSON.
    root = _many_bad(tmp_path, tiny, 5)
    command = [str(SCRIPT)] if SCRIPT.exists() else [sys.executable, "-m", "gpu_loader.cli"]
    out = tmp_path / "out.txt"
    shell = " ".join([*command, "verify", "--data", str(root), "--json", "/dev/stdout"])
    subprocess.run(["bash", "-c", f"{shell} > {out}"], timeout=240, check=False)
    lines = out.read_text().splitlines()
    end = lines.index("]")  # the files are written before the report is printed
    assert len(json.loads("\n".join(lines[: end + 1]))) == 5
    assert lines[end + 1].startswith("checked ") and len(lines) == end + 1 + 1 + 5 + 1
    assert lines[-1] == "bad files written to /dev/stdout"


def test_verify_refuses_one_file_for_both_lists(tiny: Path, tmp_path: Path) -> None:
    # QA58: the CSV was written, then replaced by the JSON, without a word.
    same = str(tmp_path / "same.out")
    result = run("verify", "--data", str(tiny), "--good-list", same, "--json", same, cache=tmp_path)
    assert result.returncode == 2 and "name one file" in result.stderr
    assert not Path(same).exists()
    # QA63: a hard link to the other list was taken as another file; the CSV held "[]".
    first, second = tmp_path / "a.csv", tmp_path / "b.json"
    first.write_text("kept\n")
    os.link(first, second)
    result = run(
        "verify", "--data", str(tiny), "--good-list", str(first), "--json", str(second),
        cache=tmp_path,
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert f"--good-list {first} and --json {second} name one file" in result.stderr
    assert first.read_text() == "kept\n"


def test_verify_s_good_list_names_a_file_behind_a_symlink_and_dot_dot(
    tiny: Path, tmp_path: Path
) -> None:
    # QA63: "lnk/../target.jpg" was written tidied as text, naming a file that is not there.
    (tmp_path / "list").mkdir()
    (tmp_path / "elsewhere" / "deep").mkdir(parents=True)
    image = next(tiny.rglob("*.jpg"))
    (tmp_path / "elsewhere" / "target.jpg").write_bytes(image.read_bytes())
    (tmp_path / "list" / "lnk").symlink_to("../elsewhere/deep")
    (tmp_path / "list" / "l.csv").write_text("path,label\nlnk/../target.jpg,4\n")
    good = tmp_path / "good.csv"
    first = run("verify", "--data", str(tmp_path / "list" / "l.csv"), "--good-list", str(good),
                cache=tmp_path)  # fmt: skip
    assert first.returncode == 0, first.stderr
    again = run("verify", "--data", str(good), cache=tmp_path)
    assert again.returncode == 0 and "1 good, 0 bad" in again.stdout, again.stdout + again.stderr


def test_verify_names_the_files_the_folder_passes_over(tiny: Path, tmp_path: Path) -> None:
    # QA58: a .gif in a class folder was left out without a word, so "checked 40 files"
    # read as if every file had been.
    import shutil

    data = shutil.copytree(tiny, tmp_path / "data")
    (data / "class_00" / "anim.gif").write_bytes(b"GIF89a")
    (data / "class_01" / "notes.txt").write_bytes(b"notes")
    (data / "class_01" / "more.txt").write_bytes(b"notes")
    result = run("verify", "--data", str(data), cache=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "checked 40 files" in result.stdout
    assert re.search(
        r"passed over 3 files in the class folders.*: \.gif 1, \.txt 2 \(it reads \.jpg",
        result.stdout,
    )
    clean = run("verify", "--data", str(tiny), cache=tmp_path)
    assert "passed over" not in clean.stdout


def test_verify_prints_its_report_when_a_list_cannot_be_written(
    tiny: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # QA58: a --good-list that failed to write ended the run with that error alone: the
    # report of a long verify was lost. Its own status, 3, tells a script that the
    # output, not the data, was at fault; the error line after the report names the list.
    from gpu_loader import cli

    good_list, bad_json = tmp_path / "good.csv", tmp_path / "bad.json"
    real = cli._write_whole

    def disk_full(path: Path, text: str) -> None:
        if path == good_list:
            raise cli.CliError(f"cannot write {path}: No space left on device", cli.EXIT_FAILED)
        real(path, text)

    monkeypatch.setattr(cli, "_write_whole", disk_full)
    args = ["verify", "--data", str(tiny), "--good-list", str(good_list), "--json", str(bad_json)]
    assert cli.main(args) == cli.EXIT_UNWRITTEN == 3
    out, err = capsys.readouterr()
    assert "checked 40 files" in out and "40 good, 0 bad" in out
    assert "good samples written" not in out and f"bad files written to {bad_json}" in out
    assert json.loads(bad_json.read_text()) == []
    assert f"cannot write {good_list}: No space left on device" in err


def test_verify_interrupted_on_a_terminal_ends_the_progress_line_first(
    tiny: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # QA58: "interrupted" was written onto the redrawn progress line's own line.
    from gpu_loader import cli, inspect
    from gpu_loader.monitor import _progress

    def interrupted(index: Any, *, threads: Any, report: Any) -> Any:
        report(3, 1)
        raise KeyboardInterrupt

    monkeypatch.setattr(inspect, "verify", interrupted)
    monkeypatch.setattr(_progress, "is_terminal", lambda stream: True)
    assert cli.main(["verify", "--data", str(tiny)]) == 130
    err = capsys.readouterr().err
    assert err.endswith("\r4 of 40 checked, 1 bad\ngpu-loader verify: interrupted\n"), repr(err)


def test_with_stderr_closed_nothing_meant_for_it_lands_on_stdout(tmp_path: Path) -> None:
    # QA58: with stderr closed (`2>&-`) Python's sys.stderr is None, and print(file=None)
    # writes to stdout: errors and progress lines went into the report.
    command = [str(SCRIPT)] if SCRIPT.exists() else [sys.executable, "-m", "gpu_loader.cli"]
    shell = " ".join([*command, "verify", "--data", str(tmp_path / "nowhere"), "2>&-"])
    result = subprocess.run(
        ["bash", "-c", f"{shell}; echo rc=$?"], capture_output=True, text=True, timeout=60
    )
    assert result.stdout == "rc=2\n", result.stdout


def test_demo_decode_on_picks_the_path_and_gpu_needs_a_cuda_device(
    tiny: Path, tmp_path: Path
) -> None:
    # The README's measurements favour the CPU path on the one GPU machine measured, so
    # the demo lets a user pick it; the GPU path without a CUDA device is refused first.
    if not cuda_available():
        refused = run("demo", "--data", str(tiny), "--decode-on", "gpu", cache=tmp_path)
        assert refused.returncode == 2
        assert "--decode-on gpu needs a CUDA device; --device auto is cpu" in refused.stderr
    out = tmp_path / "stats.json"
    cpu = run(
        "demo", "--data", str(tiny), "--decode-on", "cpu", "--epochs", "1", "--size", "32",
        "--step-ms", "0", "--no-progress", "--json", str(out), cache=tmp_path,
    )  # fmt: skip
    assert cpu.returncode == 0, cpu.stderr
    assert "decode on cpu," in cpu.stdout
    assert json.loads(out.read_text())["settings"]["decode_on"] == "cpu"
    # Which CPU path ran is said (QA68: a failed native build ran Pillow, unnamed).
    assert "\nCPU backend: native (C, libjpeg-turbo " in cpu.stdout
    assert json.loads(out.read_text())["settings"]["cpu_backend"] == "native"
    pillow = run(
        "demo", "--data", str(tiny), "--decode-on", "cpu", "--epochs", "1", "--size", "32",
        "--step-ms", "0", "--no-progress", cache=tmp_path,
        env={"GPU_LOADER_CPU_BACKEND": "pillow"},
    )  # fmt: skip
    assert pillow.returncode == 0, pillow.stderr
    assert "\nCPU backend: pillow (chosen by $GPU_LOADER_CPU_BACKEND)\n" in pillow.stdout
