"""Runs the native extension built with AddressSanitizer over exactness and damage cases.

Started by test_native_asan.py in a child process with libasan preloaded; it imports only
numpy, simplejpeg and the instrumented module (OpenCV and torch do not run under a
preloaded ASan runtime). argv: the instrumented .so, a pickle of JPEG byte strings.
Exits non-zero (ASan aborts, or an assertion fails) on any problem.
"""

from __future__ import annotations

import importlib.util
import math
import pickle
import sys

import numpy as np
import simplejpeg

SCALE, SHIFT = (0.02, 0.02, 0.02), (-1.0, -1.0, -1.0)
DTYPES = ((0, np.float32), (1, np.uint16), (2, np.uint16), (3, np.uint8))


def main(so_path: str, cases_path: str) -> None:
    spec = importlib.util.spec_from_file_location("_native", so_path)
    assert spec is not None and spec.loader is not None
    native = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(native)
    with open(cases_path, "rb") as f:
        cases: list[bytes] = pickle.load(f)
    rng = np.random.default_rng(0)
    exact = failed = 0
    for data in cases:
        h, w, colorspace, _ = simplejpeg.decode_jpeg_header(data)
        grey = colorspace == "Gray"
        for denom in (1, 2, 4, 8):
            sh, sw = math.ceil(h / denom), math.ceil(w / denom)
            full = simplejpeg.decode_jpeg(
                data, colorspace="GRAY" if grey else "RGB", min_height=sh, min_width=sw
            )
            for _ in range(4):
                top, left = rng.uniform(0, sh * 0.9), rng.uniform(0, sw * 0.9)
                box = (
                    top,
                    left,
                    max(1e-3, rng.uniform(0, sh - top)),
                    max(1e-3, rng.uniform(0, sw - left)),
                )
                size = (int(rng.integers(1, 300)), int(rng.integers(1, 300)))
                flip = bool(rng.integers(2))
                for code, dtype in DTYPES:
                    a = np.empty((3, *size), dtype)
                    b = np.empty_like(a)
                    kernel = int(rng.integers(2))  # bilinear or bicubic (twice the taps)
                    native.decode_resize_jpeg(
                        data, denom, sh, sw, box, a, *size, flip, code, SCALE, SHIFT, kernel
                    )
                    native.resize_into(
                        full, sh, sw, full.shape[2], box, b, *size, flip, code, SCALE, SHIFT, kernel
                    )
                    assert np.array_equal(a, b), (h, w, denom, box, size, code, kernel)
                    exact += 1
        calls, alone = [], []  # the damaged copies again, all in one decode_resize_jpegs
        for k in range(120):  # damaged copies: truncated, or bytes overwritten anywhere
            damaged = bytearray(data)
            if k % 3 == 0:
                damaged = damaged[: int(rng.integers(2, len(damaged)))]
            else:
                for _ in range(int(rng.integers(1, 6))):
                    damaged[int(rng.integers(0, len(damaged)))] = int(rng.integers(0, 256))
            out = np.empty((3, 40, 40), np.float32)
            args = (bytes(damaged), 1, h, w, (0.0, 0.0, h, w), out, 40, 40, False, 0, SCALE, SHIFT)
            try:
                native.decode_resize_jpeg(*args)
            except ValueError as exc:
                failed += 1
                alone.append(str(exc))
            else:
                alone.append(None)
            calls.append((*args[:5], np.empty_like(out), *args[6:]))
        assert native.decode_resize_jpegs(calls) == alone
    assert failed > 0
    words = native.philox_words(5, 7, 1000)  # the crop-parameter draws: pure arithmetic
    assert words == np.random.Philox(key=5 | 7 << 64).random_raw(1000).tolist()
    for i in range(2000):
        size = (int(rng.integers(1, 5000)), int(rng.integers(1, 5000)))
        top, left, bh, bw, _ = native.train_params(i, 3, *size, 0.08, 1.0, -0.29, 0.29, 0.5)
        assert top == -1 or (0 <= top <= size[0] - bh and 0 <= left <= size[1] - bw)
    reads = _check_reads(native, cases)
    headers = _check_headers(native, cases, rng)
    scans = _check_data_walk(native, cases, rng)
    limit = _check_scan_limit(native)
    print(
        f"asan ok: {exact} exact, {failed} damaged files refused, {reads} reads, "
        f"{headers} headers, {scans} data walks, scan limit {limit}"
    )


