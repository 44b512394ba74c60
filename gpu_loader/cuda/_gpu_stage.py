"""The GPU batch stage: fetched bytes -> batch decode -> fused kernel -> tensors + event.

Two engine ops and a consumer-side call:

- :class:`GpuFetcher` (the fetch stage, I/O threads): reads a sample's bytes straight into
  a slice of the pinned arena, reads the JPEG header (``probe_size``, EXIF-oriented unless
  the transform has ``exif_orientation=False``) and
  draws the crop parameters there, on the CPU, from ``sample_stream(seed, epoch, index)``
  (``sample_rng``'s stream).
  Input that is not a JPEG (PNG, WebP, ...) is decoded right there on the CPU: the
  GPU decoders do not take it, and one PNG decoded in a GPU worker held its whole batch
  (measured on an H100: 23 of 36 ms per 64-image batch with 2% PNGs). Its pixels are
  copied into a separate pinned pixel arena when it has room, so their upload is
  asynchronous.
- :class:`GpuBatchStage` (one engine ``pipe`` with ``worker_init``): each worker thread
  owns one stream and one decoder, made once in :meth:`GpuBatchStage.worker_init`.
  Per batch: decode all JPEGs in one call on the stream, upload the images the fetch
  stage decoded, decode on the CPU (``gpu_loader.ops.decode``) and upload the JPEGs
  nvImageCodec could not decode, allocate the output from torch's caching
  allocator on the stream, launch the fused kernel, record the batch's event.
- :func:`handoff` (the consumer's thread): its current stream waits on the event and
  ``record_stream`` marks the tensors, then they are returned.

Ordering, per batch (see docs/gpu.md): the arena slices are released after the worker
thread has SYNCHRONISED an event recorded right after the decode and the uploads (the
kernel is enqueued first, so the device stays busy meanwhile); the decoded images and
uploads stay referenced by the worker until the batch's event has fired (checked with
``query()`` before each later batch, and waited for when the worker's state is dropped).
"""

from __future__ import annotations

import collections
import inspect
import logging
import threading
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from gpu_loader.cuda._arena import ArenaFullError, PinnedArena, Slice
from gpu_loader.cuda._launch import OUTPUT_DTYPES, OutputDtype
from gpu_loader.cuda._ports import BatchDecoder, DeviceImage, DeviceRuntime, Event, KernelLauncher
from gpu_loader.ops import (
    DEFAULT_MAX_PIXELS,
    CropParams,
    DecodedImage,
    decode,
    probe_size,
)
from gpu_loader.ops._decode import _check_pixels
from gpu_loader.ops._jpeg_check import check_jpeg_data
from gpu_loader.ops._transforms import Random
from gpu_loader.pipeline._errors import add_note, release_locals
from gpu_loader.sources import sample_stream

if TYPE_CHECKING:
    import torch

    from gpu_loader.ops import EvalTransform, TrainTransform
    from gpu_loader.sources import SampleIndex

Failure = tuple[int, str, BaseException]


_log = logging.getLogger("gpu_loader.cuda")

ARENA_OVERFLOW_S = 1.0
"""How long the loader's fetches wait for arena room before reading outside it."""


@dataclass(frozen=True)
class GpuPorts:
    """What the stage runs on: a runtime, a kernel launcher, and a decoder per worker thread."""

    runtime: DeviceRuntime
    launcher: KernelLauncher
    make_decoder: Callable[[], BatchDecoder]
    """Called once in each worker thread (decoders are never shared between threads)."""


@dataclass(eq=False)
class FetchedSample:
    """One sample's bytes in the arena, with what the CPU knows before decoding."""

    position: int
    """Position in the epoch's order (what the batcher tracks)."""
    index: int
    """Index into the source (labels, random stream)."""
    key: str
    """The sample's key, for error messages."""
    data: memoryview
    """The encoded bytes: a view into ``slice`` (no copy); empty once ``host`` is set."""
    slice: Slice | None = field(default=None, repr=False)
    """The arena slice to release once the device has read it: the encoded bytes, or
    ``host``'s pixels when they were staged there (None: not from an arena)."""
    params: CropParams | None = None
    """Crop box and flip, drawn on the header size (JPEG) or the decoded size."""
    size: tuple[int, int] | None = None
    """(height, width) from the JPEG header, after EXIF orientation unless the transform
    has ``exif_orientation=False``; None for non-JPEG."""
    rng: Random | None = field(default=None, repr=False)
    """The sample's random stream, still unused when ``params`` is None."""
    host: DecodedImage | None = field(default=None, repr=False)
    """The pixels, decoded on the CPU at fetch (non-JPEG input); None for a JPEG."""

    def release(self) -> None:
        """Give the arena slice back (idempotent)."""
        if self.slice is not None and not self.slice.released:
            self.slice.release()


