"""One pass over the data: what the CPU and GPU paths share, and the CPU path itself.

An epoch owns its pipeline(s), a batcher (ordered or straggler-aware), the bounded window
of samples in flight, and the record of what the training loop has received (the resume
state). `CpuEpoch` decodes and transforms on the CPU; `gpu_loader._gpu_epoch.GpuEpoch`
decodes on the GPU.
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import dataclasses
import functools
import itertools
import logging
import os
import queue
import re
import sys
import threading
import time
import weakref
from collections.abc import Callable, Generator, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

import numpy as np

from gpu_loader import _run_sizer
from gpu_loader._augment import load_augmented, raised_by_augment
from gpu_loader._batch import Batch as Yielded
from gpu_loader._failed import FailedSample
from gpu_loader._straggler_rows import Placed, Run, StragglerRows, as_numpy
from gpu_loader._threads import (
    InterruptSafeEvent,
    interrupt_main_after,
    join_started,
    loader_thread,
    rescue_lost_interrupts,
)
from gpu_loader.batching import (
    AdaptiveThreshold,
    Batch,
    BatcherStats,
    OrderedBatcher,
    StragglerBatcher,
    order_by_cost,
)
from gpu_loader.batching._ledger import DELIVERED, Ledger, brief
from gpu_loader.ops import load_into
from gpu_loader.ops._decode import import_codecs
from gpu_loader.ops._load import NativeJpeg, decode_prepared, load_prepared, prepare_load
from gpu_loader.ops._load import load_into as _load_into  # `load_into` may be patched (tests)
from gpu_loader.pipeline import (
    IDLE,
    FailureRecord,
    LaneThreshold,
    Pipeline,
    PipelineBuilder,
    PipelineFailure,
    SlowLane,
)
from gpu_loader.pipeline._errors import (
    MAX_CAUSES,
    FailurePolicy,
    add_note,
    limit_failure,
    rate_passed,
    release_locals,
)
from gpu_loader.pipeline._runtime import JOIN_TIMEOUT_S
from gpu_loader.sources import sample_stream
from gpu_loader.sources._base import FileIndex
from gpu_loader.sources._tar import TarShards

if TYPE_CHECKING:
    import torch

    from gpu_loader._run_sizer import RunSizer
    from gpu_loader.loader import ImageLoader

logger = logging.getLogger("gpu_loader")

IDLE_TICK_S = 0.05
"""How often the batcher thread checks for failures while no sample completes."""
# A second close() waits this long at most for the one in progress (which joins each
# pipeline for at most JOIN_TIMEOUT_S).
CLOSE_WAIT_S = 3 * JOIN_TIMEOUT_S
# After a `batch_timeout_s` the epoch's threads are joined this long: the one the batch
# waited for is likely stuck, and is left to end with the process (a daemon thread).
TIMED_OUT_JOIN_S = 1.0

# The epochs whose threads may be running: closed at interpreter exit (`_close_at_exit`).
_STARTED: weakref.WeakSet[EpochBase] = weakref.WeakSet()


def _close_at_exit() -> None:
    """Close every epoch still running when the interpreter exits (a script that leaves
    mid-epoch, its iterator still held), then wait for the loader's threads, before
    Python finalizes.

    A daemon thread that takes the GIL back after finalization has begun is ended where
    it stands: inside torch's C++ (a tensor freed, an op in an ``augment``) that aborted
    the process with "terminate called without an active exception" (QA: 2-3 exits in
    120, the batcher thread, which the pipelines' own exit hooks did not join; and every
    exit after a `batch_timeout_s` whose decode was still in a torch op). The epochs'
    threads get `JOIN_TIMEOUT_S` from the hook's start, the closes' own joins included
    (an earlier close, after a timeout, joined for a second only); one still running
    after that (an op that never returns) is named, and may still abort the exit.

    The reason makes an iterator still used by another thread (a prefetching thread of
    the program's) raise that the interpreter is exiting, not the batcher's own errors.
    Registered at import, so that a program's own exit hooks, registered later, run
    first and still find the epoch running (a last checkpoint).
    """
    deadline = time.monotonic() + JOIN_TIMEOUT_S  # the closes' own joins count against it
    epochs = [e for e in list(_STARTED) if e.pid == os.getpid()]
    for epoch in epochs:
        epoch.stop_feeding()  # every epoch's threads wind down together, not one by one
    for epoch in epochs:
        # One deadline for them all: each close joined for its own 10 s, one epoch after
        # another (QA: two stuck epochs held the exit 23 s).
        epoch.join_s = min(epoch.join_s, max(0.0, deadline - time.monotonic()))
        try:
            epoch.close("the interpreter is exiting")
        except Exception:  # said, and the other epochs still closed
            logger.exception("gpu_loader: closing a running epoch at exit failed")
    current = threading.current_thread()
    left = [t for e in epochs for t in e.threads() if t is not current]
    for thread in left:
        join_started(thread, max(0.0, deadline - time.monotonic()))
    if stuck := [t.name for t in left if t.is_alive()]:
        logger.warning(
            "gpu_loader: %d thread(s) still running at exit: %s; one inside a C++ call (a "
            "torch op, a decoder) may abort the process as Python finalizes",
            len(stuck),
            ", ".join(stuck),
        )


# `weakref.finalize` registers its own exit hook at its first use, which the pipelines'
# finalizers run from: registered before this one, it runs after it, so the epochs are
# closed (with their reason) before their pipelines are (QA: imported before torch, a
# prefetching thread got the batcher's errors in 4 exits of 24).
weakref.finalize(_close_at_exit, lambda: None).detach()
atexit.register(_close_at_exit)


@dataclass
class Task:
    """One sample on its way through the pipeline."""

    position: int
    index: int
    key: str
    data: bytes | None = None
    out: Any = None
    stream: int = -1
    """Which random stream draws its crop and flip (`sample_stream`'s ``index``): the
    sample's own index (the default), or with weighted draws, where a sample may come
    several times an epoch, its place in the epoch's global draw (past every index, so the
    two never meet), so each repeat gets its own augmentation; the same on any rank and
    after a resume."""

    def __post_init__(self) -> None:
        if self.stream < 0:
            self.stream = self.index


class Deferred(NamedTuple):
    """A run's JPEG left to its one C call (`CpuEpoch.decode_run_at_once`)."""

    task: Task
    job: NativeJpeg
    done: Callable[[bool], None] | None
    """Told once whether it decoded (straggler mode's rows; calls after the first do
    nothing), also when the call never runs; None in ordered mode."""


def task_key(task: Task) -> str:
    return task.key


def run_key(tasks: Sequence[Any]) -> str:
    """The key of a call that holds several samples (a run of tasks, a GPU batch)."""
    keys = [t.key for t in tasks]
    if not keys:
        return "(no samples)"
    return keys[0] if len(keys) == 1 else f"{keys[0]} (+{len(keys) - 1} more)"


def _run_weight(run: Sequence[Any]) -> int:
    """A run's weight in its stage's slow lane: its samples (a run whose samples all
    failed to read reaches the decode stage empty, and takes no time there)."""
    return max(1, len(run))


def drop_deferred(later: list[Deferred]) -> None:
    """Empty ``later``, telling each not yet told that it was not decoded (dropped by a
    stopping epoch or a fatal error)."""
    for deferred in later:
        if deferred.done is not None:
            deferred.done(False)
    later.clear()


def _output(task: Task) -> Any:
    """What the batcher holds for a completed task: its output's place."""
    return task.out


def _each_task(stream: Iterable[Any]) -> Iterator[Any]:
    """A pipeline's completed runs as single tasks (idle ticks pass through)."""
    for done in stream:
        if done is IDLE:
            yield done
        else:
            yield from done


class Received:
    """What the training loop has been handed this epoch, and what failed: the resume state.

    The batcher's own record is not enough: batches it has formed may not have reached the
    training loop yet (the epoch's tail, batches queued for the GPU), and a resumed epoch
    must produce those again.
    """

    def __init__(
        self, batcher: OrderedBatcher[Any] | StragglerBatcher[Any], resume: Mapping[str, Any] | None
    ) -> None:
        self.mode = batcher.mode
        self.ledger = Ledger(batcher.plan)
        self.batches = self.ledger.load_state(resume, self.mode) if resume is not None else 0
        self.stage_failures = stage_failures_of(resume, self.ledger.failed)
        """Failed samples per stage (they count against ``max_failures``, each stage's own
        and the epoch's, also after a resume)."""
        self.restored_failures = dict(self.stage_failures)
        """`stage_failures` as the resume state had them (empty in a fresh epoch)."""
        self.padding = padding_of(resume, len(self.ledger.status))
        """Where `EpochBase.padding_batch`'s round of repeats stands, as handed over: the
        next place in the delivered samples, and the positions that failed to repeat. In
        the state: a resume inside the padding batches restarted the round (QA: one
        sample trained three times, another once)."""
        self._padding_before = self.padding
        self.last: Sequence[int] | None = None  # the positions `batches` last counted
        self.lock = threading.Lock()

    def delivered(self, positions: Sequence[int]) -> None:
        with self.lock:
            for position in positions:
                self.ledger.complete(position, ok=True)
                self.ledger.deliver(position)
            self.batches += 1
            self.last = positions

    def undelivered(self, positions: Sequence[int]) -> None:
        """Take back `delivered` (whatever of it was done before an interrupt cut it
        short): the batch never reached the training loop."""
        with self.lock:
            for position in positions:
                self.ledger.undeliver(position)
            if self.last is positions:
                self.batches -= 1
                self.last = None

    def padded(self, padding: Padding) -> None:
        """A batch of repeats (`EpochBase.padding_batch`) is handed over: it counts as a
        batch, its samples were delivered before; ``padding``: where the round now stands."""
        with self.lock:
            self.batches += 1
            self.last = None
            self._padding_before, self.padding = self.padding, padding

    def unpadded(self, padding: Padding) -> None:
        """Take back `padded` (``padding``, each batch's own object), if it ran: a Ctrl-C
        can land as it is entered (QA70: the count then lost a batch `padded` never
        added, and the state was refused)."""
        with self.lock:
            if self.padding is padding:
                self.batches -= 1
                self.padding = self._padding_before

    def delivered_positions(self) -> np.ndarray:
        with self.lock:
            status = np.frombuffer(bytes(self.ledger.status), np.uint8)
        return np.flatnonzero(status == DELIVERED)

    def failed(self, position: int, stage: str) -> None:
        with self.lock:
            self.ledger.complete(position, ok=False)
            self.stage_failures[stage] = self.stage_failures.get(stage, 0) + 1

    def failure_counts(self) -> dict[str, int]:
        """Failed samples per stage this epoch, those before a resume included."""
        with self.lock:
            return {stage: n for stage, n in self.stage_failures.items() if n}

    def failed_positions(self) -> list[int]:
        with self.lock:
            return self.ledger.failed_positions()

    def state(self) -> dict[str, Any]:
        with self.lock:
            state = self.ledger.to_state(self.mode, self.batches)
            state[FAILED_STAGES] = dict(self.stage_failures)
            if self.padding != Padding():
                state[PADDING] = {"next": self.padding.next, "failed": sorted(self.padding.failed)}
            return state

    def failures_before(self, stages: Sequence[str]) -> dict[str, tuple[int, int]]:
        """For each of this path's ``stages`` (in pipeline order), the (calls, failures)
        the resumed state counts against ``max_failures``: a stage ran on every sample
        delivered and on every one that failed there or later. A stage the path lacks
        (a state saved on the other decode path, or an older one) counts with ``stages``'
        first if it reads ("read", "fetch"), else with the last."""
        with self.lock:
            counts = dict(self.stage_failures)
            delivered = self.ledger.delivered
        failures = dict.fromkeys(stages, 0)
        for stage, n in counts.items():
            if stage not in failures:
                stage = stages[0] if stage in _READ_STAGES else stages[-1]
            failures[stage] += n
        before, later = {}, 0
        for stage in reversed(stages):
            later += failures[stage]
            before[stage] = (delivered + later, failures[stage])
        return before


FAILED_STAGES = "failed_stages"
"""The resume state's count of failed samples per stage (beside the ledger's positions)."""
PADDING = "padding"
"""The resume state's `Padding`, once a distributed epoch has padded (absent before)."""


@dataclass(frozen=True)
class Padding:
    """`EpochBase.padding_batch`'s round: where in the epoch's delivered samples (ascending)
    the next repeat comes from, and the positions whose repeat failed (passed over)."""

    next: int = 0
    failed: frozenset[int] = frozenset()


def padding_of(state: Mapping[str, Any] | None, positions: int) -> Padding:
    """A resume state's `Padding` (a fresh one when it has none)."""
    if state is None or state.get(PADDING) is None:
        return Padding()
    entry = state[PADDING]
    ok = isinstance(entry, Mapping) and _is_count(entry.get("next"))
    failed = entry.get("failed") if ok else None
    ok = ok and isinstance(failed, list)
    ok = ok and all(_is_count(p) and p < positions for p in failed)  # type: ignore[union-attr]
    if not ok:
        raise ValueError(
            f"state_dict field {PADDING!r} must be {{'next': int >= 0, 'failed': [positions "
            f"below {positions}]}}, got {brief(entry)}"
        )
    return Padding(entry["next"], frozenset(failed))  # type: ignore[arg-type]


def _is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


_READ_STAGES = ("read", "fetch")
_STAGE_ORDER = {
    stage: i for i, stage in enumerate((*_READ_STAGES, "decode", "augment", "gpu_decode"))
}
"""Where a stage's failures stand in a message that counts them by stage (others last)."""
_SHOWN = {"unknown": "before resume"}


def stage_failures_of(state: Mapping[str, Any] | None, failed: int) -> dict[str, int]:
    """A resume state's failures per stage, which must add up to its ``failed`` positions.
    A state without them (written before they were kept) puts them all under "unknown"."""
    if state is None:
        return {}
    counts = state.get(FAILED_STAGES)
    if counts is None:
        return {"unknown": failed} if failed else {}
    ok = isinstance(counts, Mapping) and all(
        isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool) and v >= 0
        for k, v in counts.items()
    )
    if not ok or sum(counts.values()) != failed:
        raise ValueError(
            f"state_dict field {FAILED_STAGES!r} must map stage names to counts adding up "
            f"to the {failed} failed positions, got {brief(counts)}"
        )
    return dict(counts)


