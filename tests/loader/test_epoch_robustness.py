"""Epochs off the happy path, on both paths and batching modes.

- A sample that fails only after every other sample in the window has completed. The
  batcher learns of failures between completions; when the failing sample is the last
  event (a remote read that times out, say), no completion follows it: before the
  engine's idle ticks the batcher never heard of it, the window stayed full, and the
  loader hung.
- An epoch's iterator stopped from outside (a new iteration, close()) says why.
- An empty source is refused when the loader is made.
- Each epoch's progress bar counts that epoch, not the loader's running total.
- A training loop that leaves an epoch (close, or an exception) while the in-flight window
  is full gets its pipelines stopped at once, not after their 10 s join timeout.
- A batch frees its in-flight slots only after the training loop's thread has done its
  bookkeeping: the samples it makes room for would otherwise start decoding at once and
  compete with that thread for the GIL (measured: 0.2-6 ms of stall per batch).
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import gpu_loader as gl
from gpu_loader.cuda import standin_ports
from gpu_loader.ops import EvalTransform
from gpu_loader.sources import FileList

SLOW = 5  # the index that fails, late
DELAY_S = 0.4  # long enough for the other samples to fill the window


class FailsLate:
    """Delegates to `inner`; reading sample SLOW waits, then raises OSError."""

    def __init__(self, inner: FileList) -> None:
        self.inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def __len__(self) -> int:
        return len(self.inner)

    def _maybe_fail(self, i: int) -> None:
        if i == SLOW:
            time.sleep(DELAY_S)
            raise OSError(f"read of sample {i} timed out")

    def read(self, i: int) -> bytes:
        self._maybe_fail(i)
        return bytes(self.inner.read(i))

    def readinto(self, i: int, buf: Any) -> int:
        self._maybe_fail(i)
        return int(self.inner.readinto(i, buf))


def path_options(path: str) -> gl.LoaderOptions:
    """The CPU path, or the GPU path's orchestration on the stand-in ports."""
    if path == "gpu":
        return gl.LoaderOptions(
            monitor_gpu=False, decode_on="gpu", gpu_ports=standin_ports(), arena_bytes=16 << 20
        )
    return gl.LoaderOptions(monitor_gpu=False)


def run_to_end(loader: gl.ImageLoader, limit_s: float = 30.0) -> list[int]:
    """Every label the loader delivers; fails (instead of hanging the suite) after limit_s."""
    labels: list[int] = []
    error: list[BaseException] = []

    def consume() -> None:
        try:
            labels.extend(int(v) for _, y in loader for v in y)
        except BaseException as exc:
            error.append(exc)

    thread = threading.Thread(target=consume, daemon=True)
    thread.start()
    thread.join(limit_s)
    assert not thread.is_alive(), "the loader hung on a sample that failed last"
    if error:
        raise error[0]
    return labels


@pytest.mark.parametrize("path", ["cpu", "gpu"])
@pytest.mark.parametrize("batching", ["ordered", "straggler"])
def test_a_late_failure_neither_hangs_nor_loses_samples(
    unique_list: FileList, batching: str, path: str
) -> None:
    options = path_options(path)
    loader = gl.ImageLoader(
        FailsLate(unique_list),  # type: ignore[arg-type]
        batch_size=4,  # a window of 4 * (2 + 2 + 1) = 20 samples, far fewer than 48
        transform=EvalTransform(32),
        shuffle=False,
        batching=batching,  # type: ignore[arg-type]
        max_failures=None,
        options=options,
    )
    with loader:
        labels = run_to_end(loader)
        failed = loader.failed_samples()
    expected = Counter(int(v) for i, v in enumerate(unique_list.labels) if i != SLOW)
    assert Counter(labels) == expected
    assert [f.key for f in failed] == [unique_list.key(SLOW)]
    assert "timed out" in failed[0].error


