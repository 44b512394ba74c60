"""A CPU stand-in for a CUDA device: deferred streams, events, a stream-aware caching allocator.

It exists so the GPU orchestration runs in the CPU suite AND its ordering mistakes show up
there. Work enqueued on a :class:`StandinStream` does not run when it is enqueued: it
runs, in order, only when something waits for it (``event.synchronize()``, a stream that
waited on an event, ``stream.synchronize()``), the way a busy GPU runs work later. So a
consumer that reads a batch without waiting on its event sees the kernel still pending.

Memory is a set of :class:`Block`-s. Every enqueued op declares the blocks it reads and
writes; the runtime records each use as (stream, sequence number) and checks invariant 6
of the design, recording a line in :attr:`StandinRuntime.violations` for each breach:

- a read of a block whose writer has not run yet (the consumer read before the event);
- an output block handed out again (the allocator's decision, from ``record_stream``
  as torch's caching allocator makes it) while another stream's use of it is pending;
- a decoded image freed by its holder while an op that reads it is pending;
- the page-locked source of an upload changed before the copy ran (an arena slice
  given back too early). Uploads from pageable memory copy it at once, as torch's
  ``pin_memory()`` staging does.

Blocks stay allocated while a use is pending even after a breach, so a breach is
reported, never a crash. The emulated kernels run in whichever thread flushes a stream.
"""

from __future__ import annotations

import collections
import itertools
import threading
import weakref
import zlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

import numpy as np

from gpu_loader.cuda._launch import ITEM_SIZES, OutputDtype
from gpu_loader.cuda._ports import DeviceImage, Event

if TYPE_CHECKING:
    import torch

BlockKind = Literal["output", "upload", "labels", "decoded"]
_POISON = 0xFF  # NaN in float32/16 and bfloat16, 255 in uint8: an unwritten output is obvious


class StandinStream:
    """An in-order queue of deferred host callables (a CUDA stream's stand-in)."""

    def __init__(self, runtime: StandinRuntime, name: str) -> None:
        self.runtime = runtime
        self.name = name
        self.cuda_stream = 0  # read by decoders that pass a stream handle along
        self._lock = threading.RLock()
        # Held while ops run, so they run one at a time and in order; `_lock` is not held
        # then, or a worker enqueueing under the runtime's lock and a consumer running this
        # stream's ops (which take the runtime's lock) would deadlock.
        self._run_lock = threading.RLock()
        self._ops: collections.deque[tuple[int, Callable[[], None]]] = collections.deque()
        self._enqueued = 0
        self._done = 0
        # For each other stream, the latest position this stream waited for (an event):
        # the happens-before the read checks use, independent of when ops happen to run.
        self.waited: dict[StandinStream, int] = {}

    def __repr__(self) -> str:
        return f"StandinStream({self.name!r}, done {self._done}/{self._enqueued})"

    def enqueue(self, op: Callable[[], None]) -> int:
        """Append ``op``; returns its sequence number."""
        with self._lock:
            self._enqueued += 1
            self._ops.append((self._enqueued, op))
            return self._enqueued

    @property
    def position(self) -> int:
        """The sequence number of the last op enqueued (0: none)."""
        return self._enqueued

    def finished(self, seq: int) -> bool:
        return self._done >= seq

    def run_until(self, seq: int) -> None:
        """Run pending ops up to and including ``seq``, in order, in the calling thread."""
        with self._run_lock:
            while True:
                with self._lock:
                    if not self._ops or self._ops[0][0] > seq:
                        return
                    number, op = self._ops.popleft()
                op()
                with self._lock:
                    self._done = number

    def synchronize(self) -> None:
        self.run_until(self._enqueued)

    def wait_event(self, event: StandinEvent) -> None:
        """Later ops on this stream run only after ``event`` (``cudaStreamWaitEvent``)."""
        with self._lock:
            self.waited[event.stream] = max(self.waited.get(event.stream, 0), event.seq)
            self.enqueue(event.synchronize)

    def ordered_after(self, stream: StandinStream, seq: int) -> bool:
        """Is op ``seq`` of ``stream`` ordered before what this stream enqueues next?"""
        return stream is self or self.waited.get(stream, 0) >= seq


@dataclass(frozen=True)
class StandinEvent:
    """A position in a stand-in stream."""

    stream: StandinStream
    seq: int

    def query(self) -> bool:
        return self.stream.finished(self.seq)

    def synchronize(self) -> None:
        self.stream.run_until(self.seq)


