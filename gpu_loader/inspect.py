"""`gpu-loader inspect`: time each stage alone at several thread counts, recommend settings.

Like SPDL's ``profile_pipeline``: a stage is timed in isolation (the read stage on the
files, the decode+transform stage on bytes already in memory), so the numbers say which
stage limits the loader and how many threads each one needs on this machine. The images
are spread over the index (not its first classes only), and each thread count is timed
twice, for at least `MIN_TIMED_S` each, keeping the faster run: one short run swung 2x. The stages
alone promise more than the loader gives (it adds its own per-sample work, and its stages
share the CPUs), so the recommended settings are then run through `ImageLoader` on the
same images and its rate is what the report quotes.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from gpu_loader._failed import counted, shown_key

if TYPE_CHECKING:
    from gpu_loader.sources import SampleIndex


@dataclass(frozen=True)
class StageProfile:
    """Throughput of one stage at one thread count."""

    stage: str
    """``read`` or ``decode``."""
    threads: int
    """Worker threads."""
    items_per_s: float
    """Items the stage finished per second; failed ones do not count (a file that fails
    at once would pass for speed)."""
    failures: int
    """Items that raised."""


FEW_GOOD = 16
"""Below this many good images, `inspect_folder`'s rates are said to be rough."""


def thread_counts(cpus: int) -> list[int]:
    """1, 2, 4, ... up to twice the CPU count (at least up to 4)."""
    counts, n = [], 1
    while n <= max(4, 2 * cpus):
        counts.append(n)
        n *= 2
    return counts


MIN_TIMED_S = 0.25
"""`time_stage` repeats its items until a count's run has taken at least this long: a
pass of 256 cached reads takes ~20 ms, in which thread start-up and the machine's noise
swung the rate 2x between runs (QA)."""

MAX_PASSES = 16
"""At most this many passes over the items per timed run."""


def time_stage(
    name: str,
    fn: Callable[[int], object],
    items: Sequence[int],
    threads: int,
    min_s: float = MIN_TIMED_S,
) -> StageProfile:
    """Run ``fn`` over ``items`` on ``threads`` engine workers, pass after pass until
    ``min_s`` have gone by (at most `MAX_PASSES`); items/s over the whole run. Failures
    are those of one pass (every pass meets the same files)."""
    from gpu_loader.pipeline import PipelineBuilder

    failures = 0

    def one_pass() -> int:
        nonlocal failures
        pipeline = (
            PipelineBuilder()
            .add_source(items)
            .pipe(fn, concurrency=threads, name=name, output_order="completion", max_failures=None)
            .add_sink(buffer_size=64)
            .build()
        )
        with pipeline:
            for _ in pipeline:
                pass
        failures = len(pipeline.failures())
        return len(items) - failures

    return StageProfile(name, threads, passes_rate(one_pass, min_s), failures)


def passes_rate(one_pass: Callable[[], int], min_s: float = MIN_TIMED_S) -> float:
    """Items per second over ``one_pass()`` (it returns the items it did) run again and
    again until ``min_s`` have gone by, at most `MAX_PASSES` times."""
    done, passes, start = 0, 0, time.perf_counter()
    while passes < MAX_PASSES and (passes == 0 or time.perf_counter() - start < min_s):
        done += one_pass()
        passes += 1
    elapsed = time.perf_counter() - start
    return done / elapsed if elapsed > 0 else 0.0


def profile_stage(
    name: str, fn: Callable[[int], object], items: Sequence[int], counts: Sequence[int]
) -> list[StageProfile]:
    """`time_stage` at each thread count, twice (counts rising, then falling, so neither
    end always runs on a cold machine), keeping each count's faster run."""
    runs = [time_stage(name, fn, items, n) for n in counts]
    runs += [time_stage(name, fn, items, n) for n in reversed(counts)]
    best: dict[int, StageProfile] = {}
    for p in runs:
        if p.threads not in best or p.items_per_s > best[p.threads].items_per_s:
            best[p.threads] = p
    return [best[n] for n in counts]


def recommend(profiles: Sequence[StageProfile], tolerance: float = 0.95) -> int:
    """Fewest threads reaching ``tolerance`` of the best throughput measured."""
    best = max(p.items_per_s for p in profiles)
    return min(p.threads for p in profiles if p.items_per_s >= tolerance * best)