@pytest.mark.parametrize("path", ["cpu", "gpu"])
@pytest.mark.parametrize(
    ("stop", "reason"),
    [
        (lambda loader: iter(loader), "a new iteration over the loader started"),
        (lambda loader: loader.close(), r"ImageLoader.close\(\) was called"),
    ],
    ids=["new-iteration", "close"],
)
def test_an_iterator_stopped_from_outside_says_why(
    unique_list: FileList, path: str, stop: Any, reason: str
) -> None:
    # One epoch runs at a time; the old iterator must not end quietly with part of the
    # epoch (the GPU path did), nor fail with an internal error (the CPU path did).
    options = path_options(path)
    loader = gl.ImageLoader(unique_list, batch_size=4, transform=EvalTransform(32), options=options)
    first = iter(loader)
    next(first)
    stop(loader)
    with pytest.raises(RuntimeError, match=f"iterator was stopped: {reason}"):
        next(first)
    assert sum(len(y) for _, y in loader) == len(unique_list)  # the loader goes on
    loader.close()


def test_an_empty_source_is_refused_with_a_clear_error() -> None:
    with pytest.raises(ValueError, match="has no samples to load"):
        gl.ImageLoader(FileList([]), batch_size=4, transform=EvalTransform(32))


def test_each_epochs_progress_bar_counts_that_epoch(
    unique_list: FileList, capsys: pytest.CaptureFixture[str]
) -> None:
    n = len(unique_list)
    loader = gl.ImageLoader(
        unique_list,
        batch_size=8,
        transform=EvalTransform(32),
        options=gl.LoaderOptions(monitor_gpu=False, progress=True),
    )
    with loader:
        for epoch in range(2):
            loader.set_epoch(epoch)
            assert sum(len(y) for _, y in loader) == n
    err = capsys.readouterr().err
    second = err[err.index("epoch 1") :]
    # Not the running total (and not "96" anywhere: an img/s figure may contain it).
    assert f"{n}/{n}" in second and f"{2 * n}/" not in second


def test_a_resumed_epochs_progress_counts_only_what_it_has_left(
    bad_list: tuple[FileList, set[str]], capsys: pytest.CaptureFixture[str]
) -> None:
    # The bar's total is what the resumed pass has left; the failures from before the
    # checkpoint were counted as done too (QA55: 21/128 after 16 samples, and the bar
    # reached its total early), and shown as this bar's.
    from tests.loader.conftest import checkpoint_after_a_failure

    items, _ = bad_list

    def make(**kw: Any) -> gl.ImageLoader:
        return gl.ImageLoader(
            items,
            batch_size=4,
            transform=EvalTransform(32),
            shuffle=False,
            max_failures=None,
            **kw,
        )

    state = checkpoint_after_a_failure(make())
    restored = sum(stop - start for start, stop in state["batcher"]["failed"])
    assert restored >= 1
    capsys.readouterr()
    loader = make(options=gl.LoaderOptions(monitor_gpu=False, progress=True))
    loader.load_state_dict(state)
    with loader:
        delivered = sum(len(y) for _, y in loader)
    now = len(loader.failed_samples()) - restored
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("epoch 0:")]
    left = delivered + now
    assert lines[-1].startswith(f"epoch 0: {left}/{left} img")
    assert (f"failed={now}" in lines[-1]) if now else ("failed=" not in lines[-1])