class _Task(Protocol):
    position: int
    index: int
    key: str


class GpuFetcher:
    """The fetch op of the GPU path: bytes into the pinned arena, header, crop parameters.

    A non-JPEG sample (no header size) is decoded here, on the CPU, and gets its
    parameters from the decoded size and the same generator, exactly as the CPU path
    (``ops.load_into``) does; its encoded bytes go back to the arena at once, and its
    pixels take a slice of ``pixel_arena`` when it has room (see ``_stage_pixels``).
    With ``overflow_after_s`` set (the loader's: `ARENA_OVERFLOW_S`), a fetch that finds
    no room for that long reads outside the arena instead of waiting on (``timeout`` is
    then unused; see ``_read``).
    ``pixel_arena`` must not be ``arena``: pixels held by an incomplete batch must
    never take the room its remaining fetches need.
    """

    def __init__(
        self,
        source: SampleIndex,
        arena: PinnedArena,
        transform: TrainTransform | EvalTransform,
        *,
        seed: int,
        epoch: int,
        max_pixels: int = DEFAULT_MAX_PIXELS,
        stop_event: threading.Event | None = None,
        timeout: float | None = None,
        pixel_arena: PinnedArena | None = None,
        overflow_after_s: float | None = None,
    ) -> None:
        if pixel_arena is not None and pixel_arena is arena:
            raise ValueError(
                "`pixel_arena` must be a separate PinnedArena: staged pixels in the fetch "
                "arena can take the room a batch's remaining fetches need (a deadlock)"
            )
        self.source = source
        self.arena = arena
        self.pixel_arena = pixel_arena
        self.transform = transform
        self.seed = seed
        self.epoch = epoch
        self.max_pixels = max_pixels
        self.stop_event = stop_event
        self.timeout = timeout
        self.overflow_after_s = overflow_after_s
        self.overflows = 0
        """Samples read outside the arena because it had no room (see `_read`)."""
        self._overflow_lock = threading.Lock()

    def __call__(self, task: _Task) -> FetchedSample:
        # `stream` (the loader's tasks have it, see `Task.stream`): else the index's own.
        return self.fetch(task.position, task.index, task.key, getattr(task, "stream", None))

    def fetch(
        self, position: int, index: int, key: str | None = None, stream: int | None = None
    ) -> FetchedSample:
        """``stream``: which random stream draws the crop (`Task.stream`); None: ``index``."""
        key = self.source.key(index) if key is None else key
        piece, data = self._read(index, key)
        try:
            exif = self.transform.exif_orientation
            size = probe_size(data, key=key, exif=exif)
            rng = sample_stream(self.seed, self.epoch, index if stream is None else stream)
            if size is not None:
                _check_pixels(key, size[0], size[1], self.max_pixels)
                check_jpeg_data(data, key=key)
                params = self.transform.make_params(size[0], size[1], rng)
                return FetchedSample(position, index, key, data, piece, params, size, rng)
            host = decode(data, key=key, max_pixels=self.max_pixels, exif=exif)
        except BaseException:
            if piece is not None:
                piece.release()
            raise
        if piece is not None:
            piece.release()  # decoded: the bytes are no longer needed
        params = self.transform.make_params(host.height, host.width, rng)
        pixels, host = self._stage_pixels(host, key)
        return FetchedSample(position, index, key, memoryview(b""), pixels, params, None, rng, host)

    def _read(self, index: int, key: str) -> tuple[Slice | None, memoryview]:
        """The sample's bytes in the arena, or outside it after ``overflow_after_s``.

        A batch being gathered holds its samples' slices, and the free room can be split
        between them: a tight arena can leave no hole large enough for the batch's last
        fetch, which would then wait forever (the threaded stage test hung that way about
        once in 30 runs). After ``overflow_after_s`` without room the sample is read into
        ordinary memory instead: its upload is slower, and the in-flight window still
        bounds how many samples are out. ``overflows`` counts them.
        """
        overflow = self.overflow_after_s
        wait = self.timeout if overflow is None else overflow
        try:
            return self.arena.fetch(
                self.source, index, key=key, timeout=wait, stop_event=self.stop_event
            )
        except ArenaFullError:
            if overflow is None:
                raise
            with self._overflow_lock:
                self.overflows += 1
                first, self.arena.overflow_warned = not self.arena.overflow_warned, True
            if first:
                _log.warning(
                    "no room in the %d-byte pinned arena for %.1f s: reading %r and any "
                    "later such sample into ordinary memory (slower uploads); a larger "
                    "LoaderOptions(arena_bytes=...) avoids this",
                    self.arena.capacity,
                    overflow,
                    key,
                )
            return None, memoryview(bytearray(self.source.read(index)))

    def _stage_pixels(self, host: DecodedImage, key: str) -> tuple[Slice | None, DecodedImage]:
        """Copy decoded pixels into ``pixel_arena`` when it has room now.

        The stage then uploads them with an asynchronous copy from page-locked memory.
        From pageable memory the copy goes through torch's pinned staging, which cost
        about 3.7 ms per 500x500 image on an H100 (a new pinned block each time, because
        the last one is still queued behind the batch decode). Without room, or without
        a ``pixel_arena``, the pixels stay where they are.

        Not in the fetch arena (as first built): decoded pixels are 5-10x their file,
        and those of a batch still being gathered could fill it while the batch's last
        fetch waits there for room, which only a finished batch gives back. A threaded
        test hung that way.
        """
        if self.pixel_arena is None:
            return None, host
        array = host.array
        piece = self.pixel_arena.try_acquire(array.nbytes, key=key)
        if piece is None:
            return None, host
        pinned = piece.buffer[: array.nbytes].reshape(array.shape)
        np.copyto(pinned, array)
        return piece, DecodedImage(pinned, host.scale)