def make_batcher(loader: ImageLoader, n: int) -> OrderedBatcher[Any] | StragglerBatcher[Any]:
    """The loader's batcher for an epoch of ``n`` positions."""
    # The waits at an epoch's end that keep the batch count (each batcher's docstring)
    # are for distributed runs, whose ranks must step together; one process goes on.
    distributed = loader.sampler.world_size > 1
    if loader.batching == "straggler":
        return StragglerBatcher(
            loader.batch_size,
            n,
            max_delay_batches=loader.options.max_delay_batches,
            drop_last=loader.drop_last,
            wait_for_last=distributed,
        )
    window = loader._window() if distributed else None
    return OrderedBatcher(loader.batch_size, n, drop_last=loader.drop_last, window=window)


class EpochBase:
    """The window, the source of positions, failures, the consume loop and shutdown."""

    finished = False
    reported = False
    """Closed, with its failures handed to the loader (set under the loader's lock)."""
    pass_number = 0
    """Which of the loader's passes this is (set when it starts; a late close of an
    older pass must not stand for the current one)."""
    unstarted: weakref.finalize[Any, Any] | None = None
    """Closes the epoch if the loader's iterator is dropped before its first next()."""
    after_batching: frozenset[str] = frozenset()
    """Stages that run on batches the batcher formed: it has taken their failures' samples
    as completed already (`failure_total_error`)."""

    def __init__(self, loader: ImageLoader, resume: Mapping[str, Any] | None) -> None:
        import_codecs()  # here, not in a decode thread at the first PNG (see its docstring)
        rescue_lost_interrupts()  # a Ctrl-C in a weakref callback of a thread freed
        self.loader = loader
        self.epoch = loader.epoch
        self.indices = loader.sampler.indices()
        n = len(self.indices)
        self.batcher = make_batcher(loader, n)
        if resume is not None:
            self.batcher.load_state_dict(resume)
        self.received = Received(self.batcher, resume)
        self.restored = self.restored_failures()
        """Samples that failed before the checkpoint this epoch resumed from: the state
        keeps their positions, not their errors (the loader keeps the real records when
        it still has them)."""
        # Positions to start: all of them unless resumed (a range: no list of an
        # ImageNet-sized epoch's positions at every epoch's start).
        self.todo: Sequence[int] = (
            range(self.batcher.plan.num_kept)
            if resume is None
            else self.batcher.remaining_positions()
        )
        self.window = loader._window()
        self.in_flight = 0
        self.window_wait_s = 0.0
        """Seconds `source` has waited for room in the window (the engine's back-pressure:
        waiting for the training loop is not the source's work)."""
        # The training loop's thread takes the window's lock itself (`release`,
        # `stop_feeding`): an RLock's `with` is C code, where a Ctrl-C cannot land
        # between acquiring it and the `with` that releases it. Condition's own
        # `__enter__` is Python: a Ctrl-C there left the lock held for good, and the
        # source thread, waiting to take it back, held the pipeline's join for 10 s.
        self.window_lock = threading.RLock()
        self.cond = threading.Condition(self.window_lock)
        self.stopping = InterruptSafeEvent()
        self.pipeline_closed = InterruptSafeEvent()
        """A pipeline of this epoch closed: its source must not wait for room any more
        (`feeds`). Apart from `stopping`, which says the epoch was stopped: a pipeline
        also closes when its output ends."""
        self.pid = os.getpid()  # its threads exist in this process only
        self.failed_positions: collections.deque[int] = collections.deque()
        self.labels = np.asarray(loader.source.labels, dtype=np.int64)
        self._closed = False
        # One sample's decode + transform on the CPU (`load`): `load_into`, or with an
        # `augment` function `load_augmented` (chosen once per epoch, not per sample).
        self.load_sample: Callable[..., object] = load_into
        if loader.augment is not None:
            self.load_sample = functools.partial(load_augmented, loader.augment)
        self.padding_batches = 0  # `padding_batch`es made by this pass
        self.padding_made = Padding()  # where the round stands after the last one made
        self.wait_deadline: float | None = None  # `check_wait`'s, for the current next()
        self.join_s = JOIN_TIMEOUT_S
        """How long `shutdown` waits for each pipeline's threads (shorter once a wait
        timed out: a thread stuck in a read would hold the error back that long)."""
        self.close_lock = threading.Lock()
        self._close_done = InterruptSafeEvent()  # the first closer has handed over
        self._closer: int | None = None  # that closer's thread
        self._abandoned = False  # the training loop let go of the iterator mid-epoch
        self.stopped_because: str | None = None
        self.in_hand: dict[int, tuple[str, str, float]] = {}
        """Per worker thread (its ident): the key, stage and start time of the sample it
        works on (`hold`); `check_wait` names the oldest. A run marks all its samples
        started at once, so the batcher alone cannot tell which one hangs."""

    # -- feeding -------------------------------------------------------------------------
    def source(self) -> Iterator[Task]:
        """Positions to run, holding back while `window` samples are in flight."""
        index_of = self.loader.source.key
        for position in self.start_order():
            if not self.enter_window():
                return
            yield self.task_at(position, index_of)

    def source_runs(
        self, size: Callable[[], int], sizer: RunSizer | None = None
    ) -> Iterator[list[Task]]:
        """`source`'s tasks in runs of up to ``size()`` (one read or decode call each),
        asked as each run begins. A run in the making goes out as it is once the window is
        full: its samples may be the ones a batch needs before any room comes back. While
        ``sizer`` is probing, the window is capped (`room`)."""
        index_of = self.loader.source.key
        run: list[Task] = []
        most = size()
        for position in self.start_order():
            if run and self.in_flight >= self.room(sizer):  # only this thread adds to it
                yield run
                run, most = [], size()
            if not self.enter_window(sizer):
                return
            run.append(self.task_at(position, index_of))
            if len(run) >= most:
                yield run
                run, most = [], size()
        if run:
            yield run

    def room(self, sizer: RunSizer | None = None) -> int:
        """The window's size: capped at ``sizer.probe`` samples (or two per read and
        decode thread, if more) while ``sizer`` waits for its early verdict, so that the
        loader's whole first window does not go out one sample per call before it
        (`RunSizer`)."""
        if sizer is None or sizer.verdict() is not None:
            return self.window
        threads = self.loader.io_threads + self.loader.decode_threads
        return min(self.window, max(sizer.probe, 2 * threads))

    def enter_window(self, sizer: RunSizer | None = None) -> bool:
        """Take a place in the in-flight window (`room`), waiting for one; False once
        stopping. While ``sizer`` is probing the cap is looked at again every 5 ms: a read
        still running can give the verdict with no sample finishing."""
        with self.cond:
            if self.in_flight >= self.room(sizer):
                clock = time.perf_counter
                began = clock()
                while self.in_flight >= self.room(sizer) and not self.feeding_ended():
                    self.cond.wait(0.005 if sizer is not None and sizer.probing else 0.05)
                self.window_wait_s += clock() - began
            if self.feeding_ended():
                return False
            self.in_flight += 1
            return True

    def feeding_ended(self) -> bool:
        """The epoch stopped, or a pipeline it feeds closed: start no more samples."""
        return self.stopping.is_set() or self.pipeline_closed.is_set()

    def task_at(self, position: int, index_of: Callable[[int], str]) -> Task:
        """The task of ``position``, marked started in the batcher."""
        self.batcher.started(position)
        return self.new_task(position, index_of)

    def new_task(self, position: int, index_of: Callable[[int], str]) -> Task:
        """The task of ``position`` (``index_of``: the source's ``key``), batcher untold:
        `task_at`'s, and `padding_batch`'s repeats of delivered samples."""
        index = int(self.indices[position])
        return Task(position, index, index_of(index), stream=self.stream_of(position, index))

    def stream_of(self, position: int, index: int) -> int:
        """`Task.stream` for the sample at ``position`` of this rank's epoch."""
        sampler = self.loader.sampler
        if not sampler.may_repeat:
            return index
        return sampler.num_samples + sampler.rank + sampler.world_size * position

    def restored_failures(self) -> list[FailedSample]:
        failed = self.received.ledger.failed_positions()
        key = self.loader.source.key
        note = "failed before the checkpoint this epoch resumed from (its error is not saved)"
        return [
            FailedSample(key(int(self.indices[p])), "before resume", note, self.epoch)
            for p in failed
        ]

    def backpressure_s(self) -> float:
        return self.window_wait_s

    def start_order(self) -> Iterator[int]:
        """`todo`, in straggler mode with `cost_lookahead` reordered block by block so the
        larger files (slower to read and decode) start first. Sizes are asked for one
        block at a time, as the source thread reaches it."""
        lookahead = self.loader.options.cost_lookahead
        if self.loader.batching != "straggler" or lookahead <= 1:
            yield from self.todo
            return
        nbytes, indices, todo = self.loader.source.nbytes, self.indices, self.todo

        def cost(position: int) -> float:
            try:
                return float(nbytes(int(indices[position])) or 0)
            except Exception:  # a missing or unreadable file: its read reports it, with its key
                return 0.0

        for start in range(0, len(todo), lookahead):
            block = todo[start : start + lookahead]
            yield from order_by_cost(block, [cost(p) for p in block], lookahead)

    def note_failure(self, position: int, stage: str) -> None:
        """Called from a worker thread when a sample fails in ``stage`` (the engine records
        why)."""
        self.remember_failure(position, stage)
        if self.loader.on_error == "raise" and not self.stopping.is_set():
            # The engine's error stops the epoch. Told of the failure, the batcher cut the
            # sample's batch short, and it could reach the loop before the error did
            # (QA70). A run's failure needs no such care: it sets `run_error` before
            # the batcher learns of it, and `next_batch` raises that first.
            return
        self.failed_positions.append(position)

    def remember_failure(self, position: int, stage: str) -> None:
        """Put a failed sample in the resume record, so a resumed epoch does not run it
        again: at once, not when the batcher thread drains it (up to an idle tick later),
        so a `state_dict()` taken once `failed_samples()` lists it agrees.

        Not with ``on_error="raise"`` (the user fixes the file, then resumes: it must run
        again) and not once the epoch is stopping (work interrupted by the stop, such
        as a fetch waiting for arena room, is not a bad sample).
        """
        if self.loader.on_error == "skip" and not self.stopping.is_set():
            self.received.failed(position, stage)

    def drain_failures(self) -> None:
        """Tell the batcher about failures (`note_failure` told the resume record), and
        free their window."""
        freed = 0
        while self.failed_positions:
            position = self.failed_positions.popleft()
            self.batcher.fail(position)
            self.forget(position)
            freed += 1
        if freed:
            self.release(freed)

    def forget(self, position: int) -> None:
        """A failed position's resources can go (the CPU path's straggler rows)."""

    def feed_batcher(
        self,
        completions: Iterable[Any],
        item: Callable[[Any], Any],
        pop: Callable[[], Batch[Any] | None] | None = None,
        pushed: Callable[[Any], None] | None = None,
    ) -> Iterator[Batch[Any]]:
        """Feed a pipeline's completions to the batcher (``item(done)`` at ``done.position``,
        then ``pushed(done)``); yield each batch it emits, then the epoch's tail (not when
        the epoch was stopped: its pipeline ended early).

        ``completions`` must include the engine's idle ticks (``iterate(idle_s=...)``): a
        failure noted after the last completion must still reach the batcher, or a window
        full of samples waiting for it would never move. ``pop()`` takes the next batch
        (default: ``batcher.pop()``; see `Batcher.pop` for what a caller may ask).
        """
        batcher = self.batcher
        pop = batcher.pop if pop is None else pop
        for done in completions:
            self.drain_failures()
            if done is not IDLE:
                batcher.push(done.position, item(done))
                if pushed is not None:
                    pushed(done)
            while (batch := pop()) is not None:
                yield batch
        if self.stopping.is_set():
            return
        self.drain_failures()
        yield from batcher.pop_final()

    def release(self, count: int) -> None:
        with self.window_lock:
            self.in_flight -= count
            self.cond.notify_all()

    def slow_lane(self, name: str, threads: int, *, runs: bool = False) -> SlowLane | None:
        """Straggler mode: a task running past the adaptive threshold moves its worker to
        a slow lane and a replacement keeps the stage at strength (each stage learns its
        own threshold: slow reads and slow decodes are different populations). With
        ``runs`` a task is a run of samples, weighed by its length: the threshold learns
        per sample, so it holds when the run size changes (one sample per call while the
        run sizer warms up, then runs of 8: a limit learnt from single samples moved
        every run, and the replacement threads slowed the rest on a 2-core machine)."""
        if self.loader.batching != "straggler":
            return None
        limit = self.loader.options.max_slow_threads or threads
        return SlowLane(
            max_threads=limit,
            threshold=self.straggler_threshold(name),
            weight=_run_weight if runs else None,
        )

    def straggler_threshold(self, name: str) -> AdaptiveThreshold:
        """When a ``name`` task counts as a straggler: the loader's, kept across epochs
        (`ImageLoader._straggler_threshold`)."""
        return self.loader._straggler_threshold(name)

    # -- consuming -----------------------------------------------------------------------
    def batches(self) -> Generator[Yielded, None, None]:
        """The generator the training loop iterates."""
        if self.unstarted is not None:
            self.unstarted.detach()  # started: its own exit closes the epoch from here on
        _STARTED.add(self)  # or the interpreter's exit does (`_close_at_exit`)
        try:
            yield from self._batches()
        except KeyboardInterrupt:
            if not self._abandoned or threading.current_thread() is not threading.main_thread():
                raise
            # Ctrl-C landed while the training loop's `break` (or the garbage collector)
            # closed this iterator. Raised from here it would never reach the loop: Python
            # prints "Exception ignored" and carries on (QA: 73 of 200 Ctrl-Cs lost). So
            # finish stopping the threads, then raise it again in the main thread once
            # this close has returned.
            self._finish_closing()
            interrupt_main_after(sys._getframe())

    def _finish_closing(self) -> None:
        for _ in range(3):  # a further Ctrl-C meanwhile: go on; the threads are daemons
            try:
                self.close()
                self.shutdown()  # again: the interrupt may have cut the first one short
                return
            except KeyboardInterrupt:
                continue

    def _batches(self) -> Iterator[Yielded]:
        loader = self.loader
        # An iterator whose epoch was stopped before it ran (a newer iteration, close(),
        # load_state_dict()) says so, and starts no sampler or clock.
        self.check_not_stopped()
        if self._closed:
            raise RuntimeError("this epoch's iterator was closed before it started")
        monitor = loader._monitor_for_epoch()
        # `in_wait`: this generator may have a wait open on the monitor. It is set before
        # each `wait_started` and cleared after each `wait_ended`, and the last `finally`
        # ends a wait only if the monitor also has one open: a Ctrl-C inside either call
        # then neither leaves the meter waiting for good ("wait_started() called twice"
        # at every later pass) nor ends a wait twice (a RuntimeError that replaced the
        # KeyboardInterrupt, and with it the loop's checkpoint). The flag, not the
        # monitor alone, because an older pass's generator collected during this one's
        # wait must not end it.
        in_wait = False
        progress = None
        ended = False  # the epoch's own batches have all come: only padding may follow
        try:
            # The training loop's first next() runs now: starting the epoch's samplers
            # and threads is part of its wait (the start-up), so that wait begins here.
            # (Between epochs the monitor's clock stands still until `start`.)
            in_wait = True
            monitor.wait_started()
            loader._start_monitoring()
            progress = loader._make_progress(len(self.todo), monitor)
            with self.running():
                try:
                    while True:
                        self.check_not_stopped()
                        if not in_wait:
                            in_wait = True
                            monitor.wait_started()
                        try:
                            if (timeout := loader.options.batch_timeout_s) is not None:
                                self.wait_deadline = time.monotonic() + timeout
                            if not ended:
                                self.check_failure_total()
                            produced = None if ended else self.next_batch()
                            if produced is None and not ended:
                                self.check_failure_total(final=True)
                        except Exception as exc:
                            self.check_not_stopped()  # a stopped epoch's own error is noise
                            if isinstance(exc, PipelineFailure) and exc.limit_reached:
                                if loader.on_error == "raise":
                                    # The engine's message would advise raising
                                    # max_failures, which this mode does not use.
                                    raise limit_failure(
                                        self.failure_advice(exc.exceptions), exc.exceptions
                                    ) from None
                                # A stage's own limit: said as the epoch's, with every
                                # stage's count (a stage is past it only if they are).
                                total = self.failure_total_error(final=False, passed=True)
                                if total is not None:
                                    exc = total
                                add_note(exc, self.failure_advice(exc.exceptions))
                                raise exc from None
                            raise
                        padding = ended = produced is None
                        if padding:
                            self.check_not_stopped()  # not a quiet, truncated epoch
                            produced = self.padding_batch()
                            if produced is None:
                                break
                        assert produced is not None
                        images, labels, positions = produced
                        monitor.record_batch(len(positions))
                        if progress is not None:
                            progress.step(loader.stats)
                        rows = np.asarray(self.indices[list(positions)], np.int64)
                        batch = Yielded(images, labels, rows, loader.source)
                        try:
                            # Recorded as handed over just before it is: a Ctrl-C
                            # between the two would leave the batch in the checkpoint
                            # a training loop saves on KeyboardInterrupt, yet never
                            # trained on, and a resume would skip its samples.
                            if padding:  # its samples were delivered (and released)
                                self.received.padded(self.padding_made)
                            else:
                                self.received.delivered(positions)
                                # Last, so the bookkeeping above runs before the samples
                                # this frees start: with the window full, the decode
                                # threads are idle until then and do not compete with
                                # the training loop's thread for the GIL (measured:
                                # 0.2-6 ms per batch of waiting with five batches queued).
                                self.release(len(positions))
                            # The wait ends as the batch is handed over: the bookkeeping
                            # above is time the training loop spends in next() too (QA:
                            # a wait ended before it left 25-40% of that time out, 3-10
                            # ms a batch with the decode threads contending for the GIL).
                            # Inside this `try`: a Ctrl-C in it takes the record back.
                            monitor.wait_ended()
                            in_wait = False
                        except BaseException:
                            if padding:
                                self.received.unpadded(self.padding_made)
                            else:
                                self.received.undelivered(positions)
                            raise
                        try:
                            yield batch
                        except GeneratorExit:  # a `break`, or the iterator collected
                            self._abandoned = True
                            raise
                finally:
                    # Before `running` stops the pipelines: their source thread may be
                    # waiting for room in the window (a training loop that broke out or
                    # raised leaves it full). Without this the pipeline's close waited
                    # out its 10 s join timeout for it (seen in 1 of ~30 test runs);
                    # the close now also ends that wait (`feeds`), but only at the
                    # wait's next 50 ms poll, and this wakes it at once. At the epoch's
                    # end every thread has finished, and this changes nothing.
                    self.stop_feeding()
            self.finished = True
            loader._epoch_finished()
        except Exception:
            # Stopped from another thread (set_epoch, close, load_state_dict) while this
            # one started its threads or monitor: whatever that broke, say why.
            if (stopped := self.stopped_error()) is not None:
                raise stopped from None
            raise
        finally:
            try:
                # The threads did not start, the epoch was stopped meanwhile, or an
                # exception cut the bookkeeping short.
                if in_wait and monitor.wait_open:
                    monitor.wait_ended()
                if progress is not None:
                    progress.close(loader.stats())
            finally:
                self.close()  # whatever the reporting did: join the threads, hand over

    def hold(self, key: str, stage: str) -> int:
        """This thread works on the sample ``key`` in ``stage`` from now (`in_hand`), until
        `in_hand.pop` of the ident returned (not a context manager: once per sample)."""
        me = threading.get_ident()
        self.in_hand[me] = (key, stage, time.perf_counter())
        return me

    def check_wait(self) -> None:
        """Raise `TimeoutError` once the training loop has waited past its
        ``batch_timeout_s`` for this batch (the paths call it as they wait)."""
        if self.wait_deadline is None or time.monotonic() < self.wait_deadline:
            return
        timeout = self.loader.options.batch_timeout_s
        self.join_s = TIMED_OUT_JOIN_S
        now = time.perf_counter()
        # The samples in the workers' hands longest: the ones that hang (QA: the first
        # positions started were named, four of a run queued behind the hung one).
        held = sorted(self.in_hand.copy().values(), key=lambda entry: entry[2])[:4]
        if held:
            waiting = "the samples in hand longest are " + ", ".join(
                f"{key} in {stage} for {now - since:.1f} s" for key, stage, since in held
            )
        elif started := self.batcher.running(limit=4):
            keys = [self.loader.source.key(int(self.indices[p])) for p in started]
            waiting = f"the next one waits for {', '.join(keys)}"
        else:
            waiting = "no sample is running"
        raise TimeoutError(
            f"no batch came within batch_timeout_s={timeout:g} s; {waiting} (a read or "
            "decode that does not return?). The epoch stopped: state_dict() resumes it"
        )

    def padding_batch(self) -> Formed | None:
        """In a distributed run, a batch of repeated samples while this rank's epoch,
        ended, is short of `len(loader)` batches; None otherwise.

        Ranks step together: one yielding fewer batches than the others leaves them
        waiting in a collective for good. The batchers keep the count by cutting batches
        (`OrderedBatcher`, `StragglerBatcher`), but cannot when too few samples are left
        (batch_size 1: every failed sample is a batch). So, as `DistributedSampler` pads
        a shard, samples delivered this epoch are decoded again, with the same crop,
        in the training loop's thread: ascending positions, as many as a batch holds,
        round and round. A rank with none to repeat raises: ending short would hang.
        """
        loader, received = self.loader, self.received
        if loader.sampler.world_size <= 1 or received.batches >= len(loader):
            return None
        delivered = received.delivered_positions()
        import torch

        size = min(loader.batch_size, int(delivered.size))
        out_h, out_w = loader.transform.output_size
        images = torch.empty(
            (size, 3, out_h, out_w), dtype=getattr(torch, loader.dtype), device="cpu"
        )
        rows, positions = as_numpy(images), list[int]()
        # Round and round the delivered samples, as many batches as it takes; one that
        # fails now (its file gone since) is passed over from then on. Where the round
        # stands is recorded as the batch is handed over (`Received.padded`).
        cursor, failed = received.padding.next, set(received.padding.failed)
        for _ in range(delivered.size):
            if len(positions) == size:
                break
            position = int(delivered[cursor % delivered.size])
            cursor += 1
            if position in failed:
                continue
            task = self.new_task(position, loader.source.key)
            try:
                task.data = bytes(loader.source.read(task.index))
                self.load(task, rows[len(positions)])  # with `augment`, as the first time
            except Exception as exc:
                logger.warning("a repeat to pad the epoch failed: %s: %s", task.key, exc)
                failed.add(position)
                continue
            positions.append(position)
        self.padding_made = Padding(cursor, frozenset(failed))
        if not positions:  # ending short would leave the other ranks waiting for good
            raise RuntimeError(
                f"rank {loader.sampler.rank} of {loader.sampler.world_size}: epoch "
                f"{self.epoch} is {len(loader) - received.batches} batch(es) short of "
                f"len(loader)={len(loader)}, and none of the {delivered.size} samples it "
                "delivered could be decoded again to make them up (every sample of its "
                "shard failed?): the other ranks would wait for them for good. "
                "loader.failed_samples() lists the failures"
            )
        if self.padding_batches == 0:
            logger.warning(
                "rank %d of %d: epoch %d came out %d batch(es) short of len(loader)=%d "
                "(failed samples); each is made of samples this epoch delivered, decoded "
                "again, so that the ranks step together",
                loader.sampler.rank,
                loader.sampler.world_size,
                self.epoch,
                len(loader) - received.batches,
                len(loader),
            )
        self.padding_batches += 1
        images = images[: len(positions)]
        labels = torch.from_numpy(self.labels[self.indices[positions]])
        return images.to(loader.device), labels.to(loader.device), positions

    def load(self, task: Task, out: np.ndarray) -> None:
        """Decode and transform ``task`` into ``out`` on the CPU (`load_sample`): the CPU
        path's every sample, and `padding_batch`'s repeats on either path."""
        loader = self.loader
        self.load_sample(
            task.data or b"",
            loader.transform,
            sample_stream(loader.seed, self.epoch, task.stream),
            out,
            dtype=loader.dtype,
            key=task.key,
            max_pixels=loader.options.max_pixels,
        )

    def failure_advice(self, causes: Sequence[BaseException]) -> str:
        """What a training loop hit by `PipelineFailure` can do, in the loader's terms (the
        engine's own message speaks of the engine). "First" is the first of ``causes``,
        the failures of the stage that stopped: the epoch's first failure may be another
        stage's, which the exception does not hold (QA: the message named a missing file
        while the error inside was another file's DecodeError)."""
        loader = self.loader
        named = noted_failure(causes[0], self.epoch) if causes else None
        if named is None and (failed := self.failures()):
            # Only failures from before a resume, whose errors the state does not keep:
            # the first of those, by key (QA53: the note named no file at all).
            named = failed[0]
        first = f" First: {named.key} ({named.stage}: {named.error})." if named else ""
        if loader.on_error == "raise":
            return (
                f"ImageLoader(on_error='raise') stops at the first sample that fails.{first} "
                "loader.failed_samples() lists it; on_error='skip' skips bad samples and "
                "reports them there instead."
            )
        return (
            f"ImageLoader: more samples failed than max_failures={loader.max_failures!r} "
            f"allows (bad files of every stage together).{first} loader.failed_samples() lists "
            "each with its key; pass a larger max_failures (None: no limit) to go on."
        )

    def check_failure_total(self, *, final: bool = False) -> None:
        """Apply ``max_failures`` to the epoch's failed samples, every stage together (the
        stages apply it each to their own, which a mix of unreadable and undecodable files
        could pass: 3 bad files went through max_failures=2, 1 in read and 2 in decode).
        Called by the training loop's thread before each batch and at the end, so a
        failure stops the epoch at most a batch later than a stage's own limit would."""
        if (error := self.failure_total_error(final=final)) is not None:
            raise error

    def failure_total_error(self, *, final: bool, passed: bool = False) -> PipelineFailure | None:
        """The `PipelineFailure` for the epoch's failures past ``max_failures`` (a count at
        once, a rate as the engine judges one, `rate_passed`), None while within it.
        ``passed``: a stage's own limit is passed, and so is the epoch's (its count is at
        least the stage's, its rate too, over the same samples): the error is made
        whatever the judgement here, which may not be final yet (QA57: the stage's own
        message, counting only its own, reached the user)."""
        limit = self.loader.max_failures
        if limit is None or self.loader.on_error != "skip":
            return None
        per_stage = self.received.failure_counts()
        failed = sum(per_stage.values())
        if not failed:
            return None
        if isinstance(limit, int):
            if failed <= limit and not passed:
                return None
            detail = f"{failed} samples failed"
        else:
            # Samples the pipeline has finished with, not those delivered: the loader
            # runs a window of samples ahead of the training loop, and a failure counts at
            # once (QA56: 25% of bad files stopped an epoch against 0.3, as 66 of 114). A
            # stage after batching fails samples the batcher already took as completed.
            # This pass's only: a resumed epoch's batcher has the restored ones as failed
            # (QA57: its denominator lost every gpu_decode failure before the checkpoint).
            before = self.received.restored_failures
            late = sum(
                n - before.get(s, 0) for s, n in per_stage.items() if s in self.after_batching
            )
            done = max(self.batcher.completed_ok() + failed - late, self.samples_read())
            final = final or done >= self.batcher.plan.num_kept
            if not passed and not rate_passed(failed, done, limit, final=final):
                return None
            detail = f"{failed} of {done} samples failed"
        ordered = sorted(per_stage.items(), key=lambda kv: _STAGE_ORDER.get(kv[0], 99))
        # A state written before failures were kept per stage counts them as "unknown".
        stages = ", ".join(f"{_SHOWN.get(stage, stage)} {n}" for stage, n in ordered)
        causes = self.failure_causes() or [
            RuntimeError(f"{failed} samples failed before the point this epoch resumed from")
        ]
        return limit_failure(
            f"this epoch's failed samples passed max_failures={limit!r} ({detail}: "
            f"{stages}); see failed_samples() for every key",
            causes,
        )

    def samples_read(self) -> int:
        """The epoch's samples whose read has ended (failed or not), resumed ones included,
        where the epoch counts them (`CpuEpoch` with runs); 0 elsewhere. A lower bound of
        the samples finished for `failure_total_error`: a read failure counts at once, while
        the samples read well around it reach the batcher only as their decode runs end
        (runs of 32 made "108 of 266" of 25% bad files, against 0.3)."""
        return 0

    def failure_causes(self) -> list[Exception]:
        """The errors of this pass's failed samples in epoch order (at most `MAX_CAUSES`),
        for a `PipelineFailure` of the whole epoch's, whose note names the first: the
        stages' records come stage by stage (QA57: a missing file at position 300 was
        named before the corrupt one at 0)."""
        errors = self.failure_errors()
        key_of, indices = self.loader.source.key, self.indices
        where = {key_of(int(indices[p])): p for p in self.received.failed_positions()}

        def position(exc: Exception) -> int:
            named = noted_failure(exc, self.epoch)
            return where.get(named.key, len(indices)) if named is not None else len(indices)

        return sorted(errors, key=position)[:MAX_CAUSES]

    def failure_errors(self) -> list[Exception]:
        """The errors of this pass's failed samples (`failure_causes`)."""
        raise NotImplementedError

    def stop_feeding(self) -> None:
        """Stop starting samples: wake the source thread if it waits for the window."""
        self.stopping.set()
        with self.window_lock:
            self.cond.notify_all()

    def feeds(self, pipeline: Pipeline) -> None:
        """`source` waits for window room until `feeding_ended`; `stopping` is set by the
        epoch alone. A pipeline closed without the epoch's own `stop_feeding` must end
        that wait too, or each join of the source thread waited out its 10 s: its
        finalizer at interpreter exit, while the training loop still holds the iterator
        (30 s), and a Ctrl-C while the epoch starts its pipeline, before `_batches` can
        stop feeding (QA: 17 of 250 real signals). The pipeline sets `pipeline_closed` before it joins
        (`Pipeline.on_close`): the Event alone, so that the pipeline's finalizer does not
        keep the epoch alive, and not `stopping`, which would cost a finished epoch its
        end marker (a pipeline also closes when its output ends)."""
        pipeline.on_close(self.pipeline_closed.set)

    def check_not_stopped(self) -> None:
        if os.getpid() != self.pid:
            raise RuntimeError(
                "this epoch's iterator was made in another process (before a fork): its "
                "threads did not come with it; iterate the loader again in this process"
            )
        if (stopped := self.stopped_error()) is not None:
            raise stopped

    def stopped_error(self) -> RuntimeError | None:
        """The error a stopped epoch's iterator raises, None while it may run."""
        if self.stopped_because is None:
            return None
        return RuntimeError(
            f"this epoch's iterator was stopped: {self.stopped_because}. An ImageLoader "
            "runs one epoch at a time; iterate it again (after set_epoch) for the next"
        )

    def running(self) -> contextlib.AbstractContextManager[None]:
        """Context manager that starts the pipelines and stops them on exit."""
        raise NotImplementedError

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor, Sequence[int]] | None:
        """The next (images, labels, positions) for the training loop, None at the end.
        Its positions stay in the in-flight window: `batches` releases them."""
        raise NotImplementedError

    # -- failures and shutdown -----------------------------------------------------------
    def failures(self) -> list[FailedSample]:
        """Every sample of this epoch not delivered: those restored from the resume
        state, then the path's own records."""
        return self.restored + self.stage_failures()

    def stage_failures(self) -> list[FailedSample]:
        """This pass's failures, as the path's stages recorded them."""
        raise NotImplementedError

    def engine_stats(self) -> Any:
        raise NotImplementedError

    def shutdown(self) -> None:
        """Stop and join this epoch's threads."""
        raise NotImplementedError

    def threads(self) -> list[threading.Thread]:
        """This epoch's threads still alive (its pipelines' and the path's own)."""
        raise NotImplementedError

    def close(self, reason: str | None = None) -> None:
        """Stop the pipelines. ``reason`` (why, for a training loop still holding this
        epoch's iterator) makes that iterator raise it instead of ending quietly."""
        if os.getpid() != self.pid:
            # A forked child's copy (its iterator collected, or the child's exit): the
            # threads are the parent's, and so is the JSON-lines log the hand-over closes.
            return
        if reason is not None and self.stopped_because is None and not self.finished:
            self.stopped_because = reason
        me = threading.get_ident()
        with self.close_lock:  # one closer (another thread, a finalizer) does the work
            first, self._closed = not self._closed, True
            if first:
                self._closer = me
        if not first:
            # Another thread is closing: wait until it has joined the threads and handed
            # the progress over, so that whoever called close() finds them gone (the
            # loader's close() then frees the GPU decoders those threads use). Not the
            # closer itself (a Ctrl-C's second close), nor one of the loader's threads
            # (a finalizer run there: the closer may be joining it), nor at exit.
            if me != self._closer and not loader_thread() and not sys.is_finalizing():
                self._close_done.wait(CLOSE_WAIT_S)
            return
        try:
            self.stop_feeding()
            self.shutdown()
        finally:  # also when a Ctrl-C cut the shutdown short: the progress is handed over
            try:
                self.loader._epoch_closed(
                    self, self.failures(), self.engine_stats(), self.batching_stats()
                )
            finally:
                self._close_done.set()

    def batching_stats(self) -> BatcherStats:
        """The batcher's counters, with the path's copy counters where it has them."""
        return self.batcher.stats()