@pytest.mark.parametrize("path", ["cpu", "gpu"])
def test_a_batch_frees_its_slots_after_its_bookkeeping(
    unique_list: FileList, path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gpu_loader import _epoch

    events: list[tuple[str, int]] = []
    delivered, release = _epoch.Received.delivered, _epoch.EpochBase.release

    def logged_delivered(self: Any, positions: Any) -> None:
        events.append(("delivered", len(positions)))
        delivered(self, positions)

    def logged_release(self: Any, count: int) -> None:
        events.append(("release", count))
        release(self, count)

    monkeypatch.setattr(_epoch.Received, "delivered", logged_delivered)
    monkeypatch.setattr(_epoch.EpochBase, "release", logged_release)
    loader = gl.ImageLoader(
        unique_list, batch_size=8, transform=EvalTransform(32), options=path_options(path)
    )
    with loader:
        sizes = [len(y) for _, y in loader]
    assert sum(sizes) == len(unique_list)
    assert events == [event for n in sizes for event in (("delivered", n), ("release", n))]


@pytest.mark.parametrize("path", ["cpu", "gpu"])
@pytest.mark.parametrize("how", ["close", "raise"])
def test_leaving_with_the_window_full_stops_at_once(
    unique_list: FileList, path: str, how: str
) -> None:
    # The source thread waits for room in the in-flight window, which a training loop
    # that stops taking batches leaves full. The pipelines' close used to run before the
    # epoch told that thread to stop, and waited out its 10 s join timeout for it.
    before = set(threading.enumerate())
    loader = gl.ImageLoader(
        unique_list, batch_size=4, transform=EvalTransform(32), options=path_options(path)
    )
    gen = iter(loader)
    next(gen)
    deadline = time.monotonic() + 5
    epoch = loader._epoch()
    assert epoch is not None
    while epoch.in_flight < epoch.window and time.monotonic() < deadline:
        time.sleep(0.01)
    assert epoch.in_flight == epoch.window == 20  # full: the source thread now waits
    start = time.monotonic()
    if how == "close":
        gen.close()
    else:
        with pytest.raises(ZeroDivisionError):
            gen.throw(ZeroDivisionError())
    assert time.monotonic() - start < 2.0
    pipeline = [t for t in set(threading.enumerate()) - before if "pipeline" in t.name]
    assert not [t.name for t in pipeline if t.is_alive()]
    assert sum(len(y) for _, y in loader) == len(unique_list)  # and the loader goes on
    loader.close()


def test_exiting_with_an_unfinished_epoch_that_had_failures_is_quiet(
    photo_dir: Path, tmp_path: Path
) -> None:
    # The epoch's generator is finalised at interpreter exit; recording its failures then
    # once imported gpu_loader.loader, which the exiting interpreter refused (a traceback).
    bad = tmp_path / "bad.jpg"
    bad.write_bytes(b"not an image" * 50)
    files = [str(p) for p in sorted(photo_dir.rglob("*.jpg"))[:20]]
    script = f"""
import gpu_loader as gl
items = [({str(bad)!r}, 0)] + [(f, 1) for f in {files!r}]
loader = gl.ImageLoader(gl.sources.FileList(items), batch_size=4, shuffle=False,
                        transform=gl.ops.EvalTransform(size=32, resize=36), max_failures=None)
it = iter(loader)
next(it); next(it)
print("leaving mid-epoch")
"""
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stderr
    assert "leaving mid-epoch" in result.stdout
    assert "Traceback" not in result.stderr and "Exception ignored" not in result.stderr


def test_exiting_mid_epoch_joins_every_thread_before_python_finalizes(photo_dir: Path) -> None:
    # A daemon thread still running when finalization begins is ended where it next takes
    # the GIL; inside torch's C++ tensor deallocation that aborted the process ("terminate
    # called without an active exception", 2-3 exits in 120). The batcher thread and the
    # monitor's sampler outlived the pipelines' own exit hooks. This hook, registered
    # before gpu_loader is imported, runs after the loader's (exit hooks run last first).
    files = [str(p) for p in sorted(photo_dir.rglob("*.jpg"))[:24]]
    script = f"""
import atexit, threading
def alive():
    names = sorted(t.name for t in threading.enumerate() if t.name.startswith("gpu_loader"))
    print("alive at exit:", names)
atexit.register(alive)
import gpu_loader as gl
loader = gl.ImageLoader(gl.sources.FileList([(f, 0) for f in {files!r}]), batch_size=4,
                        shuffle=False, transform=gl.ops.EvalTransform(size=32, resize=36))
it = iter(loader)
next(it); next(it)
"""
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stderr
    assert "alive at exit: []" in result.stdout, result.stdout


def test_exiting_after_a_batch_timeout_waits_for_a_decode_inside_a_torch_op(
    photo_dir: Path,
) -> None:
    # The timeout's short join left a decode thread inside an augment's torch op; Python
    # finalized under it, and its return to the GIL aborted the process (QA: 20 of 20).
    files = [str(p) for p in sorted(photo_dir.rglob("*.jpg"))[:16]]
    script = f"""
import time, torch
import gpu_loader as gl
def slow(image, generator):
    x, began = image.float(), time.monotonic()
    while time.monotonic() - began < 1.5:
        x = torch.nn.functional.avg_pool2d(x[None], 3, 1, 1)[0]
    return x.clamp(0, 255).to(torch.uint8)
loader = gl.ImageLoader(gl.sources.FileList([(f, 0) for f in {files!r}]), batch_size=4,
                        transform=gl.ops.TrainTransform(size=32), augment=slow,
                        options=gl.LoaderOptions(decode_threads=2, batch_timeout_s=0.3))
try:
    next(iter(loader))
except TimeoutError:
    print("timed out")
"""
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stderr
    assert "timed out" in result.stdout and "terminate" not in result.stderr


def test_an_iterator_used_by_another_thread_at_exit_says_the_interpreter_is_exiting(
    photo_dir: Path,
) -> None:
    # A program's prefetching thread, waiting in next() as the main thread left, got the
    # batcher's own errors ("the batcher thread ended without a result", "positions never
    # completed"), or an epoch that seemed to end (QA: 13 of 20 exits).
    files = [str(p) for p in sorted(photo_dir.rglob("*.jpg"))[:64]]
    script = f"""
import atexit, queue, threading, time
got, done = [], threading.Event()
def report():
    done.wait(20)
    print("the prefetcher got:", got)
atexit.register(report)  # before gpu_loader's own exit hook, so it runs after it
import gpu_loader as gl
def slow(image, generator):
    time.sleep(0.05)
    return image
loader = gl.ImageLoader(gl.sources.FileList([(f, 0) for f in {files!r}]), batch_size=8,
                        transform=gl.ops.TrainTransform(size=32), augment=slow)
batches = queue.Queue()
def prefetch():
    try:
        for batch in loader:
            batches.put(batch)
        got.append("the end of the epoch")
    except Exception as exc:
        got.append(str(exc))
    finally:
        done.set()
threading.Thread(target=prefetch, daemon=True).start()
batches.get()
"""
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stderr
    assert (
        "the prefetcher got: [\"this epoch's iterator was stopped: the interpreter is exiting"
        in (result.stdout)
    ), result.stdout


def test_the_exit_hook_waits_only_for_the_loaders_own_epochs() -> None:
    # It waited 10 s for any thread named gpu_loader-*: a program's own running Pipeline,
    # which its finalizer stops a moment later, made every exit 10 s slower (QA).
    script = """
import torch  # its weakref.finalize: the pipelines' finalizers now run after the hook
from gpu_loader.pipeline import PipelineBuilder
import gpu_loader._epoch  # the epochs, and with them the exit hook
pipeline = PipelineBuilder().add_source(range(10_000)).pipe(abs).add_sink(2).build()
pipeline.start()
it = iter(pipeline)
print(next(it))
"""
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0 and result.stdout.strip() == "0", result.stderr
    assert "still running at exit" not in result.stderr, result.stderr


def test_the_exit_wait_is_one_deadline_for_every_stuck_epoch(photo_dir: Path) -> None:
    # Each epoch's close joined for its own timeout, one after another: two stuck epochs
    # held the exit 23 s (QA). With the timeout at 1 s, four must not take 4 s.
    files = [str(p) for p in sorted(photo_dir.rglob("*.jpg"))[:8]] * 8
    script = f"""
import threading, time
import gpu_loader as gl
import gpu_loader._epoch as epochs
epochs.JOIN_TIMEOUT_S = 1.0  # the exit hook's deadline and each epoch's join
stuck, inside = threading.Event(), set()
def augment(image, generator):  # each epoch's decode thread stays busy, then is stuck
    time.sleep(0.1)
    if stuck.is_set():
        inside.add(threading.current_thread().name)
        time.sleep(3600)  # an op that never returns
    return image
iterators = []
for _ in range(4):
    loader = gl.ImageLoader(gl.sources.FileList([(f, 0) for f in {files!r}]), batch_size=2,
                            transform=gl.ops.TrainTransform(size=32), augment=augment,
                            options=gl.LoaderOptions(decode_threads=1))
    iterators.append(iter(loader))
    next(iterators[-1])
stuck.set()
def take(iterator):  # frees window room: the idle decode thread takes a sample, and sticks
    try:
        next(iterator)
    except RuntimeError:  # stopped at exit
        pass
for iterator in iterators:
    threading.Thread(target=take, args=(iterator,), daemon=True).start()
deadline = time.monotonic() + 30
while len(inside) < 4 and time.monotonic() < deadline:
    time.sleep(0.05)
assert len(inside) == 4, inside  # every epoch's decode thread is in the op
print(time.monotonic(), flush=True)
"""
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False
    )
    ended = time.monotonic()
    assert result.returncode == 0, result.stderr
    assert ended - float(result.stdout.split()[-1]) < 3.5, result.stderr  # 4.5 s before
    assert "still running at exit" in result.stderr  # and the threads left are named