@dataclass(eq=False)
class GpuBatch:
    """The stage's output: images and labels on the device, ready once ``event`` fires."""

    images: torch.Tensor
    """``[N, 3, H, W]`` of the requested dtype; N counts the samples that did not fail."""
    labels: torch.Tensor
    """``[N]`` int64, on the device."""
    positions: list[int]
    """Epoch positions of the N samples, in ``images`` order."""
    keys: list[str]
    """Their keys."""
    event: Event
    """Recorded on the worker's stream after the kernel and the label copy."""
    failed: list[Failure]
    """(position, key, exception) for each sample that neither decoder could decode."""
    runtime: DeviceRuntime = field(repr=False)
    handed_off: bool = False


def handoff(batch: GpuBatch) -> tuple[torch.Tensor, torch.Tensor]:
    """Consumer side: make the current stream wait on the batch's event, ``record_stream``
    the tensors on it, return (images, labels). Call it in the thread that uses them."""
    if not batch.handed_off:
        batch.runtime.handoff([batch.images, batch.labels], batch.event)
        batch.handed_off = True
    return batch.images, batch.labels


@dataclass(eq=False)
class WorkerState:
    """One worker thread's stream, decoder, and what must outlive its in-flight kernels."""

    stream: Any
    decoder: BatchDecoder
    pending: collections.deque[tuple[Event, list[object]]] = field(
        default_factory=collections.deque
    )

    def reap(self) -> None:
        """Drop the keep-alives of batches whose event has fired (oldest first)."""
        while self.pending and self.pending[0][0].query():
            self.pending.popleft()


def new_worker_state(ports: GpuPorts) -> WorkerState:
    """A new stream and decoder; when the state is dropped, its last kernels are waited for."""
    state = WorkerState(ports.runtime.new_stream(), ports.make_decoder())
    weakref.finalize(state, _drain, state.pending)
    return state


class WorkerPool:
    """Worker states kept from one epoch to the next.

    Each epoch's decode pipeline starts new worker threads, and a new nvImageCodec decoder
    took about a second on an H100 (seen as a one-second batch at every epoch start).
    A state is only ever used by one thread at a time: a worker takes one when it starts
    (``acquire``, its ``worker_init``), and ``reclaim`` takes it back once that thread has
    ended (a thread still alive, stuck, keeps its own).
    """

    def __init__(self, ports: GpuPorts) -> None:
        self.ports = ports
        self.created = 0
        """States made so far (the rest of the acquisitions reused one)."""
        self._idle: list[WorkerState] = []
        self._leased: list[tuple[threading.Thread, WorkerState]] = []
        self._lock = threading.Lock()

    def acquire(self) -> WorkerState:
        """A state for the calling worker thread: an idle one, else a new one."""
        with self._lock:
            state = self._idle.pop() if self._idle else None
            if state is None:
                self.created += 1
        if state is None:
            state = new_worker_state(self.ports)
        with self._lock:
            self._leased.append((threading.current_thread(), state))
        return state

    def reclaim(self) -> None:
        """Make the states of ended threads idle again (call after joining the workers)."""
        with self._lock:
            still = [(t, s) for t, s in self._leased if t.is_alive()]
            self._idle += [s for t, s in self._leased if not t.is_alive()]
            self._leased = still

    def clear(self) -> None:
        """Drop the idle states (their finalizers wait for their last kernels)."""
        with self._lock:
            self._idle.clear()