def spread(length: int, count: int) -> list[int]:
    """``count`` positions spread evenly over ``0 .. length - 1`` (all when ``count >=
    length``): a folder's first images are its first classes only."""
    if count >= length:
        return list(range(length))
    return [i * length // count for i in range(count)]


class _Subset:
    """Some samples of an index, by position: the source of the loader's check run."""

    def __init__(self, index: SampleIndex, positions: Sequence[int]) -> None:
        self._index, self._positions = index, list(positions)
        self.classes = list(getattr(index, "classes", []))

    def __len__(self) -> int:
        return len(self._positions)

    def __repr__(self) -> str:
        return f"{len(self)} samples of {self._index!r}"

    def _at(self, i: int) -> int:
        from gpu_loader.sources._base import check_index

        return self._positions[check_index(i, len(self._positions))]

    def key(self, i: int) -> str:
        return self._index.key(self._at(i))

    def label(self, i: int) -> int:
        return self._index.label(self._at(i))

    @property
    def labels(self) -> np.ndarray[tuple[int], np.dtype[np.int64]]:
        return self._index.labels[self._positions]

    def read(self, i: int) -> bytes:
        return self._index.read(self._at(i))

    def readinto(self, i: int, buf: Any) -> int:
        return self._index.readinto(self._at(i), buf)

    def nbytes(self, i: int) -> int | None:
        return self._index.nbytes(self._at(i))

    def fingerprint(self) -> str:
        digest = hashlib.sha256(np.asarray(self._positions, np.int64).tobytes()).hexdigest()
        return f"{self._index.fingerprint()}[{digest[:16]}]"


def loader_rate(
    index: SampleIndex,
    positions: Sequence[int],
    size: int,
    io_threads: int,
    decode_threads: int,
    min_s: float = MIN_TIMED_S,
) -> float:
    """img/s of `ImageLoader` over the samples at ``positions`` with these threads, over
    passes after the first (which starts its threads and batch memory) until ``min_s``
    have gone by."""
    from gpu_loader.loader import ImageLoader, LoaderOptions
    from gpu_loader.ops import TrainTransform

    options = LoaderOptions(io_threads=io_threads, decode_threads=decode_threads)
    loader = ImageLoader(
        _Subset(index, positions),
        batch_size=min(32, len(positions)),
        transform=TrainTransform(size),
        max_failures=None,  # bad files are counted in the stage table, not fatal here
        options=options,
    )
    with loader:
        for _ in loader:
            pass
        return passes_rate(lambda: sum(int(batch.shape[0]) for batch, _ in loader), min_s)


def inspect_folder(index: SampleIndex, *, samples: int = 256, size: int = 224) -> str:
    """Profile ``index`` and return the report as text."""
    from gpu_loader.ops import TrainTransform, load_into
    from gpu_loader.sources import sample_rng

    items = spread(len(index), samples)
    count = len(items)
    cpus = os.cpu_count() or 1
    counts = thread_counts(cpus)
    transform = TrainTransform(size)
    blobs: dict[int, bytes] = {}
    bad: dict[int, str] = {}  # sample -> "stage: error" (every timing run meets the same ones)

    def read(i: int) -> int:
        try:
            blobs[i] = index.read(i)
        except Exception as exc:
            bad[i] = f"read: {type(exc).__name__}: {exc}"
            raise
        return i

    def decode(i: int) -> int:
        out = np.empty((3, size, size), np.float32)
        try:
            load_into(
                blobs[i], transform, sample_rng(0, 0, i), out, dtype="float32", key=index.key(i)
            )
        except Exception as exc:
            bad[i] = f"decode: {type(exc).__name__}: {exc}"
            raise
        return i

    read_profiles = profile_stage("read", read, items, counts)
    readable = [i for i in items if i in blobs]
    decode_profiles = profile_stage("decode", decode, readable, counts)
    if len(bad) == count:  # nothing to time: the rates would be of failures
        raise ValueError(
            f"none of the {counted(count, 'image')} sampled could be read and decoded, so there is "
            f"nothing to profile{format_bad_files(index, bad, count, limit=5)}"
        )
    blobs.clear()
    rate = loader_rate(index, items, size, recommend(read_profiles), recommend(decode_profiles))
    report = format_report(index, count, cpus, read_profiles, decode_profiles, rate)
    if (decoded := count - len(bad)) < FEW_GOOD:
        report += (
            (
                f"\nnote: only {decoded} of the {counted(count, 'image')} sampled decoded; "
                "rates from so few are rough (clean the data, or sample more with --samples)"
            )
            if bad
            else (
                f"\nnote: only {counted(count, 'image')} sampled; rates from so few are rough "
                "(sample more with --samples)"
            )
        )
    return report + format_bad_files(index, bad, count)


def format_bad_files(index: SampleIndex, bad: dict[int, str], sampled: int, limit: int = 20) -> str:
    """The files that failed of the ``sampled``, each with its key and error (the first
    ``limit``), and what the loader does with them: it skips bad files only up to its
    ``max_failures`` (1% by default), so a share above that stops an epoch."""
    if not bad:
        return ""
    share = len(bad) / max(1, sampled)
    verdict = (
        "the loader skips and reports them, up to its max_failures (default 1%)"
        if share <= 0.01
        else "more than the loader's default max_failures of 1%: an epoch would likely "
        "stop; clean the data (gpu-loader verify) or raise max_failures"
    )
    # Two decimals under 10%: 101 bad in 10,000 is "1.01%", not a "1.0%" said to be over 1%.
    shown = "<0.1%" if share < 0.001 else f"{share:.2%}" if share < 0.1 else f"{share:.1%}"
    lines = ["", f"bad files ({len(bad)} of {sampled} sampled, {shown}; {verdict}):"]
    for i in sorted(bad)[:limit]:
        lines.append(f"  {shown_key(index.key(i))}: {bad[i]}")
    if len(bad) > limit:
        lines.append(f"  ... and {len(bad) - limit} more")
    return "\n".join(lines)


def format_report(
    index: Any,
    count: int,
    cpus: int,
    read_profiles: Sequence[StageProfile],
    decode_profiles: Sequence[StageProfile],
    loader_img_s: float,
) -> str:
    io_threads = recommend(read_profiles)
    decode_threads = recommend(decode_profiles)
    read_best = max(p.items_per_s for p in read_profiles)
    decode_best = max(p.items_per_s for p in decode_profiles)
    bottleneck = "decode" if decode_best < read_best else "read"
    lines = [
        f"inspected {count} of {counted(len(index), 'image')}"
        + (" (spread over the index)" if count < len(index) else "")
        + f" on {cpus} CPU(s); each rate is the faster of two runs of {MIN_TIMED_S:g} s or "
        + f"{MAX_PASSES} passes over them, whichever ends first",
        cpu_backend_line(),
        "",
    ]
    lines.append(f"{'stage':8s} {'threads':>7s} {'img/s':>10s} {'failures':>8s}")
    for p in [*read_profiles, *decode_profiles]:
        lines.append(f"{p.stage:8s} {p.threads:7d} {p.items_per_s:10.0f} {p.failures:8d}")
    lines += [
        "",
        f"bottleneck: {bottleneck} (best read {read_best:.0f} img/s, "
        f"best decode {decode_best:.0f} img/s)",
        f"recommended: LoaderOptions(io_threads={io_threads}, decode_threads={decode_threads})"
        f" -> {loader_img_s:.0f} img/s measured through ImageLoader on "
        f"{'this' if count == 1 else 'these'} {counted(count, 'image')}"
        + (
            f" (the stages alone allow {alone:.0f}; the loader adds its own per-sample "
            "work, and its stages share the CPUs)"
            if loader_img_s < (alone := min(read_best, decode_best))
            else ""
        ),
    ]
    return "\n".join(lines)


def cpu_backend_line() -> str:
    """Which CPU decode + transform implementation runs, and how to get the fast one."""
    from gpu_loader.ops import cpu_backend
    from gpu_loader.ops._backend import ENV_VAR, build_hint, chosen, native_module

    if cpu_backend() == "native":
        version = getattr(native_module(), "LIBJPEG_TURBO_VERSION", 0)
        turbo = f"{version // 1000000}.{version // 1000 % 1000}.{version % 1000}"
        return f"CPU backend: native (C, libjpeg-turbo {turbo})"
    if chosen() == "pillow":
        return f"CPU backend: pillow (chosen by ${ENV_VAR})"
    return f"CPU backend: pillow (slower; {build_hint()})"


@dataclass(frozen=True)
class BadFile:
    """A sample `verify` could not read or decode."""

    index: int
    """Its position in the source."""
    key: str
    """Its key (path, URL or ``shard:member``)."""
    stage: str
    """``read`` or ``decode``."""
    error: str
    """``ExceptionType: message``."""


def verify(
    index: SampleIndex,
    *,
    threads: int | None = None,
    report: Callable[[int, int], None] | None = None,
) -> tuple[list[int], list[BadFile]]:
    """Read and fully decode every sample of ``index`` (the whole image at full size, with
    the CPU decoders: stricter than a training transform, which may decode a region at
    reduced size); returns the good indices and the bad files, both in source order.
    ``report(done, bad)`` is called about once a second. Raises ImportError when a read
    needed a library that is missing (an fsspec backend): that says nothing of the file."""
    from gpu_loader.ops import decode
    from gpu_loader.pipeline import IDLE, PipelineBuilder

    workers = threads or os.cpu_count() or 1
    blobs: dict[int, bytes] = {}

    def read(i: int) -> int:
        blobs[i] = index.read(i)
        return i

    def check(i: int) -> int:
        decode(blobs.pop(i), key=index.key(i))
        return i

    builder = PipelineBuilder().add_source(range(len(index)))
    for name, op in (("read", read), ("decode", check)):
        # Failures keyed by position: keys need not be unique (a list may repeat one).
        builder = builder.pipe(
            op,
            concurrency=workers,
            name=name,
            output_order="completion",
            max_failures=None,
            key_fn=str,
        )
    pipeline = builder.add_sink(buffer_size=256).build()
    good: list[int] = []
    last = time.perf_counter()
    with pipeline:
        # Idle ticks too: a long stretch of bad files yields nothing (QA58: no progress
        # line in 11 s of only bad files).
        for i in pipeline.iterate(idle_s=0.25):
            if i is not IDLE:
                good.append(i)
            if report is not None and time.perf_counter() - last >= 1.0:
                last = time.perf_counter()
                report(len(good), len(pipeline.failures()))
        records = pipeline.failures()
    # A missing fsspec backend ("Install s3fs ..."): no file was checked.
    for r in sorted(records, key=lambda r: int(r.key)):
        if isinstance(r.error, ImportError):
            raise ImportError(f"{index.key(int(r.key))}: {r.error}") from r.error
    bad = [BadFile(int(r.key), index.key(int(r.key)), r.stage, r.error_text) for r in records]
    bad.sort(key=lambda b: b.index)
    return sorted(good), bad