def test_a_forked_child_leaving_does_not_close_its_parents_epoch(
    photo_dir: Path, tmp_path: Path
) -> None:
    # The child's copy of the running epoch is the parent's: closing it at the child's exit
    # wrote the parent's JSON-lines log its last line (and stopped copies of its threads).
    files = [str(p) for p in sorted(photo_dir.rglob("*.jpg"))[:24]]
    log = tmp_path / "stats.jsonl"
    script = f"""
import os, sys
import gpu_loader as gl
options = gl.LoaderOptions(log_jsonl={str(log)!r}, log_interval_s=600)
loader = gl.ImageLoader(gl.sources.FileList([(f, 0) for f in {files!r}]), batch_size=4,
                        shuffle=False, transform=gl.ops.EvalTransform(size=32, resize=36),
                        options=options)
it = iter(loader)
next(it)
if os.fork() == 0:
    sys.exit(0)  # a normal exit: the exit hooks run
os.wait()
print("lines after the child left:", len(open({str(log)!r}).read().splitlines()))
"""
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stderr
    assert "lines after the child left: 1" in result.stdout, result.stdout + result.stderr
    assert len(log.read_text().splitlines()) == 2  # the parent's first and last


class _FakeEpoch:
    """What the exit hook calls on an epoch, recorded in ``calls`` (shared, in order)."""

    def __init__(self, name: str, calls: list[str], *, pid: int, sleeps: float = 0.0) -> None:
        self.name, self.calls, self.pid, self.join_s = name, calls, pid, 10.0
        self.pair = [  # a quick thread first, so joining only the first thread is seen
            threading.Thread(target=time.sleep, args=(seconds,), daemon=True)
            for seconds in (0.02, sleeps)
        ]
        for thread in self.pair:
            thread.start()

    def stop_feeding(self) -> None:
        self.calls.append(f"stop {self.name}")

    def close(self, reason: str) -> None:
        self.calls.append(f"close {self.name}")
        if self.name == "broken":
            raise RuntimeError("a close that fails")

    def threads(self) -> list[threading.Thread]:
        self.calls.append(f"threads {self.name}")
        return self.pair