def _require_keyword(
    method: Callable[..., Any], name: str, transform: TrainTransform | EvalTransform, what: str
) -> None:
    """Refuse, before any batch, a port method that cannot take the keyword ``name``
    which ``transform`` needs (a port written before the parameter was added): its every
    call would raise a TypeError, failing every batch."""
    try:
        params = inspect.signature(method).parameters.values()
    except (TypeError, ValueError):  # no signature to read (a builtin): its calls will say
        return
    if any(
        (p.name == name and p.kind is not p.POSITIONAL_ONLY) or p.kind is p.VAR_KEYWORD
        for p in params
    ):
        return  # the stage passes it by keyword
    raise TypeError(
        f"{what} ({getattr(method, '__qualname__', method)!r}) takes no `{name}` parameter, "
        f"which the transform's {name}={getattr(transform, name)!r} needs: add "
        f"`{name}` to it (see the protocols in gpu_loader/cuda/_ports.py), or keep the "
        "default on the transform"
    )


def unless_default(name: str, value: object, default: object) -> dict[str, Any]:
    """``{name: value}`` to pass as a keyword, or nothing where ``value`` is the default:
    a port written before the parameter was added keeps serving the default."""
    return {} if value == default else {name: value}


def _drain(pending: collections.deque[tuple[Event, list[object]]]) -> None:
    # Runs when a worker's state is dropped: its last kernels may still read the images.
    while pending:
        event, _ = pending[0]
        event.synchronize()
        pending.popleft()