AT_ONCE_MOST_PIXELS = 1 << 16
"""`CpuEpoch.decode_run_at_once` defers JPEGs of at most this many pixels at their DCT
scale (256 x 256: well under a millisecond of decode) to the run's one C call."""


class CpuEpoch(EpochBase):
    """read (I/O threads) -> decode + transform (CPU threads) -> batcher thread -> queue.

    Ordered mode writes each sample straight into its slot of its batch's tensor; so does
    straggler mode, which builds each batch on one of those tensors and copies in only the
    samples that moved (`gpu_loader._straggler_rows`).
    """

    def __init__(self, loader: ImageLoader, resume: Mapping[str, Any] | None) -> None:
        import torch

        super().__init__(loader, resume)
        self.torch_dtype = getattr(torch, loader.dtype)
        self.out_h, self.out_w = loader.transform.output_size
        self.pin = loader._pin_batches()
        # Batches that stay on the CPU are recycled once the training loop drops them.
        self.pool = None if self.pin or loader.device.type != "cpu" else loader._batch_pool()
        # Ordered mode's nominal batch tensors, each with a numpy view of it: a row of
        # that view is a decode's `out` (numpy indexing is ~10x cheaper than torch's, and
        # a numpy view adds no reference to the storage, which `BatchPool` counts).
        self.buffers: dict[int, tuple[torch.Tensor, np.ndarray]] = {}
        self.buffers_lock = threading.Lock()
        # Straggler mode: samples decode into their nominal batch's rows; a batch is built
        # on one of those tensors, copying in only the samples that moved.
        self.rows: StragglerRows | None = None
        if loader.batching == "straggler":
            self.rows = StragglerRows(
                self.batcher.plan,
                self.new_batch,
                self.new_sample,
                self.recycle,
                spare=loader._sample_spares(),
            )
        order: Literal["completion"] = "completion"
        # Samples go in runs of consecutive positions, one engine call per run and stage:
        # the per-call costs under the GIL (queue hops, counters, stage bookkeeping) are
        # paid once per run, not per sample. Straggler mode sizes each run from what it
        # measures (`RunSizer`): one sample per call while reads are slow enough that its
        # slow lane must be able to move a single sample. Both modes' runs grow past the
        # default while samples are cheap (`RunLength`, which `each_in_run` times).
        self.sizer = loader._run_sizer()
        sizer = self.sizer
        self.lengths = loader._run_length()
        # A run's local files can be read in one call (`reads_at_once`) where reading is
        # the index's own: a subclass's or a patched `read` is called per sample.
        source = loader.source
        self.local_reads = "read" not in vars(source) and any(
            isinstance(source, kind) and type(source).read is kind.read
            for kind in (FileIndex, TarShards)
        )
        self.run_size = sizer.most if sizer is not None else loader._samples_per_task()
        runs = self.run_size > 1
        run_size = (
            sizer.size
            if sizer is not None
            else self.lengths.size
            if self.lengths is not None
            else lambda n=self.run_size: n
        )
        decode_lane = self.slow_lane("decode", loader.decode_threads, runs=runs)
        # Straggler mode: when one decode counts as a straggler (`pop_batch`). With runs
        # the decode stage's lane learns each run's time per sample, an average that
        # hides one slow decode, so a threshold of the same rule learns from single
        # decodes (`each_in_run`); without, it is the lane's own.
        self.decode_limit: LaneThreshold | None = None
        if decode_lane is not None:
            self.decode_limit = (
                self.straggler_threshold("decode sample") if runs else decode_lane.threshold
            )
        # A run's failed samples are recorded here with the engine's own rules, per stage
        # and per sample: `run_calls` counts the samples of each stage's finished runs, and
        # `ordinals` numbers each sample as it finishes, so a failure's rate is over the
        # samples finished by then, other threads' runs in progress included (counting
        # finished runs only, a QA run read "102 of 100 calls failed", and the rate limit
        # could trip early). `itertools.count` is one C call, atomic under the GIL.
        # After a resume, the samples done before it count against the limits too.
        before = self.received.failures_before(("read", "decode"))
        self.run_policies = {
            s: FailurePolicy(s, loader.max_failures, before[s]) for s in ("read", "decode")
        }
        self.run_calls = dict.fromkeys(self.run_policies, 0)
        self.run_calls_lock = threading.Lock()
        self.ordinals = {stage: itertools.count(1) for stage in self.run_policies}
        # The last ordinal each stage handed out (`samples_read`), and the samples a
        # resume had read before this pass.
        self.last_ordinal = dict.fromkeys(self.run_policies, 0)
        self.read_before = before["read"][0]
        # Failures before a resume may pass the limit already (a lower max_failures):
        # stop before the first sample, as the engine's stages do (QA53).
        self.run_error: PipelineFailure | None = next(
            (e for p in self.run_policies.values() if (e := p.check_start()) is not None), None
        )
        self.pipeline = (
            PipelineBuilder()
            .add_source(
                self.source_runs(run_size, sizer) if runs else self.source(),
                backpressure_s=self.backpressure_s,
            )
            .pipe(
                self.read_run if runs else self.read,
                concurrency=loader.io_threads,
                name="read",
                output_order=order,
                max_failures=None if runs else loader.max_failures,  # see run_policies
                failures_before=before["read"],
                key_fn=run_key if runs else task_key,
                slow_lane=self.slow_lane("read", loader.io_threads, runs=runs),
            )
            .pipe(
                self.decode_run if runs else self.decode,
                concurrency=loader.decode_threads,
                name="decode",
                output_order=order,
                max_failures=None if runs else loader.max_failures,
                failures_before=before["decode"],
                key_fn=run_key if runs else task_key,
                slow_lane=decode_lane,
            )
            # A run's worth per slot (one sample each while the sizer says 1).
            .add_sink(
                buffer_size=max(2, loader.batch_size // (1 if sizer is not None else self.run_size))
            )
            .build()
        )
        self.feeds(self.pipeline)
        # Formed batches on their way to the training loop, with their emission index
        # (see `form`), and those formed ahead of their turn (see `take_formed`).
        self.formed: queue.SimpleQueue[tuple[int, Formed] | BaseException | None] = (
            queue.SimpleQueue()
        )
        self.early: dict[int, Formed] = {}
        self.next_index = self.batcher.stats().batches  # after a resume: where it left off
        self.former: threading.Thread | None = None

    # -- stages (worker threads) -----------------------------------------------------------
    def read(self, task: Task) -> Task:
        me = self.hold(task.key, "read")
        try:
            task.data = self.loader.source.read(task.index)
        except BaseException:
            self.note_failure(task.position, "read")
            raise
        finally:
            self.in_hand.pop(me, None)
        return task

    def decode(self, task: Task) -> Task:
        me = self.hold(task.key, "decode")
        try:
            self.decode_one(task)
        except BaseException as exc:
            # As `as_failed` lists it (QA56: the limit's message counted augment's as decode).
            self.note_failure(task.position, failed_stage("decode", exc))
            raise
        finally:
            self.in_hand.pop(me, None)
        return task

    def decode_one(self, task: Task, run: Run | None = None) -> None:
        """Decode ``task`` into its place: its row of its nominal batch's tensor (ordered
        mode), or where `StragglerRows` puts it (straggler mode, told when it ends and in
        which ``run``)."""
        if self.rows is None:
            self.load(task, self.slot(task.position))
        else:
            placed, done = self.place(task, run)
            try:
                self.load(task, placed.array)
            except BaseException:
                done(False)
                raise
            done(True)
        task.data = None

    def place(self, task: Task, run: Run | None) -> tuple[Placed, Callable[[bool], None]]:
        """Straggler mode: where ``task`` decodes (`StragglerRows.place`, the next decode of
        ``run``), and what to call once, whether it decoded or not: the rows are told (the
        sample waits for ``run`` to end) and, if it did, the task holds its place."""
        rows = self.rows
        assert rows is not None
        if run is not None:
            rows.run_decoding(run)
        placed, told = rows.place(task.position, len(task.data or b"")), False

        def done(ok: bool) -> None:
            nonlocal told
            if told:
                return
            told = True
            rows.finished(placed, ok=ok, run=run)
            if ok:
                task.out = placed

        return placed, done

    # Runs (see `__init__`): each sample that fails is recorded and left
    # out of the run; the rest go on. A stopping epoch ends a run after its current sample
    # (a run of slow reads would otherwise hold `close()` for all of them).
    def read_run(self, run: list[Task]) -> list[Task]:
        source = self.loader.source
        read = source.read

        def one(task: Task) -> None:
            task.data = read(task.index)

        if self.sizer is None or not self.sizer.probing:
            if self.reads_at_once(len(run)):
                return self.read_run_at_once(run, one)
            return self.each_in_run("read", run, one)
        sizer = self.sizer

        def probed(task: Task) -> None:  # one of the reads the sizer's early verdict judges
            place = sizer.read_began()
            if place is None:
                return one(task)
            try:
                one(task)
            finally:
                sizer.read_ended(place)

        return self.each_in_run("read", run, probed)

    def reads_at_once(self, samples: int) -> bool:
        """Whether a run of ``samples`` reads goes in one native call (`read_run_at_once`):
        local files of a `FileIndex` or tar shards whose `read` is its own, and reads measured short
        enough (`RunLength`) that all of them together take at most `RUN_READ_WALL_S`. A
        call cannot stop midway, and a stopping epoch waits for it."""
        lengths = self.lengths
        if not self.local_reads or lengths is None or samples < 2:
            return False
        wall = lengths.read_wall_s
        return wall is not None and wall * samples <= _run_sizer.RUN_READ_WALL_S

    def read_run_at_once(self, run: list[Task], one: Callable[[Task], None]) -> list[Task]:
        """`read_run` with the run's files read in one native call, one release of the GIL
        for all (`FileIndex._read_local_run`, `TarShards._read_local_run`; per file, the GIL's retake waited ~0.2-0.3
        ms behind the decode threads on tiny files). The call is made at the first sample;
        each sample then fails or not as its own `read` would, and counts its own time.
        Without the native backend, or with a URL among them, each is read alone."""
        source = self.loader.source
        assert isinstance(source, (FileIndex, TarShards))
        got: dict[int, bytes | Exception] | None = None
        times: dict[int, float] = {}

        def take(task: Task) -> None:
            nonlocal got
            if got is None:
                read = source._read_local_run([t.index for t in run])
                got = {}
                if read is not None:
                    positions = [t.position for t in run]
                    got = dict(zip(positions, read[0], strict=True))
                    times.update(zip(positions, read[1], strict=True))
            if task.position not in got:
                return one(task)
            data = got.pop(task.position)
            if isinstance(data, Exception):
                raise data
            task.data = data
            return None

        return self.each_in_run("read", run, take, times=times)

    def decode_run(self, run: list[Task]) -> list[Task]:
        rows = self.rows
        at_once = self.load_sample is _load_into  # no augment, no stand-in: two passes
        if rows is None:
            if at_once:
                return self.decode_run_at_once(run)
            return self.each_in_run("decode", run, self.decode_one)
        state = Run()  # straggler mode: what `hold_back` knows of this run
        try:
            if at_once:
                return self.decode_run_at_once(run, state)
            return self.each_in_run("decode", run, lambda task: self.decode_one(task, state))
        finally:
            rows.run_ended(state)

    def decode_run_at_once(self, run: list[Task], state: Run | None = None) -> list[Task]:
        """`decode_run` without augment: each sample's header, checks and parameters
        first (`prepare_load`; a file the native decoder does not take whole, or a large
        JPEG, is loaded there and then), then the run's small JPEGs in one C call, one
        release of the GIL for all (`load_prepared`). Per sample a release cost two
        hand-offs of the GIL (more than a tiny JPEG's decode), and holding it serialised
        the decode threads. Large ones go alone: a call cannot stop midway, so a run of
        them would hold `close()` (QA73: 0.3-0.8 s for 8 full 12 MP decodes). Straggler
        mode (``state``: its run) places each sample first, as `decode_one` does, and
        tells its rows when the call has decoded it."""
        loader, rows = self.loader, self.rows
        transform, dtype, max_pixels = loader.transform, loader.dtype, loader.options.max_pixels
        seed, epoch = loader.seed, self.epoch
        jobs: list[Deferred] = []

        def prepare(task: Task) -> bool:
            done: Callable[[bool], None] | None = None
            if rows is None:
                out = self.slot(task.position)
            else:
                placed, done = self.place(task, state)
                out = placed.array
            try:
                job = prepare_load(
                    task.data or b"",
                    transform,
                    sample_stream(seed, epoch, task.stream),
                    out,
                    dtype=dtype,
                    key=task.key,
                    max_pixels=max_pixels,
                )
                if job is None:
                    self.load(task, out)
                elif job.args[2] * job.args[3] > AT_ONCE_MOST_PIXELS:
                    task.data = None  # `job` holds the bytes until the call ends
                    decode_prepared(job)
                else:
                    jobs.append(Deferred(task, job, done))
                    return True  # decoded after the others
            except BaseException:
                if done is not None:
                    done(False)
                raise
            if done is not None:
                done(True)
            task.data = None
            return False

        return self.each_in_run("decode", run, prepare, later=jobs)

    def each_in_run(
        self,
        stage: str,
        run: list[Task],
        op: Callable[[Task], bool | None],
        later: list[Deferred] | None = None,
        times: Mapping[int, float] | None = None,
    ) -> list[Task]:
        """``op`` on each task of ``run``; the tasks it did not fail on (in run order but
        for those ``op`` put in ``later`` and said so, which `load_prepared` decodes after
        the others, all at once). A deferred sample's time is its own part and an equal
        share of the call; ``times`` gives others' own (position -> seconds)."""
        kept: list[Task] = []
        sizer, clock = self.sizer, time.perf_counter
        limit = self.decode_limit if stage == "decode" else None
        timed = sizer is not None or limit is not None  # straggler mode's per-sample times
        took: list[float] = []
        ordinals, last = self.ordinals[stage], self.last_ordinal
        held: list[tuple[Task, Exception]] = []  # failures after a deferred one (`later`)
        prepared: dict[int, float] = {}  # position -> time of a deferred one's own part
        hand, me = self.in_hand, threading.get_ident()  # `hold`, inline
        lengths = self.lengths
        if lengths is not None:
            run_began, run_cpu = clock(), time.thread_time()
        try:
            for i, task in enumerate(run):
                if self.stopping.is_set():
                    break
                began = clock()
                hand[me] = (task.key, stage, began)
                try:
                    deferred = op(task)
                except Exception as exc:
                    if later:  # recorded after the JPEGs before it, in run order
                        held.append((task, exc))
                        continue
                    last[stage] = ordinal = next(ordinals)
                    self.run_failure(stage, task, exc, ordinal)
                except BaseException:
                    self.abandon([*(d.task for d in later or ()), *(t for t, _ in held), *run[i:]])
                    raise
                else:
                    if deferred:
                        if timed:
                            prepared[task.position] = clock() - began
                        continue
                    last[stage] = next(ordinals)
                    kept.append(task)
                    if timed:
                        own = None if times is None else times.get(task.position)
                        took.append(clock() - began if own is None else own)
            if later and not self.stopping.is_set():  # else dropped, as the rest of the run
                call_began = clock()
                done = [*zip([d.task for d in later], self.decode_later(later), strict=True)]
                share = (clock() - call_began) / len(later)
                # In run order (consecutive positions): with on_error="raise" the first
                # failure recorded is the one named (QA73: a later file's was).
                for task, error in sorted([*done, *held], key=lambda te: te[0].position):
                    task.data = None
                    last[stage] = ordinal = next(ordinals)
                    if error is None:
                        kept.append(task)
                        if timed and task.position in prepared:
                            took.append(prepared[task.position] + share)
                    else:
                        self.run_failure(stage, task, error, ordinal)
        finally:
            hand.pop(me, None)
            if later:
                # A failure kept until the epoch ends holds this frame in its traceback:
                # the jobs' views of the batch tensors must not stay with it (the pool
                # could not reuse those tensors: 51 allocated in 4 epochs against 10), nor
                # in a local of it.
                drop_deferred(later)
            held.clear()
        # Recorded once per run (a lock each): with 16 threads every contended lock costs.
        if sizer is not None:
            sizer.observe(stage, took)
        if isinstance(limit, AdaptiveThreshold):
            limit.observe_many(took)
        elif limit is not None:
            for t in took:
                limit.observe(t)
        if lengths is not None and not self.stopping.is_set():  # a run cut short: not timed
            lengths.observe(stage, clock() - run_began, time.thread_time() - run_cpu, len(run))
        self.run_done(stage, len(run))
        return kept

    def samples_read(self) -> int:
        if self.run_size == 1:
            return 0  # the engine's own calls: no ordinals
        return self.read_before + self.last_ordinal["read"]

    def decode_later(self, later: list[Deferred]) -> list[Exception | None]:
        """`load_prepared` on ``later``'s jobs: per task None or its error, each told to
        its `Deferred.done`. If the call itself fails, every task fails with what it
        raised (a fatal error abandons them, as `each_in_run` abandons the rest of a run)."""
        errors: list[Exception | None]
        try:
            errors = list(load_prepared([d.job for d in later]))
        except Exception as exc:
            what = f"decoding a run of {len(later)} JPEGs failed: {exc!r}"
            errors = [RuntimeError(what) for _ in later]  # one each: each gets its own note
        except BaseException:
            self.abandon([d.task for d in later])
            raise
        for d, error in zip(later, errors, strict=True):
            if d.done is not None:
                d.done(error is None)
        return errors

    def run_done(self, stage: str, samples: int) -> None:
        with self.run_calls_lock:
            self.run_calls[stage] += samples

    def run_failure(self, stage: str, task: Task, exc: Exception, calls: int) -> None:
        """A sample of a run failed, the ``calls``-th its stage finished: recorded as the
        engine records a failed call (note, record, ``max_failures`` per stage over the
        samples it has finished), then the resume record and the batcher are told, in
        `note_failure`'s order."""
        add_note(exc, f"stage: {stage}, sample: {task.key}")
        self.remember_failure(task.position, failed_stage(stage, exc))
        record = FailureRecord(stage=stage, key=task.key, error=exc)
        error = self.run_policies[stage].record(record, calls=calls)
        if error is None:
            release_locals(exc)  # kept until the epoch ends: not with the sample's bytes
        elif self.run_error is None:
            self.run_error = error  # raised by the training loop's next `next_batch`
        # Last: once the batcher knows, the batch can go without the sample, and with
        # on_error="raise" the training loop must find `run_error` set by then.
        self.failed_positions.append(task.position)

    def abandon(self, tasks: Sequence[Task]) -> None:
        """A run cut short by a fatal error: free its samples' places in the window (not
        recorded as failed: a resume runs them again)."""
        self.failed_positions.extend(task.position for task in tasks)

    def check_runs(self, *, final: bool = False) -> None:
        """Raise a run failure past ``max_failures``; at the end, check the rates too."""
        if self.run_error is not None:
            raise self.run_error
        if final and self.run_size > 1:
            with self.run_calls_lock:
                calls = dict(self.run_calls)
            for stage, policy in self.run_policies.items():
                if (error := policy.check_final(calls[stage])) is not None:
                    raise error

    def forget(self, position: int) -> None:
        if self.rows is not None:
            self.rows.failed(position)

    def new_batch(self, rows: int, most: int | None = None) -> torch.Tensor:
        """A batch tensor of ``rows`` rows; from the pool, where one of up to ``most``
        rows may serve (`BatchPool.take`)."""
        import torch

        if self.pool is not None:
            return self.pool.take(rows, most=most)
        shape = (rows, 3, self.out_h, self.out_w)
        return torch.empty(shape, dtype=self.torch_dtype, device="cpu", pin_memory=self.pin)

    def new_sample(self) -> torch.Tensor:
        import torch

        return torch.empty((3, self.out_h, self.out_w), dtype=self.torch_dtype, device="cpu")

    def recycle(self, images: torch.Tensor) -> None:
        """A batch tensor that was never handed out goes back to the pool."""
        if self.pool is not None:
            self.pool.hand_out(images)  # the view is dropped at once: reclaimed on next take

    def slot(self, position: int) -> np.ndarray:
        """Ordered mode: this sample's row of its nominal batch's tensor, as numpy."""
        plan = self.batcher.plan
        b = position // plan.batch_size
        with self.buffers_lock:
            entry = self.buffers.get(b)
            if entry is None:
                tensor = self.new_batch(len(plan.batch_range(b)))
                entry = self.buffers[b] = (tensor, as_numpy(tensor))
        row: np.ndarray = entry[1][position - b * plan.batch_size]
        return row

    # -- forming (the batcher thread) -----------------------------------------------------
    @contextlib.contextmanager
    def running(self) -> Iterator[None]:
        self.pipeline.start()
        try:
            # Idle ticks: a failure noted after the last completion must still reach the
            # batcher, or a window full of samples waiting for it would never move.
            stream = self.pipeline.iterate(idle_s=IDLE_TICK_S)
            if self.run_size > 1:
                stream = _each_task(stream)
            self.former = threading.Thread(
                target=self.form, args=(stream,), name="gpu_loader-batcher", daemon=True
            )
            self.former.start()
            yield
        finally:  # joined for as long as `join_s` allows
            self.pipeline.close(self.join_s)

    def form(self, stream: Iterator[Any]) -> None:
        """The batcher thread: feed completions to the batcher, assemble what it emits.

        Draining the pipeline here, not in the training loop's thread, lets the read and
        decode stages run ahead by the whole in-flight window while the training step
        runs (a sink drained only between steps holds them to its own capacity), and
        keeps batch assembly (straggler mode: a copy of every sample) off the training
        loop's time. Formed batches stay in the window until the training loop takes
        them, so the window still bounds memory, and the batcher always has `window`
        minus the formed batches to work with.
        """
        try:
            feed = self.feed_batcher(stream, _output, self.pop_batch, self.arrived)
            for batch in feed:
                self.formed.put((batch.index, self.assemble(batch)))
            if not self.stopping.is_set():  # a stopped epoch gets no tail and no end marker
                self.formed.put(None)
        except BaseException as exc:  # crosses to the training loop, traceback intact
            self.formed.put(exc)

    def pop_batch(self) -> Batch[Any] | None:
        """The batcher's next batch. Straggler mode moves samples only when the training
        loop has nothing queued (while it has, waiting for a straggler costs it nothing,
        and an unmoved batch is built without copies), and not a sample in a row of its
        batch's tensor unless it (or, in a run, its run's current decode) is a straggler
        by the slow lane's rule for one decode (`StragglerRows.hold_back`)."""
        moves = self.formed.empty()
        if not moves or self.rows is None:
            return self.batcher.pop(moves=moves)
        rows, limit = self.rows, self.decode_limit

        def hold_back() -> list[int]:  # asked only when a batch could go (`pop`)
            # `decode_limit` is an AdaptiveThreshold, which is thread-safe: it may be asked
            # from this thread too, not only under the decode stage's lock.
            return rows.hold_back(limit.limit() if limit is not None else None)

        return self.batcher.pop(wait_for=hold_back)

    def batching_stats(self) -> BatcherStats:
        stats = self.batcher.stats()
        rows = self.rows
        if rows is None:
            return stats
        return dataclasses.replace(
            stats,
            rows_copied=rows.copied_rows,
            batches_copied=rows.fresh,
            large_private=rows.private_large,
        )

    def arrived(self, task: Task) -> None:
        """``task``'s output is with the batcher. Told only after the push: in between,
        a pop from the training loop's thread (`take_formed`) would find the sample
        neither ready nor held back (`StragglerRows.hold_back`), and could cut a batch
        that skips it, copied whole since its slab could not host it."""
        if self.rows is not None:
            self.rows.arrived(task.position)

    # -- consuming (the training loop's thread) -----------------------------------------
    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor, Sequence[int]] | None:
        item = self.take_formed()
        if item is None:
            self.check_runs(final=True)
            return None
        if isinstance(item, BaseException):
            raise item
        self.check_runs()
        images, labels, positions = item
        device = self.loader.device
        if device.type != "cpu":
            images = images.to(device, non_blocking=True)
            labels = labels.to(device, non_blocking=True)
        return images, labels, positions

    def take_formed(self) -> Formed | BaseException | None:
        """The next formed batch, in emission order; forms one here if the batcher thread
        is waiting on the pipeline while a batch could be emitted by moving stragglers (it
        decided to wait when the queue was not yet empty, and no completion has woken it
        since).

        Both threads form batches, so one formed here can overtake the batch the batcher
        thread is still assembling: it waits in `early` for its turn (delivering it first
        broke the lateness bound by up to 3 batches in a QA run).
        """
        formed = self.formed
        while True:
            if (ready := self.early.pop(self.next_index, None)) is not None:
                self.next_index += 1
                return ready
            item = _get(formed, None)
            if item is _EMPTY:
                # One batch formed here at a time: with one already waiting its turn, the
                # batch before it is being assembled and needs no more moved samples.
                if not self.early and self.rows is not None and (b := self.pop_batch()) is not None:
                    self.early[b.index] = self.assemble(b)
                    continue
                # Waited outside any `except` block: a Ctrl-C here is a plain
                # KeyboardInterrupt, not one chained to a queue.Empty.
                item = _get(formed, 0.005)
                if item is _EMPTY:
                    self.check_wait()
                    if self.former is None or not self.former.is_alive():
                        if not formed.empty():
                            continue
                        raise RuntimeError("the batcher thread ended without a result")
                    continue
            assert not isinstance(item, _Empty)
            if item is None or isinstance(item, BaseException):
                if item is None and self.early:  # the end, yet a batch before these is missing
                    raise RuntimeError(
                        f"batch {self.next_index} of the epoch was never formed "
                        f"(formed: {sorted(self.early)})"
                    )
                return item
            index, batch_formed = item
            self.early[index] = batch_formed

    def assemble(self, batch: Batch[Any]) -> Formed:
        """The batch's images as one tensor (in the batcher thread), with its labels."""
        import torch

        positions: Sequence[int] = batch.positions
        # Copies go through numpy: torch's intra-op thread pool would spin on the cores
        # the decode threads are using (measured: 8-40x slower under load).
        if self.rows is not None:
            images, positions = self.rows.assemble(positions, batch.items)
        else:
            plan = self.batcher.plan
            b = positions[0] // plan.batch_size
            # Batches come in nominal order; a nominal batch split in parts to keep the
            # batch count (`OrderedBatcher`) is read by each part and freed by the next.
            with self.buffers_lock:
                # Earlier nominal tensors, whose rows were copied out (a batch with a
                # failed sample, or the parts of one): back to the pool, not dropped
                # (QA62: a new tensor for every batch with a bad file, every epoch).
                spent = [self.buffers.pop(k)[0] for k in [k for k in self.buffers if k < b]]
                images, _ = self.buffers[b]
                if len(positions) == images.shape[0]:  # the whole batch: handed out
                    del self.buffers[b]
            for tensor in spent:
                self.recycle(tensor)
            if len(positions) != images.shape[0]:  # failed samples left out, or a part
                keep = [p - b * plan.batch_size for p in positions]
                compact = self.new_batch(len(keep), most=plan.batch_size)
                # mode="clip": the rows are in range, and the default "raise" copies
                # through a buffer (QA69: 27 against 8 ms a 64 x 224 px batch, here
                # with a thread spinning; every batch with a bad file pays it).
                np.take(as_numpy(images), keep, axis=0, out=as_numpy(compact), mode="clip")
                images = compact
        labels = torch.from_numpy(self.labels[self.indices[list(positions)]])
        if self.pool is not None:
            # The view is made here, not in the training loop's next(): a torch call
            # lets go of the GIL, and taking it back while decode threads run Python
            # took 0.19-0.24 ms a batch on average there (2 decode threads, 2 cores).
            images = self.pool.hand_out(images)
        return images, labels, positions

    # -- failures and shutdown -------------------------------------------------------------
    def stage_failures(self) -> list[FailedSample]:
        return [as_failed(r, self.epoch) for r in self.failure_records()]

    def failure_records(self) -> list[FailureRecord]:
        records = self.pipeline.failures()
        for policy in self.run_policies.values():
            records += policy.records()
        return records

    def failure_errors(self) -> list[Exception]:
        return [r.error for r in self.failure_records() if isinstance(r.error, Exception)]

    def engine_stats(self) -> Any:
        stats = self.pipeline.stats()
        if self.run_size == 1:
            return stats
        # A run's failed samples are recorded here, not by the engine.
        policies = self.run_policies
        stages = tuple(
            dataclasses.replace(s, failures=s.failures + policies[s.name].failures())
            if s.name in policies
            else s
            for s in stats.stages
        )
        return dataclasses.replace(stats, stages=stages)

    def shutdown(self) -> None:
        self.pipeline.close(self.join_s)
        if self.former is not None:
            # The pipeline is closed, so its stream ends and the thread returns at once.
            join_started(self.former)

    def threads(self) -> list[threading.Thread]:
        former = [self.former] if self.former is not None and self.former.is_alive() else []
        return self.pipeline.threads + former