def test_the_exit_hook_stops_all_then_closes_each_and_waits_for_every_thread(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # QA mutation: the hook still passed its tests when it joined only the first thread
    # left (several decode threads in torch ops abort the exit), stopped at the first
    # close that raised, skipped the stop-everything pass, or touched a forked parent's
    # epochs (a lock its threads may hold at the fork).
    import os

    from gpu_loader import _epoch

    calls: list[str] = []
    epochs = [
        _FakeEpoch("broken", calls, pid=os.getpid(), sleeps=0.5),
        _FakeEpoch("slow", calls, pid=os.getpid(), sleeps=0.6),
        _FakeEpoch("parent", calls, pid=os.getpid() + 1_000_000),
    ]
    # In this order (a WeakSet's is by address): the failing close first, so that a hook
    # stopping there would leave the next epoch unclosed.
    monkeypatch.setattr(_epoch, "_STARTED", epochs)
    with caplog.at_level("ERROR", logger="gpu_loader"):
        _epoch._close_at_exit()
    assert calls == [
        *["stop broken", "stop slow"],  # every epoch stops feeding before any closes
        *["close broken", "close slow"],  # a close that raised did not stop the others
        *["threads broken", "threads slow"],
    ]
    assert not any(t.is_alive() for e in epochs[:2] for t in e.pair)  # every thread joined
    assert "closing a running epoch at exit failed" in caplog.text