class GpuBatchStage:
    """The engine op ``stage(samples, state) -> GpuBatch`` with ``worker_init=stage.worker_init``.

    ``labels`` are the source's labels (indexed by ``FetchedSample.index``).
    """

    def __init__(
        self,
        ports: GpuPorts,
        transform: TrainTransform | EvalTransform,
        labels: np.ndarray,
        *,
        dtype: OutputDtype = "float32",
        max_pixels: int = DEFAULT_MAX_PIXELS,
    ) -> None:
        if dtype not in OUTPUT_DTYPES:
            raise ValueError(f"`dtype` must be one of {list(OUTPUT_DTYPES)}, got {dtype!r}")
        if transform.interpolation != "bilinear":
            _require_keyword(
                ports.launcher.launch, "interpolation", transform, "GpuPorts.launcher's launch"
            )
        decode = getattr(ports.make_decoder, "decode", None)  # where it is the class
        if not transform.exif_orientation and isinstance(ports.make_decoder, type) and decode:
            # A factory function's decoder is only known once made; one without the
            # keyword then fails its calls, each batch decoding on the CPU, with a warning.
            _require_keyword(decode, "exif_orientation", transform, "the decoder's decode")
        self.ports = ports
        self.transform = transform
        self.labels = np.asarray(labels, dtype=np.int64)
        self.dtype: OutputDtype = dtype
        self.max_pixels = max_pixels
        self.failed_decode_calls = 0
        """Batch decode calls that raised, so that their batch decoded on the CPU."""

    def worker_init(self) -> WorkerState:
        return new_worker_state(self.ports)

    def handoff(self, batch: GpuBatch) -> tuple[torch.Tensor, torch.Tensor]:
        return handoff(batch)

    def __call__(self, samples: Sequence[FetchedSample], state: WorkerState) -> GpuBatch:
        runtime, stream = self.ports.runtime, state.stream
        state.reap()
        consumed: Event | None = None
        try:
            decoded = self._decode_jpegs(samples, state)
            images, boxes, flips, done, failed = self._collect(samples, decoded, stream)
            consumed = runtime.record_event(stream)
            batch = self._launch(images, boxes, flips, done, failed, stream)
        except BaseException:
            consumed = None  # on an error, wait for everything enqueued so far
            raise
        finally:
            # The decoder and the uploads of staged pixels read the arena until the
            # stream passes them. The kernel is already enqueued behind them, so the
            # device stays busy while this thread waits.
            try:
                (consumed or runtime.record_event(stream)).synchronize()
            finally:
                for sample in samples:
                    sample.release()
        keep: list[object] = [im for im in decoded if im is not None]
        keep += [im for im in images]
        state.pending.append((batch.event, keep))
        return batch

    # -- steps ---------------------------------------------------------------------------
    def _decode_jpegs(
        self, samples: Sequence[FetchedSample], state: WorkerState
    ) -> list[DeviceImage | None]:
        """One batch decode for the samples with a JPEG header; None for the others."""
        which = [i for i, s in enumerate(samples) if s.size is not None]
        out: list[DeviceImage | None] = [None] * len(samples)
        if not which:
            return out
        try:
            results = state.decoder.decode(
                [samples[i].data for i in which],
                state.stream,
                **unless_default("exif_orientation", self.transform.exif_orientation, True),
            )
        except Exception as exc:  # the whole call failed: every sample tries the CPU decoder
            # Said, not silent (QA: device memory running out under nvImageCodec's own
            # allocations, or a sticky CUDA error, sent every later batch to the CPU
            # with no word): a warning at the first, then one at each power of two.
            self.failed_decode_calls += 1
            count = self.failed_decode_calls
            if count & (count - 1) == 0:
                _log.warning(
                    "the batch decoder raised (%s: %s); decoding this batch on the CPU "
                    "(%d such batch%s so far)",
                    type(exc).__name__,
                    exc,
                    count,
                    "" if count == 1 else "es",
                )
            return out
        if len(results) != len(which):
            # nvImageCodec 0.9 keeps positions (None where one failed); older releases
            # dropped failed entries, so no image can be matched to its sample: every
            # sample tries the CPU decoder instead of the batch failing.
            _log.warning(
                "the batch decoder returned %d images for %d inputs; decoding this batch "
                "on the CPU",
                len(results),
                len(which),
            )
            return out
        for i, image in zip(which, results, strict=True):
            out[i] = image
        return out

    def _collect(
        self,
        samples: Sequence[FetchedSample],
        decoded: list[DeviceImage | None],
        stream: Any,
    ) -> tuple[
        list[DeviceImage], list[tuple[float, ...]], list[bool], list[FetchedSample], list[Failure]
    ]:
        images: list[DeviceImage] = []
        boxes: list[tuple[float, ...]] = []
        flips: list[bool] = []
        done: list[FetchedSample] = []
        failed: list[Failure] = []
        for sample, image in zip(samples, decoded, strict=True):
            try:
                params = sample.params
                if sample.host is not None:  # decoded at fetch (not a JPEG)
                    image = self.ports.runtime.upload_image(sample.host.array, stream)
                elif image is None or (image.height, image.width) != sample.size:
                    # nvImageCodec could not decode this JPEG (or gave another geometry
                    # than the oriented header): the CPU decoder tries it
                    image, params = self._fallback(sample, stream)
            except Exception as exc:
                add_note(exc, f"stage: gpu_decode, sample: {sample.key}")
                release_locals(exc)  # kept until the epoch ends: not the sample with it
                failed.append((sample.position, sample.key, exc))
                continue
            if params is None:  # unreachable: the header or the fallback sets it
                raise RuntimeError(f"no crop parameters for sample {sample.key!r}")
            images.append(image)
            boxes.append((params.top, params.left, params.height, params.width))
            flips.append(params.flip)
            done.append(sample)
        return images, boxes, flips, done, failed

    def _fallback(self, sample: FetchedSample, stream: Any) -> tuple[DeviceImage, CropParams]:
        host = decode(
            sample.data,
            key=sample.key,
            max_pixels=self.max_pixels,
            exif=self.transform.exif_orientation,
        )
        params = sample.params
        if params is None:
            rng = sample.rng if sample.rng is not None else np.random.default_rng(sample.index)
            params = self.transform.make_params(host.height, host.width, rng)
        return self.ports.runtime.upload_image(host.array, stream), params

    def _launch(
        self,
        images: list[DeviceImage],
        boxes: list[tuple[float, ...]],
        flips: list[bool],
        done: list[FetchedSample],
        failed: list[Failure],
        stream: Any,
    ) -> GpuBatch:
        runtime = self.ports.runtime
        out_h, out_w = self.transform.output_size
        out = runtime.empty_output((len(images), 3, out_h, out_w), self.dtype, stream)
        if images:
            self.ports.launcher.launch(
                [im.ref for im in images],
                np.asarray(boxes, dtype=np.float64),
                np.asarray(flips, dtype=bool),
                int(out.data_ptr()),
                out_h,
                out_w,
                self.transform.mean,
                self.transform.std,
                self.dtype,
                stream,
                **unless_default("interpolation", self.transform.interpolation, "bilinear"),
            )
        labels = runtime.upload_labels(self.labels[[s.index for s in done]], stream)
        return GpuBatch(
            images=out,
            labels=labels,
            positions=[s.position for s in done],
            keys=[s.key for s in done],
            event=runtime.record_event(stream),
            failed=failed,
            runtime=runtime,
        )