class _Empty:
    """`_get`'s answer when nothing came."""


_EMPTY = _Empty()


def _get(q: queue.SimpleQueue[Any], timeout: float | None) -> Any:
    """``q``'s next item, or `_EMPTY`: without waiting (``timeout`` None) or after
    ``timeout`` seconds."""
    try:
        return q.get_nowait() if timeout is None else q.get(timeout=timeout)
    except queue.Empty:
        return _EMPTY


Formed = tuple["torch.Tensor", "torch.Tensor", Sequence[int]]
"""A batch ready for the training loop: images, labels, epoch positions."""


def failed_stage(stage: str, error: BaseException) -> str:
    """The stage a sample that raised ``error`` in ``stage`` is listed under: "augment"
    where the user's augment function raised it (inside the decode stage)."""
    return "augment" if raised_by_augment(error) else stage


def as_failed(record: FailureRecord, epoch: int) -> FailedSample:
    stage = failed_stage(record.stage, record.error)
    return FailedSample(key=record.key, stage=stage, error=str(record), epoch=epoch)


_STAGE_NOTE = re.compile(r"stage: (?P<stage>[^,]+), sample: (?P<key>.*)", re.DOTALL)


def noted_failure(exc: BaseException, epoch: int) -> FailedSample | None:
    """The failed sample `as_failed` makes of ``exc``, its stage and key read from the first
    note a stage put on it (an error instance shared by several samples has one per
    sample); None where it has none."""
    for note in getattr(exc, "__notes__", None) or []:
        if isinstance(note, str) and (found := _STAGE_NOTE.fullmatch(note)):
            record = FailureRecord(stage=found["stage"], key=found["key"], error=exc)
            return as_failed(record, epoch)
    return None