def _check_scan_limit(native: object) -> int:
    """The progress monitor's stop (a longjmp out of libjpeg mid-input) at the scan limit,
    the default one and one given; and the scan count's walk."""
    from _jpeg_scans import many_scans  # beside this script

    limit: int = native.MAX_JPEG_SCANS  # type: ignore[attr-defined]
    decode = native.decode_resize_jpeg  # type: ignore[attr-defined]
    count = native.jpeg_scans  # type: ignore[attr-defined]
    out = np.empty((3, 8, 8), np.float32)
    args = (1, 64, 64, (0.0, 0.0, 64.0, 64.0), out, 8, 8, False, 0, SCALE, SHIFT)
    for given, extra in ((limit, ()), (40, (0, 40))):
        decode(many_scans(given, 64), *args, *extra)
        for scans in (given + 1, 3 * given):
            data = many_scans(scans, 64)
            assert count(data) == scans
            for cut in (len(data) // 3, len(data) - 1):
                count(data[:cut])  # a walk that meets the end of the buffer
            try:
                decode(data, *args, *extra)
            except ValueError as exc:
                assert str(exc) == f"more than {given} scans", exc
            else:
                raise AssertionError(f"{scans} scans were decoded")
    return limit


def _check_data_walk(native: object, cases: list[bytes], rng: np.random.Generator) -> int:
    """jpeg_data_damage over cuts and damaged copies, each in an exactly sized buffer."""
    walk = native.jpeg_data_damage  # type: ignore[attr-defined]
    count = 0
    for data in cases:
        assert walk(np.frombuffer(data, np.uint8).copy()) is None
        for _ in range(200):
            damaged = np.frombuffer(data[: int(rng.integers(0, len(data) + 1))], np.uint8).copy()
            if len(damaged) > 2:
                at = rng.integers(0, len(damaged), int(rng.integers(1, 6)))
                damaged[at] = rng.choice([0xFF, 0xD9, 0xDA, 0xDD, 0xD3, 0x00], len(at))
            walk(damaged)
            count += 1
    return count


def _check_headers(native: object, cases: list[bytes], rng: np.random.Generator) -> int:
    """jpeg_header over every cut of each header and damaged copies. Each input lives in
    its own exactly sized numpy buffer (malloc), so ASan sees a read one byte past it; a
    bytes object would hide that behind its trailing NUL."""
    header = native.jpeg_header  # type: ignore[attr-defined]
    count = 0
    for data in cases:
        scan = data.index(b"\xff\xda") + 20
        for cut in range(0, min(scan, len(data)) + 1):
            header(np.frombuffer(data[:cut], np.uint8).copy())
            count += 1
        for _ in range(300):
            damaged = np.frombuffer(data[: int(rng.integers(3, len(data)))], np.uint8).copy()
            at = rng.integers(2, min(scan, len(damaged)), int(rng.integers(1, 6)))
            damaged[at] = rng.integers(0, 256, len(at))
            header(damaged)
            count += 1
        assert header(np.frombuffer(data, np.uint8).copy()) is not None
    return count


def _check_reads(native: object, cases: list[bytes]) -> int:
    """read_regular: whole files, at and over the limit, growth past fstat's size (a
    /proc file claims 0 bytes), special files and errors."""
    import os
    import tempfile

    read = native.read_regular  # type: ignore[attr-defined]
    count = 0
    with tempfile.TemporaryDirectory() as tmp:
        for i, data in enumerate(cases[:6]):
            path = os.path.join(tmp, f"{i}.jpg")
            with open(path, "wb") as f:
                f.write(data)
            assert read(path, -1) == data and read(path, len(data)) == data
            assert read(path, len(data) - 1) == (os.stat(path).st_mode, len(data), 0)
            count += 3
        with open("/proc/self/cmdline", "rb") as f:
            assert read("/proc/self/cmdline", -1) == f.read()
        _, size, grew = read("/proc/self/status", 100)  # claims 0 bytes, holds more
        assert grew == 1 and size > 100
        assert isinstance(read(tmp, -1), tuple) and isinstance(read("/dev/null", -1), tuple)
        try:
            read(os.path.join(tmp, "missing"), -1)
        except FileNotFoundError:
            count += 1
        else:
            raise AssertionError("a missing file was read")
        # read_regulars: the same files in one call, mixed with errors, refusals and a
        # path that cannot be converted; each result as read_regular's.
        paths = [os.path.join(tmp, f"{i}.jpg") for i in range(min(len(cases), 6))]
        mixed = [*paths, os.path.join(tmp, "missing"), tmp, "a\0b", "/proc/self/status"]
        results, seconds = native.read_regulars(mixed, 100)  # type: ignore[attr-defined]
        assert len(results) == len(seconds) == len(mixed)
        for path, got in zip(paths, results, strict=False):
            assert got == read(path, 100)
        assert results[len(paths)] == 2 and isinstance(results[len(paths) + 1], tuple)
        assert isinstance(results[-2], ValueError) and results[-1][2] == 1
        assert native.read_regulars([], -1) == ([], [])  # type: ignore[attr-defined]
        count += len(mixed)
        # read_ranges: members' ranges (whole, a tail, past the end, skipped) and errors.
        ranges = native.read_ranges  # type: ignore[attr-defined]
        sizes = [os.path.getsize(p) for p in paths]
        got, took = ranges(
            [*paths, *paths, os.path.join(tmp, "missing"), tmp, paths[0]],
            [*([0] * len(paths)), *(max(0, n - 3) for n in sizes), 0, 0, 0],
            [*sizes, *(n + 5 for n in sizes), 1, 1, -1],
        )
        assert len(got) == len(took) == 2 * len(paths) + 3
        for path, size, whole, tail in zip(paths, sizes, got, got[len(paths) :], strict=False):
            with open(path, "rb") as f:
                data = f.read()
            assert whole[0] == data and whole[1] == 4 and whole[3] == size
            assert tail[0] == data[max(0, size - 3) :]  # short at EOF
        assert got[-3][:2] == (2, 0) and got[-2][:2] == (None, 2) and got[-1][:2] == (None, -1)
        count += len(got)
    return count


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