@dataclass(eq=False)
class Block:
    """A piece of stand-in device memory and its bookkeeping."""

    backing: np.ndarray = field(repr=False)
    kind: BlockKind
    stream: StandinStream | None
    """The allocation stream (None for memory the decoder owns)."""
    id: int = 0
    in_use: bool = True
    stream_uses: set[StandinStream] = field(default_factory=set)
    """Streams named by ``record_stream`` since the allocation (the allocator's knowledge)."""
    free_events: list[StandinEvent] = field(default_factory=list)
    """Events installed at free on each recorded stream; reuse waits for them."""
    uses: list[tuple[StandinStream, int]] = field(default_factory=list)
    """Every op that touched the block: the truth the checks compare against."""
    pending_writes: int = 0
    writes: list[tuple[StandinStream, int]] = field(default_factory=list)
    """The ops that wrote the block since its allocation."""

    @property
    def ptr(self) -> int:
        return int(self.backing.ctypes.data)

    @property
    def nbytes(self) -> int:
        return int(self.backing.nbytes)

    def pending_uses(self, other_than: StandinStream | None = None) -> list[StandinStream]:
        return [s for s, seq in self.uses if s is not other_than and not s.finished(seq)]


class StandinRuntime:
    """The ``DeviceRuntime`` port on the CPU, with the bookkeeping the tests inspect."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._ids = itertools.count(1)
        self._streams = itertools.count(0)
        self._blocks: list[Block] = []
        self._local = threading.local()
        self.default_stream = self.new_stream("default")
        self.violations: list[str] = []
        self.allocations = 0
        self.reuses = 0
        self._pinned: list[tuple[int, int, np.ndarray]] = []

    # -- DeviceRuntime -----------------------------------------------------------------
    @property
    def device(self) -> torch.device:
        import torch

        return torch.device("cpu")

    def new_stream(self, name: str | None = None) -> StandinStream:
        return StandinStream(self, name or f"worker-{next(self._streams)}")

    def record_event(self, stream: StandinStream) -> StandinEvent:
        return StandinEvent(stream, stream.position)

    def empty_output(
        self, shape: tuple[int, ...], dtype: OutputDtype, stream: StandinStream
    ) -> torch.Tensor:
        import torch

        nbytes = int(np.prod(shape)) * ITEM_SIZES[dtype]
        view, _ = self._allocate(nbytes, "output", stream)
        return self._tensor(view, getattr(torch, dtype), shape)

    def upload_image(self, array: np.ndarray, stream: StandinStream) -> DeviceImage:
        import torch

        h, w = int(array.shape[0]), int(array.shape[1])
        view, block = self._allocate(h * w * 3, "upload", stream)
        tensor = self._tensor(view, torch.uint8, (h, w, 3))
        if self.is_pinned(array) and array.flags.c_contiguous and array.dtype == np.uint8:
            self._copy_in_pinned(stream, block, array)  # read when the copy runs, as CUDA does
        else:  # pageable: staged through a copy the op keeps, as torch's pin_memory() does
            self._copy_in(stream, block, np.array(array, dtype=np.uint8, order="C", copy=True))
        return DeviceImage(view.ctypes.data, h, w, 3 * w, owner=tensor)

    def upload_labels(self, labels: np.ndarray, stream: StandinStream) -> torch.Tensor:
        import torch

        host = np.ascontiguousarray(labels, dtype=np.int64)
        view, block = self._allocate(host.nbytes, "labels", stream)
        tensor = self._tensor(view, torch.int64, host.shape)
        self._copy_in(stream, block, host)
        return tensor

    def handoff(self, tensors: Sequence[torch.Tensor], event: Event) -> None:
        if not isinstance(event, StandinEvent):
            raise TypeError(f"the stand-in runtime needs its own events, got {event!r}")
        current = self.current_stream()
        current.wait_event(event)
        for tensor in tensors:
            if tensor.numel():
                self.record_stream(tensor, current)

    def alloc_pinned(self, nbytes: int) -> np.ndarray:
        buf = np.empty(nbytes, dtype=np.uint8)
        with self._lock:
            self._pinned.append((buf.ctypes.data, nbytes, buf))
        return buf

    def is_pinned(self, array: np.ndarray) -> bool:
        """True when ``array`` lies in memory from :meth:`alloc_pinned` (``is_pinned()``)."""
        start = array.ctypes.data
        with self._lock:
            return any(base <= start < base + size for base, size, _ in self._pinned)

    # -- what torch does on CUDA, for the tests ------------------------------------------
    def current_stream(self) -> StandinStream:
        """The calling thread's current stream (``torch.cuda.current_stream()``)."""
        stream: StandinStream | None = getattr(self._local, "stream", None)
        return stream or self.default_stream

    def set_current_stream(self, stream: StandinStream | None) -> None:
        self._local.stream = stream

    def record_stream(self, tensor: torch.Tensor, stream: StandinStream) -> None:
        """``tensor.record_stream(stream)``: the allocator learns another stream uses it."""
        block = self.lookup(tensor.data_ptr())
        with self._lock:
            if stream is not block.stream:
                block.stream_uses.add(stream)

    def consume(self, tensor: torch.Tensor, op: Callable[[torch.Tensor], None]) -> None:
        """A training-loop kernel: ``op(x)`` enqueued on the current stream, where ``x`` is
        ``tensor``'s memory as it is when the op runs. Like a real kernel launch, the
        queued op does not keep ``tensor`` alive: the caller may drop it at once."""
        import torch

        block = self.lookup(tensor.data_ptr())
        start = tensor.data_ptr() - block.ptr
        nbytes = tensor.numel() * tensor.element_size()
        dtype, shape, backing = tensor.dtype, tuple(tensor.shape), block.backing

        def run() -> None:
            raw = torch.from_numpy(backing[start : start + nbytes])
            op(raw.view(dtype).reshape(shape))

        self.enqueue(self.current_stream(), run, reads=[tensor.data_ptr()])

    def to_host(self, tensor: torch.Tensor) -> torch.Tensor:
        """``tensor.cpu()``: synchronises the current stream only, then copies."""
        current = self.current_stream()
        current.synchronize()
        block = self.lookup(tensor.data_ptr())
        unordered = [w for w, seq in block.writes if not current.ordered_after(w, seq)]
        if block.pending_writes or unordered:
            self._violate(
                f"host read of a {block.kind} block written on {[w.name for w in unordered]} "
                f"without {current.name} waiting for the writer's event"
            )
        return tensor.clone()

    def enqueue(
        self,
        stream: StandinStream,
        op: Callable[[], None],
        *,
        reads: Iterable[int | np.ndarray] = (),
        writes: Iterable[int | np.ndarray] = (),
    ) -> int:
        """Enqueue ``op`` on ``stream``, recording the blocks it reads and writes (by address)."""
        read_blocks = [self._block_of(x) for x in reads]
        write_blocks = [self._block_of(x) for x in writes]

        def run() -> None:
            for block in read_blocks:
                if block.pending_writes:
                    self._violate(f"{stream.name} read a {block.kind} block before its writer ran")
            op()
            with self._lock:
                for block in write_blocks:
                    block.pending_writes -= 1

        with self._lock:
            for block in read_blocks:
                for writer, wseq in block.writes:
                    if not stream.ordered_after(writer, wseq):
                        self._violate(
                            f"{stream.name} reads a {block.kind} block written on {writer.name} "
                            "without waiting for the writer's event"
                        )
            seq = stream.enqueue(run)
            for block in (*read_blocks, *write_blocks):
                block.uses.append((stream, seq))
            for block in write_blocks:
                block.pending_writes += 1
                block.writes.append((stream, seq))
        return seq

    def register_external(self, array: np.ndarray, token: object) -> None:
        """Track memory another library owns (a decoded image) until ``token`` is dropped."""
        self._collect()  # keeps the block list short over long runs
        with self._lock:
            block = Block(array, "decoded", None, id=next(self._ids))
            self._blocks.append(block)
        weakref.finalize(token, self._external_freed, block)

    def lookup(self, ptr: int) -> Block:
        with self._lock:
            for block in reversed(self._blocks):
                if block.ptr <= ptr < block.ptr + max(block.nbytes, 1):
                    return block
        raise ValueError(f"address {ptr:#x} is not stand-in device memory")

    def synchronize(self) -> None:
        """Run every stream's pending work (``torch.cuda.synchronize()``)."""
        with self._lock:
            streams = {s for b in self._blocks for s, _ in b.uses} | {self.default_stream}
        for stream in streams:
            stream.synchronize()
        self._collect()

    def stats(self) -> dict[str, int]:
        with self._lock:
            return {
                "blocks": len(self._blocks),
                "live": sum(b.in_use for b in self._blocks),
                "allocations": self.allocations,
                "reuses": self.reuses,
            }

    # -- internals -----------------------------------------------------------------------
    def _violate(self, message: str) -> None:
        with self._lock:
            self.violations.append(message)

    def _block_of(self, x: int | np.ndarray) -> Block:
        return self.lookup(x if isinstance(x, int) else int(x.ctypes.data))

    def _tensor(self, view: np.ndarray, dtype: torch.dtype, shape: Sequence[int]) -> torch.Tensor:
        import torch

        # torch.from_numpy keeps `view` alive exactly as long as the storage: its
        # finalizer is the stand-in's "free" (the caching allocator's free).
        return torch.from_numpy(view).view(dtype).reshape(tuple(shape))

    def _allocate(
        self, nbytes: int, kind: BlockKind, stream: StandinStream
    ) -> tuple[np.ndarray, Block]:
        """A view of exactly ``nbytes`` whose finalizer is this allocation's free."""
        size = max(nbytes, 1)
        with self._lock:
            block = self._reusable(size, kind, stream)
            if block is None:
                block = Block(np.empty(size, np.uint8), kind, stream, id=next(self._ids))
                self._blocks.append(block)
                self.allocations += 1
            else:
                self.reuses += 1
                busy = block.pending_uses(other_than=stream)
                if busy:
                    names = sorted({s.name for s in busy})
                    self._violate(
                        f"{kind} block reused on {stream.name} while {names} may still use it "
                        "(missing record_stream?)"
                    )
            block.in_use = True
            block.stream_uses = set()
            block.free_events = []
            block.writes = []
            block.uses = [(s, q) for s, q in block.uses if not s.finished(q)]
            backing = block.backing
            # Poisoned in stream order, so earlier ops of this stream still see the old bytes.
            stream.enqueue(lambda: backing.fill(_POISON))
            # A new object per allocation (never sliced again: a slice of it would be a
            # view of `backing`, and this object, with its finalizer, would die at once).
            view = backing[:nbytes]
        weakref.finalize(view, self._freed, block)
        return view, block

    def _copy_in(self, stream: StandinStream, block: Block, host: np.ndarray) -> None:
        """An asynchronous host-to-device copy into ``block`` (the op holds the block, not
        the tensor, as a CUDA copy does)."""
        flat = host.reshape(-1).view(np.uint8)
        backing = block.backing
        self.enqueue(
            stream, lambda: backing[: flat.size].__setitem__(slice(None), flat), writes=[backing]
        )

    def _copy_in_pinned(self, stream: StandinStream, block: Block, host: np.ndarray) -> None:
        """An asynchronous copy from page-locked ``host``: CUDA reads it when the copy runs,
        so a source changed before then (an arena slice released early) is a violation."""
        flat = host.reshape(-1)
        crc = zlib.crc32(flat.data)
        backing = block.backing

        def copy() -> None:
            if zlib.crc32(flat.data) != crc:
                self._violate(
                    f"the source of an upload on {stream.name} changed before the copy ran "
                    "(its pinned arena slice was released too early)"
                )
            backing[: flat.size] = flat

        self.enqueue(stream, copy, writes=[backing])

    def _reusable(self, nbytes: int, kind: BlockKind, stream: StandinStream) -> Block | None:
        # torch's rule: same stream, free, and every event installed at free has fired.
        for block in self._blocks:
            if (
                not block.in_use
                and block.kind == kind
                and block.stream is stream
                and block.nbytes == nbytes
                and all(e.query() for e in block.free_events)
            ):
                return block
        return None

    def _freed(self, block: Block) -> None:
        with self._lock:
            block.in_use = False
            block.free_events = [self.record_event(s) for s in block.stream_uses]

    def _external_freed(self, block: Block) -> None:
        with self._lock:
            block.in_use = False
            if block.pending_uses():
                self._violate("a decoded image was freed while an op reading it was pending")

    def _collect(self) -> None:
        """Forget decoder-owned blocks that are free and have no pending use."""
        with self._lock:
            self._blocks = [
                b for b in self._blocks if b.in_use or b.kind != "decoded" or b.pending_uses()
            ]
