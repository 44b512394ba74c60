"""`ImageLoader`: the torch-facing iterable over batches of images and labels.

One epoch is one engine pipeline: the sampler's positions -> `read` (I/O threads) ->
`decode` (decode + transform threads, GIL-free) -> a batcher thread -> the training loop.
Every sample is written straight into its row of its nominal batch's tensor; in
``straggler`` mode batches are formed from whichever samples are ready, and only the
samples that moved are copied (see `gpu_loader.batching` and `gpu_loader._straggler_rows`).
The GPU path (`gpu_loader._gpu_epoch`) decodes whole batches on the device instead.
"""

from __future__ import annotations

import collections
import contextlib
import copy
import itertools
import logging
import operator
import os
import threading
import weakref
from collections.abc import Generator, Iterable, Iterator, Mapping
from dataclasses import dataclass, replace
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal, NoReturn

import numpy as np

from gpu_loader._augment import Augment, check_augment
from gpu_loader._batch_pool import BatchPool
from gpu_loader._epoch import CpuEpoch, EpochBase, Received, make_batcher
from gpu_loader._failed import FailedSample as FailedSample  # its name here too
from gpu_loader._run_sizer import MOST_LONG, STRAGGLER_FLOOR_S, RunLength, RunSizer
from gpu_loader.batching import AdaptiveThreshold
from gpu_loader.batching._ledger import brief
from gpu_loader.monitor import (
    JsonlLogger,
    Monitor,
    MonitorConfig,
    ProgressReporter,
    nvml_indices_for_cuda,
)
from gpu_loader.monitor._periodic import check_interval
from gpu_loader.ops import DEFAULT_MAX_PIXELS, EvalTransform, OutputDtype, TrainTransform
from gpu_loader.pipeline._defs import check_max_failures
from gpu_loader.sources import SampleIndex, Sampler, open_index
from gpu_loader.sources._io import absolute
from gpu_loader.sources._rng import EPOCH_LIMIT
from gpu_loader.sources._sampler import IterableSampler

if TYPE_CHECKING:
    import torch

    from gpu_loader._batch import Batch
    from gpu_loader.batching import BatcherStats
    from gpu_loader.cuda import GpuPorts, PinnedArena, WorkerPool
    from gpu_loader.monitor import LoaderStats

_log = logging.getLogger("gpu_loader")

Batching = Literal["ordered", "straggler"]
DecodeOn = Literal["auto", "cpu", "gpu"]
OnError = Literal["skip", "raise"]
Device = Literal["cpu", "cuda", "auto"]
_STATE_VERSION = 1
MIN_LOG_INTERVAL_S = 0.1
"""The shortest `LoaderOptions.log_interval_s`: one second's lines at most ten."""


@dataclass(frozen=True)
class LoaderOptions:
    """Tuning knobs. Every field has an automatic default that suits most machines."""

    decode_threads: int | None = None
    """Decode + transform threads (default: the CPU count)."""
    io_threads: int | None = None
    """Threads reading bytes (default: 2 for local files, 16 for fsspec URLs; on the GPU
    path, where they also decode non-JPEG input, at least min(8, decode_threads))."""
    prefetch_batches: int = 2
    """Batches prepared ahead of the training loop; bounds memory with `max_delay_batches`."""
    max_delay_batches: int = 2
    """``straggler`` mode: the most batches a slow sample may arrive after its nominal batch."""
    max_slow_threads: int | None = None
    """``straggler`` mode: workers allowed in each stage's slow lane at once (default: that
    stage's thread count)."""
    cost_lookahead: int = 0
    """``straggler`` mode: start expected-slow samples (the larger files, from the source's
    cheap ``nbytes``) first within consecutive blocks of this many positions, so they
    finish nearer their batch (0 or 1: start in order). At most ``batch_size *
    (prefetch_batches + max_delay_batches)``, which keeps the in-flight window able to
    make progress."""
    samples_per_task: int | None = None
    """CPU decode path: consecutive samples one read or decode call takes. Fewer calls
    per sample spend less time under the GIL in the engine's hand-offs (the ordered CPU
    path used ~30-50% less CPU per image with runs of 8 than of 1 in a zero-cost-decode
    test). Default: up to 8, as many as leave two runs per read and decode thread in the
    in-flight window and spread a batch over every I/O thread, and up to 64 within those
    bounds while samples are cheap (about 2 ms of read and decode CPU a run, its reads no
    longer than 20 ms in turn: tiny images), measured as it goes and kept across epochs.
    In ``straggler`` mode runs only while the slowest reads (p99) take no longer than
    decoding a run or than 5 ms (the slow lanes move nothing shorter), and one sample
    otherwise, so the slow lane can move a single slow read (a run reads its files one
    after another); one with ``cost_lookahead`` (a run would decode the largest files of
    a block one after another). The GPU path runs one sample per call."""
    max_pixels: int = DEFAULT_MAX_PIXELS
    """Images with more pixels are refused before decoding (decompression bombs)."""
    batch_timeout_s: float | None = None
    """Seconds one ``next()`` may wait for its batch before it raises `TimeoutError`
    naming the samples the workers have held longest (DataLoader's ``timeout``); None: as
    long as it takes. It raises after the epoch's threads are joined for up to 1 s more.
    A read that never returns (a hung remote store) otherwise holds the epoch for good.
    The epoch stops, and its ``state_dict()`` resumes it. The first batch's wait includes
    the epoch's start-up."""
    pin_memory: bool | None = None
    """Pin the CPU path's batch tensors, so copies to a GPU are faster and asynchronous.
    Default (None): yes when the device is CUDA. With ``device="cpu"``, True pins them for
    the training loop's own ``.to("cuda", non_blocking=True)``, as DataLoader's
    ``pin_memory`` does (logged and ignored when torch sees no CUDA device)."""
    progress: bool = False
    """Show a live progress bar (img/s, stall %, GPU util, bottleneck)."""
    monitor_gpu: bool = True
    """Sample NVML GPU utilisation (the loader's GPU, or all GPUs on the CPU path)."""
    log_jsonl: str | None = None
    """Append a `stats().as_dict()` line to this file every `log_interval_s` seconds,
    with ``time_unix``, ``epoch``, ``rank``, ``world_size``, ``host`` and ``pid``, so that
    lines of several ranks or runs can be merged and told apart."""
    log_interval_s: float = 10.0
    """Seconds between JSON-lines snapshots; at least 0.1 (each line builds a full
    `stats()` in a thread that shares the GIL with the loader)."""
    decode_on: DecodeOn = "auto"
    """Where images are decoded and transformed: ``auto`` is the GPU when the device is
    CUDA (nvImageCodec batch decode + fused kernels), unless the loader asks for what the
    CPU path alone does (an ``augment`` function); else the CPU."""
    gpu_streams: int = 2
    """GPU path: worker threads, each with its own CUDA stream and decoder."""
    arena_bytes: int = 256 * 2**20
    """GPU path: pinned host memory for fetched bytes; bounds the pinned bytes in flight
    (a fetch that finds no room for 1 s reads into ordinary memory instead). A
    quarter as much again, allocated at first use, holds decoded non-JPEG pixels on
    their way to the GPU. Both come from torch's pinned allocator, which rounds each block
    up to a power of two and keeps it: give a power of two (300 MiB would pin 512)."""
    gpu_ports: GpuPorts | None = None
    """GPU path: the device ports (decode, kernel launch, runtime). None means the CUDA
    implementations; tests pass `gpu_loader.cuda.standin_ports()` to run the GPU
    orchestration on the CPU."""

    def __post_init__(self) -> None:
        for name in ("decode_threads", "io_threads", "max_slow_threads", "samples_per_task"):
            if getattr(self, name) is not None:
                _check_int(name, getattr(self, name), 1, "an int >= 1 or None (automatic)")
        _check_int("prefetch_batches", self.prefetch_batches, 1)
        _check_int("max_delay_batches", self.max_delay_batches, 0)
        _check_int("cost_lookahead", self.cost_lookahead, 0)
        _check_int("max_pixels", self.max_pixels, 1)
        if self.decode_on not in ("auto", "cpu", "gpu"):
            raise ValueError(f"`decode_on` must be 'auto', 'cpu' or 'gpu', got {self.decode_on!r}")
        _check_int("gpu_streams", self.gpu_streams, 1)
        for name in ("progress", "monitor_gpu"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"`{name}` must be True or False, got {getattr(self, name)!r}")
        if self.pin_memory is not None and not isinstance(self.pin_memory, bool):
            raise TypeError(f"`pin_memory` must be True, False or None, got {self.pin_memory!r}")
        check_interval("log_interval_s", self.log_interval_s)
        if self.log_interval_s < MIN_LOG_INTERVAL_S:
            raise ValueError(
                f"`log_interval_s` must be at least {MIN_LOG_INTERVAL_S} s (each line builds a "
                f"full stats() while the loader runs), got {self.log_interval_s!r}"
            )
        if self.batch_timeout_s is not None:
            check_interval("batch_timeout_s", self.batch_timeout_s)
        if self.log_jsonl is not None:
            # ".." after a symlink kept, as the OS reads it (QA64)
            folder = os.path.dirname(absolute(os.fspath(self.log_jsonl)))
            if not os.path.isdir(folder):
                raise ValueError(
                    f"`log_jsonl` {self.log_jsonl!r}: its folder {folder!r} does not exist"
                )
            if os.path.isdir(self.log_jsonl):
                raise ValueError(
                    f"`log_jsonl` {self.log_jsonl!r} is a folder: give a file's path in it"
                )
        _check_int("arena_bytes", self.arena_bytes, 2**20, "an int >= 1 MiB (2**20)")


_SOURCE_NEEDS = ("__len__", "key", "labels", "read", "nbytes", "fingerprint")
"""What the loader uses of a sample index (`gpu_loader.sources.SampleIndex`); the GPU
path also ``readinto``."""


def _check_source(source: object) -> None:
    """Refuse, as the loader is made, a source without what the loader calls: a custom
    index without ``labels`` or ``fingerprint`` failed with a bare AttributeError, the
    first at its first batch."""
    missing = [m for m in _SOURCE_NEEDS if not hasattr(source, m)]
    if missing:
        raise TypeError(
            "`source` must be a path or URL, or a sample index such as "
            "gpu_loader.sources.ImageFolder(path), FileList(...) or TarShards(...) (the "
            "gpu_loader.sources.SampleIndex protocol); "
            f"{type(source).__name__} has no {', '.join(missing)}{_source_hint(source)}"
        )


def _source_hint(source: object) -> str:
    """What to pass instead of two things a DataLoader user reaches for (QA65)."""
    if isinstance(source, list | tuple):
        return " (a list of (path, label) pairs goes in gpu_loader.sources.FileList(pairs))"
    if hasattr(source, "__getitem__") and hasattr(source, "__len__"):
        return (
            " (a map-style Dataset's samples are read by the loader itself: give it their "
            "files, e.g. FileList(dataset.samples) for a torchvision ImageFolder)"
        )
    return ""


def _fixed_when_built(name: str, why: str = "") -> AttributeError:
    """The refusal of an assignment to an `ImageLoader` setting fixed when it is built."""
    return AttributeError(
        f"an ImageLoader's {name} is fixed when it is built{why}: build a new "
        f"ImageLoader(..., {name}=...)"
    )


def _check_int(name: str, value: object, least: int, what: str = "") -> None:
    """An option that must be a whole number of at least ``least``: True and False are not
    (as ``max_delay_batches=True``, quietly 1)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ValueError(f"`{name}` must be {what or f'an int >= {least}'}, got {value!r}")


_TORCH_DTYPES = ("float32", "float16", "bfloat16", "uint8")


def _dtype_name(dtype: object) -> OutputDtype:
    """The output dtype's name: one of `_TORCH_DTYPES`, given as a string or a torch dtype."""
    import torch

    name = str(dtype).removeprefix("torch.") if isinstance(dtype, torch.dtype) else dtype
    if name not in _TORCH_DTYPES:
        raise ValueError(
            f"`dtype` must be one of {_TORCH_DTYPES} (or the torch dtype), got {dtype!r}"
        )
    return name  # type: ignore[return-value]


def _check_batch_fits(
    rows: int, transform: TrainTransform | EvalTransform, dtype: OutputDtype
) -> None:
    """Refuse an output no machine here could hold, before every sample fails on it (the
    batch tensor is allocated by the first sample of each batch, so its error was recorded
    against every file). ``rows``: the largest batch an epoch can make, the batch size or
    the epoch's samples where fewer (QA63: a batch size over a 1-image folder's was
    refused for 56 GiB that it never takes)."""
    import psutil
    import torch

    h, w = transform.output_size
    nbytes = rows * 3 * h * w * getattr(torch, dtype).itemsize
    total = psutil.virtual_memory().total
    if nbytes > total:
        raise ValueError(
            f"one batch of {rows} x 3 x {h} x {w} {dtype} needs {nbytes / 2**30:,.1f} GiB, "
            f"more than this machine's {total / 2**30:,.1f} GiB of memory; check the "
            "transform's `size` and `batch_size`"
        )


class ImageLoader:
    """Batches of images ``[B, 3, H, W]`` and int64 labels from an image source.

    >>> loader = ImageLoader(ImageFolder("/data/train"), batch_size=256,
    ...                      transform=TrainTransform(224), device="cpu")
    >>> for epoch in range(3):
    ...     loader.set_epoch(epoch)
    ...     for images, labels in loader:
    ...         ...

    Without `set_epoch`, each new pass moves on to the next epoch by itself, whether the
    last one finished or was cut short (``break`` after N steps), as DataLoader reshuffles
    on each ``iter()``; `set_epoch(e)` (or ``loader.sampler.set_epoch(e)``, the
    DistributedSampler habit) picks the epoch instead, and after `load_state_dict` the
    next pass continues the saved epoch. One epoch runs at a time: starting a new
    iteration (or `close()`, `load_state_dict()`) stops the running one, whose iterator
    then raises a RuntimeError saying so.

    ``source`` is a sample index (`gpu_loader.sources`), or a path or URL that
    `gpu_loader.sources.open_index` opens (a folder, a ``.csv`` list, ``.tar`` shards).

    ``shuffle`` defaults to True, unlike DataLoader's False (False with a ``sampler``):
    pass ``shuffle=False`` to evaluate in the source's order, e.g. to line predictions up
    with ``loader.dataset.targets`` (``batch.indices`` names each row's sample either way).

    Bad samples: with ``on_error="skip"`` (the default) a sample that fails to read or
    decode is left out and listed in `failed_samples()` with its key. The epoch stops with
    `gpu_loader.pipeline.PipelineFailure` (an ExceptionGroup of the first errors, each
    naming its sample) once the epoch's failed samples pass ``max_failures``: an int
    count, a rate in (0, 1] over the samples the loader has finished with, judged once all
    the epoch's are (earlier only once it has seen 100 and the rate is above the limit
    beyond doubt: 99.9% confidence), or None (or
    1.0) for no limit. It counts the failures of every stage together (read, decode,
    augment; on the GPU path fetch and GPU decode), so both paths stop at the same
    count; each stage also applies it to its own. ``on_error="raise"`` stops at
    the first failure, with the same exception.

    ``sample_weights`` (one number >= 0 per sample of the source, in its order) makes
    each epoch draw ``len(source)`` samples (rounded up to a multiple of the world size)
    with replacement in proportion to them, as
    ``WeightedRandomSampler`` does (class balancing: weight each sample by one over its
    class's count), from ``(seed, epoch)``, so ranks split one draw and a resume sees the
    same; a sample may then come more than once per epoch, and one of weight 0 never.

    ``sampler`` (optional) is what ``DataLoader(sampler=...)`` takes: a re-iterable of
    dataset indices, with ``set_epoch(epoch)`` if its order depends on the epoch (called
    before each epoch's order is taken; ``train_sampler.set_epoch(e)`` on it is taken as
    the loader's epoch). The loader runs that order instead of shuffling (``shuffle`` then
    defaults to False; True is refused), and the sampler shards for itself (``rank``,
    ``world_size`` and ``sample_weights`` are refused beside it). Every epoch must give as
    many indices as the first, and a finite number. A resume needs the same order for the
    saved epoch (one that follows ``set_epoch``, as ``DistributedSampler``'s): the state
    keeps its digest and refuses another.

    ``augment(image, generator) -> image`` (optional) runs on each sample after the crop,
    resize and flip, before the normalisation: ``image`` is the sample's ``[3, H, W]``
    uint8 CPU tensor (rounded to 8 bits), and the function returns a tensor of that shape,
    uint8 (0-255) or floating point (0-1), which is then normalised and cast. torchvision's
    tensor transforms (``ColorJitter``, ``RandAugment``, ``RandomErasing``, ...) take that
    image (``augment=lambda image, generator: t(image)``; a one-argument function is
    refused). ``generator`` is a ``torch.Generator`` seeded from (seed, epoch, sample),
    apart from the crop's stream: draw from it and the augmentation is reproducible,
    whatever the threads and across a resume (torch's global generator, which torchvision
    draws from, is shared by the loader's threads, so its draws depend on timing). It runs
    in the decode threads, several samples at once, on the CPU path (``decode_on="auto"``
    then picks it on a CUDA device too). An exception it raises fails that sample, as a
    decode error does (``failed_samples()`` lists it with stage ``augment``), and so does a
    result it cannot use: another shape, or float pixels off the 0-1 scale (outside
    [-1, 2], or NaN).
    """

    def __init__(
        self,
        source: SampleIndex | str | os.PathLike[str],
        *,
        batch_size: int,
        transform: TrainTransform | EvalTransform,
        device: Device | str = "cpu",
        dtype: OutputDtype | torch.dtype = "float32",
        shuffle: bool | None = None,
        seed: int = 0,
        drop_last: bool = False,
        rank: int | None = None,
        world_size: int | None = None,
        batching: Batching = "ordered",
        on_error: OnError = "skip",
        max_failures: int | float | None = 0.01,
        sample_weights: Any = None,
        sampler: Iterable[Any] | None = None,
        augment: Augment | None = None,
        options: LoaderOptions | None = None,
        # DataLoader's own arguments, refused with what to use instead (NoReturn: a type
        # checker flags them too).
        **dataloader_kwargs: NoReturn,
    ) -> None:
        if dataloader_kwargs:
            raise TypeError(_dataloader_kwargs_advice(dataloader_kwargs))
        if shuffle is None:
            shuffle = sampler is None
        for name, flag in (("shuffle", shuffle), ("drop_last", drop_last)):
            if not isinstance(flag, bool | np.bool_):
                raise TypeError(f"`{name}` must be True or False, got {flag!r}")
        shuffle, drop_last = bool(shuffle), bool(drop_last)
        if sampler is not None:
            _check_sampler_args(shuffle, rank, world_size, sample_weights)
        try:  # int and numpy integers
            size = operator.index(batch_size) if not isinstance(batch_size, bool) else 0
        except TypeError:
            size = 0
        if size < 1:
            raise ValueError(f"`batch_size` must be an int >= 1, got {batch_size!r}")
        batch_size = size
        if not isinstance(transform, TrainTransform | EvalTransform):
            raise TypeError(
                "`transform` must be gpu_loader.ops.TrainTransform or EvalTransform, "
                f"got {type(transform).__name__}"
            )
        dtype = _dtype_name(dtype)
        if batching not in ("ordered", "straggler"):
            raise ValueError(f"`batching` must be 'ordered' or 'straggler', got {batching!r}")
        if on_error not in ("skip", "raise"):
            raise ValueError(f"`on_error` must be 'skip' or 'raise', got {on_error!r}")
        check_max_failures(max_failures)
        if isinstance(source, str | os.PathLike):
            source = open_index(source)  # a folder, a .csv list, or .tar shards
        _check_source(source)
        self.source = source
        self._batch_size = batch_size
        self.transform = transform
        self.augment = check_augment(augment)
        self.dtype: OutputDtype = dtype
        self._drop_last = drop_last
        self.batching: Batching = batching
        self.on_error: OnError = on_error
        self.max_failures = 0 if on_error == "raise" else max_failures
        if options is not None and not isinstance(options, LoaderOptions):
            raise TypeError(
                "`options` must be gpu_loader.LoaderOptions(...), got "
                f"{type(options).__name__}; write LoaderOptions(**your_dict) for a dict"
            )
        self.options = options or LoaderOptions()
        opts = self.options
        most = batch_size * (opts.prefetch_batches + opts.max_delay_batches)
        if opts.cost_lookahead > most:
            raise ValueError(
                f"`cost_lookahead` must be at most batch_size * (prefetch_batches + "
                f"max_delay_batches) = {most}, got {opts.cost_lookahead}: a larger block "
                "could fill the in-flight window without completing a batch"
            )
        if len(source) == 0:
            raise ValueError(
                f"{source!r} has no samples to load (an empty folder, list or shard set?)"
            )
        self.device = _resolve_device(device)
        self._pin = _pin_batches(self.device, self.options.pin_memory)
        self._decode_on_gpu()  # its refusals here rather than at the first batch
        self.sampler: Sampler = (
            Sampler(
                len(source),
                shuffle=shuffle,
                seed=seed,
                rank=rank,
                world_size=world_size,
                drop_last=False,
                fingerprint=source.fingerprint(),
                weights=sample_weights,
            )
            if sampler is None
            else IterableSampler(sampler, len(source), seed=seed, fingerprint=source.fingerprint())
        )
        _check_batch_fits(min(batch_size, len(self.sampler)), transform, dtype)
        cpus = os.cpu_count() or 1
        self.decode_threads = self.options.decode_threads or cpus
        self.io_threads = self.options.io_threads or _default_io_threads(source)
        self._resume: dict[str, Any] | None = None
        self._restored = False  # load_state_dict() ran and no epoch has started since
        self._epoch_done = False
        self._explicit_epoch = False
        self._epoch_begun = False  # a pass over the current epoch has started
        self._known_epoch = 0  # the epoch this loader selected (the sampler's may be set apart)
        self._passes = 0  # passes started; an epoch object knows which one it is
        # The progress of the latest pass once it closed unfinished: state_dict() must not
        # depend on whether the garbage collector has freed that epoch yet. Its record
        # itself, not a snapshot: a close from another thread may land while the training
        # thread records a batch it then hands over.
        self._closed_progress: Received | None = None
        self._failed: list[FailedSample] = []
        # Each key and error text once: a file that fails every epoch fails with the same
        # message (the records of every epoch are kept).
        self._failure_texts: dict[str, str] = {}
        self._last_engine_stats: Any = None
        self._last_batcher_stats: BatcherStats | None = None
        # A weak reference: the epoch's generator (held by the training loop) keeps the
        # loader alive, never the other way round, so dropping both frees their threads.
        self._active: weakref.ref[EpochBase] | None = None
        self._iterator: weakref.ref[Any] | None = None  # the running epoch's generator
        # Re-entrant: an epoch freed by the cyclic garbage collector closes itself (its
        # generator's `finally`, or the finalizer below), which may happen inside any
        # allocation, this lock's own sections included.
        self._lock = threading.RLock()
        self._monitor: Monitor | None = None
        self._stats_at_close: LoaderStats | None = None
        self._arenas: tuple[PinnedArena, PinnedArena] | None = None
        self._pool: BatchPool | None = None
        self._spares: tuple[tuple[Any, ...], collections.deque[torch.Tensor]] | None = None
        self._sizer: RunSizer | None = None
        self._length: RunLength | None = None
        self._thresholds: dict[str, AdaptiveThreshold] = {}
        self._arena_ports: GpuPorts | None = None
        self._cuda_ports: GpuPorts | None = None  # made at the first GPU epoch, then kept
        self._gpu_worker_pool: WorkerPool | None = None
        self._logger: JsonlLogger | None = None

    # -- the torch-facing surface ---------------------------------------------------------
    @property
    def dataset(self) -> SampleIndex:
        """The source (DataLoader's name for it: ``len(loader.dataset)`` counts samples)."""
        return self.source

    @property
    def seed(self) -> int:
        """The seed of the shuffle and of every sample's random crop and flip."""
        return self.sampler.seed

    @seed.setter
    def seed(self, value: object) -> None:
        raise _fixed_when_built("seed", " (its shuffle, its crops and its saved states use it)")

    @property
    def batch_size(self) -> int:
        return self._batch_size

    @batch_size.setter
    def batch_size(self, value: object) -> None:
        # QA65: an assignment took effect at the next epoch, quietly stopping the running
        # one; DataLoader refuses it too (its saved states and batch counts depend on it).
        raise _fixed_when_built("batch_size")

    @property
    def drop_last(self) -> bool:
        return self._drop_last

    @drop_last.setter
    def drop_last(self, value: object) -> None:
        raise _fixed_when_built("drop_last")

    @property
    def shuffle(self) -> bool:
        return self.sampler.shuffle

    @shuffle.setter
    def shuffle(self, value: object) -> None:
        raise _fixed_when_built("shuffle")

    def __repr__(self) -> str:
        sampler = self.sampler
        rank = f", rank {sampler.rank} of {sampler.world_size}" if sampler.world_size > 1 else ""
        out_h, out_w = self.transform.output_size
        return (
            f"ImageLoader({self.source!r}, batch_size={self.batch_size}, "
            f"transform={type(self.transform).__name__} -> {out_h}x{out_w}, "
            f"device='{self.device}', dtype='{self.dtype}', shuffle={self.shuffle}, "
            f"batching='{self.batching}', epoch {self.epoch}{rank}, {len(self)} batches)"
        )

    def __len__(self) -> int:
        """Batches per epoch for this rank (before any failed samples are left out)."""
        n = len(self.sampler)
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch (reshuffles; per-sample random crops depend on it too).

        After `load_state_dict`, setting the saved epoch again (the training loop's usual
        call at the top of each epoch) keeps the restored progress: the next iteration
        yields exactly what that epoch had left (nothing, for a state saved after it
        ended). Setting another epoch
        while one is being iterated stops that one (its iterator raises if used again).
        """
        epoch = _as_int(epoch, f"`epoch` must be an int, got {epoch!r}")
        if not 0 <= epoch < EPOCH_LIMIT:
            raise ValueError(
                f"`epoch` must be in [0, {EPOCH_LIMIT}) (per-sample random streams key on "
                f"it; pass the epoch number, not a step count), got {epoch}"
            )
        # Against the epoch this loader selected: the sampler's own may have been set apart
        # (`loader.sampler.set_epoch`, which `__iter__` passes on to here).
        if (
            self._restored
            and epoch == self._known_epoch
            and (self._resume is not None or self._epoch_done)
        ):
            # The restored epoch chosen again (the loop's call at the top of each epoch):
            # the next pass yields what it had left, nothing if it had ended.
            self._explicit_epoch = True
            return
        if epoch != self._known_epoch:
            # A running epoch of another number would go on under the new one, and
            # state_dict() would pair this epoch with its progress.
            self._leave_epoch(f"set_epoch({epoch}) was called while epoch {self._known_epoch} ran")
        self.sampler.set_epoch(epoch)
        self._known_epoch = epoch
        self._explicit_epoch = True
        self._epoch_done = False
        self._epoch_begun = False
        self._resume = None
        self._restored = False

    @property
    def epoch(self) -> int:
        return int(self.sampler.epoch)

    def __iter__(self) -> Iterator[Batch]:
        running = self._iterator() if self._iterator is not None else None
        if getattr(running, "gi_running", False):  # inside next() in another thread
            raise RuntimeError(
                "this ImageLoader's epoch is being iterated in another thread; a loader "
                "runs one epoch at a time: give each thread its own loader"
            )
        self.sampler.check_distributed()
        chosen = self.sampler.take_chosen_epoch()
        if chosen is not None:
            # train_sampler.set_epoch(e) on a sampler of the user's (`sampler=`), as with
            # DataLoader: the same as set_epoch(e), the same epoch again included.
            self.set_epoch(chosen)
        elif self.sampler.epoch != self._known_epoch:
            # loader.sampler.set_epoch(e), as with DistributedSampler: take it as set_epoch(e)
            self.set_epoch(self.sampler.epoch)
        if (self._epoch_done or self._epoch_begun) and not self._explicit_epoch:
            # As set_epoch does: until this pass's epoch is `_active` (a Ctrl-C while it
            # starts up saved a checkpoint whose resume yielded nothing of it).
            self._leave_epoch("a new iteration over the loader started")
            self.sampler.set_epoch(self.sampler.epoch + 1)
            self._known_epoch = self.sampler.epoch
            self._resume = None
            self._restored = False
        if self._restored and self._epoch_done and self._resume is None:
            # A state saved after its epoch ended, without this rank's record of it (one
            # shared between ranks), and that epoch chosen again: nothing is left of it.
            self._explicit_epoch = False
            self._epoch_begun = True
            self._restored = False
            self._stop_epoch("a new iteration over the loader started")
            return _EpochBatches(_no_batches(), 0)
        self._epoch_done = False
        self._explicit_epoch = False
        self._epoch_begun = True
        self._stop_epoch("a new iteration over the loader started")
        epoch: EpochBase
        if self._decode_on_gpu():
            from gpu_loader._gpu_epoch import GpuEpoch

            epoch = GpuEpoch(self, self._resume)
        else:
            epoch = CpuEpoch(self, self._resume)
        with self._lock:
            # This pass replaces the records of earlier passes over this epoch, but for
            # the samples its resume state lists as failed (none in a fresh pass): their
            # records stay, with their real errors, and are not restored again.
            restored = {f.key for f in epoch.restored}
            same = self.sampler.epoch
            self._failed = [f for f in self._failed if f.epoch != same or f.key in restored]
            have = {f.key for f in self._failed if f.epoch == same}
            epoch.restored = [f for f in epoch.restored if f.key not in have]
        self._passes += 1
        epoch.pass_number = self._passes
        self._closed_progress = None
        # The epoch is `_active` before the resume state is dropped, so that a
        # state_dict() taken at any point in between (a Ctrl-C here) has one of them:
        # without both, it recorded nothing delivered, and its resume repeated samples.
        self._active = weakref.ref(epoch)
        self._restored = False
        self._resume = None
        iterator = epoch.batches()
        # A generator dropped before its first next() runs none of its code, and the
        # epoch's pipeline is held by the engine's finalizer through the epoch's own stage
        # callables: without this the epoch, and this loader with it, would stay alive.
        epoch.unstarted = weakref.finalize(iterator, _close_abandoned, epoch)
        epoch.unstarted.atexit = False  # no threads to stop yet: nothing to do at exit
        self._iterator = weakref.ref(iterator)
        return _EpochBatches(iterator, max(len(self) - epoch.received.batches, 0))

    def __reduce__(self) -> Any:
        raise TypeError(
            "an ImageLoader cannot be pickled (it owns threads, queues and batch memory); "
            "send its source, transform and options to the other process and build a "
            "loader there"
        )

    def state_dict(self) -> dict[str, Any]:
        """A JSON-serialisable snapshot for exact mid-epoch resume (never pickled)."""
        state: dict[str, Any] = {
            "version": _STATE_VERSION,
            "sampler": self.sampler.state_dict(),
            "batch_size": self.batch_size,
            "drop_last": self.drop_last,
            "batching": self.batching,
            "epoch_done": self._epoch_done,
        }
        active = self._epoch()
        if self._restored:  # loaded and not iterated yet: an older epoch's iterator may
            if self._resume is not None:  # still be alive, but this is the progress
                state["batcher"] = copy.deepcopy(self._resume)  # the caller's to change
        elif self._fresh_start_pending():
            pass  # the next pass starts the sampler's epoch from its beginning
        elif active is not None:
            # Mid-epoch, or ended: resume then yields nothing more of it when the loop
            # chooses it again, and reports its failures as "before resume".
            state["batcher"] = active.received.state()
        elif self._closed_progress is not None:
            state["batcher"] = self._closed_progress.state()  # already freed
        return state

    def _fresh_start_pending(self) -> bool:
        """The next pass starts an epoch afresh whatever the last pass delivered:
        `set_epoch` chose it again since, or ``loader.sampler.set_epoch`` chose another
        (which the next pass takes as `set_epoch`). A state must not pair that epoch with
        the last pass's progress."""
        chosen_again = self._explicit_epoch and not self._epoch_begun
        return chosen_again or self.sampler.epoch != self._known_epoch

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from `state_dict()`: the next iteration yields exactly what was left.

        The whole state is checked first: a state that is refused changes nothing (a
        running epoch goes on).
        """
        if not isinstance(state, Mapping):
            raise TypeError(
                "loader state must be the dict ImageLoader.state_dict() returned, got "
                f"{type(state).__name__}"
            )
        # A copy, checked and kept: the caller's dict changed after this call (QA) changed
        # the resume, past every check made here.
        try:
            state = copy.deepcopy(dict(state))
        except RecursionError:  # QA66: a hand-built state nested 5,000 lists deep
            raise ValueError(
                "loader state is nested too deeply to be what ImageLoader.state_dict() returned"
            ) from None
        if type(state.get("version")) is not int or state["version"] != _STATE_VERSION:
            raise ValueError(
                f"unsupported loader state version {brief(state.get('version'))}; "
                f"this gpu_loader writes version {_STATE_VERSION}"
            )
        for name in ("batch_size", "drop_last", "batching"):
            if state.get(name) != getattr(self, name):
                raise ValueError(
                    f"state was saved with {name}={brief(state.get(name))} but this loader has "
                    f"{name}={getattr(self, name)!r}; build the loader with the same settings"
                )
        if "sampler" not in state:
            raise ValueError(
                "loader state has no 'sampler' entry; pass what ImageLoader.state_dict() returned"
            )
        self.sampler.check_state(state["sampler"])
        if state["sampler"]["epoch"] >= EPOCH_LIMIT:  # as set_epoch refuses it
            raise ValueError(
                f"loader state's epoch {state['sampler']['epoch']} is not below {EPOCH_LIMIT} "
                "(per-sample random streams key on it); it was not written by this loader"
            )
        if not isinstance(state.get("epoch_done", False), bool):
            # bool("false") is True: a str from a config store skipped the epoch (QA)
            raise ValueError(
                "loader state's 'epoch_done' must be True or False, got "
                f"{brief(state['epoch_done'])}"
            )
        resume = state.get("batcher")
        if resume is not None:
            left = self._check_batcher_state(resume)
            if state.get("epoch_done") and state["sampler"].get("rank") != self.sampler.rank:
                resume = None  # an ended epoch, shared between ranks: none of it is left
            else:
                self._check_rank_progress(state)
                if state.get("epoch_done") and left:
                    # An ended epoch delivered or reported every sample; this one's resume
                    # depended on whether the loop chose the epoch again (QA43).
                    raise ValueError(
                        f"loader state says epoch {state['sampler']['epoch']} ended, but its "
                        f"'batcher' entry has {left} sample(s) neither delivered nor failed; "
                        "it was edited, or saved by an older gpu_loader after loading a state "
                        "shared between ranks (remove its 'batcher' entry to go on after "
                        "that epoch)"
                    )
        # The stopped pass is forgotten, as another epoch chosen forgets it: a state saved
        # after a loaded end-of-epoch state shared between ranks (no record to resume)
        # paired epoch_done with that pass's progress (QA50: `next(iter(loader))` before
        # loading; the next load refused it, and before that check resumed it).
        self._leave_epoch("load_state_dict() was called")
        self.sampler.load_state_dict(state["sampler"])
        self._known_epoch = self.sampler.epoch
        self._epoch_done = bool(state.get("epoch_done", False))
        self._explicit_epoch = False
        self._epoch_begun = False
        self._resume = resume
        self._restored = True
        self._closed_progress = None

    def _check_batcher_state(self, state: Any) -> int:
        """Raise now, not at the next iteration, for a batcher state this loader's epochs
        could not take (the resumed epoch builds its batcher and record the same way).
        Returns how many of the epoch's samples it has neither delivered nor failed."""
        if not isinstance(state, Mapping):
            raise ValueError(
                f"loader state's 'batcher' entry must be a dict, got {type(state).__name__}"
            )
        try:
            batcher = make_batcher(self, len(self.sampler))
            batcher.load_state_dict(state)
            Received(batcher, state)  # its failures per stage too
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"loader state has an unusable 'batcher' entry: {exc}") from exc
        return len(batcher.remaining_positions())

    def _check_rank_progress(self, state: Mapping[str, Any]) -> None:
        """A mid-epoch state records which of one rank's samples were delivered; another
        rank's samples differ (and its batches were formed from other failures and other
        timing), so taking it would drop some samples and repeat others."""
        batcher, saved = state["batcher"], state["sampler"].get("rank")
        if saved == self.sampler.rank or not (batcher.get("delivered") or batcher.get("failed")):
            return
        raise ValueError(
            f"loader state records rank {saved}'s progress through epoch "
            f"{state['sampler']['epoch']}, but this loader is rank {self.sampler.rank}: each "
            "rank must load the state it saved itself mid-epoch (save one per rank, or "
            "gather them with torch.distributed.all_gather_object); a state taken between "
            "epochs may be shared"
        )

    def failed_samples(self, epoch: int | None = None) -> list[FailedSample]:
        """Every sample not delivered so far (of ``epoch`` only, if given), with its key,
        stage and error. An epoch run again from its start replaces the records of its
        earlier (cut-short) pass."""
        if epoch is not None:
            epoch = _as_int(epoch, f"failed_samples(epoch=...) takes an int or None, got {epoch!r}")
        active = self._epoch()
        with self._lock:  # an epoch's records move into `_failed` under this lock
            done = list(self._failed)
            if active is not None and not active.reported:
                done += active.failures()
        return done if epoch is None else [f for f in done if f.epoch == epoch]

    def _failure_count(self) -> int:
        """``len(failed_samples())`` without copying the records (`stats` runs often)."""
        active = self._epoch()
        with self._lock:
            running = 0
            if active is not None and not active.reported:
                running = len(active.failures())
                if active.reported:  # closed meanwhile (the lock is re-entrant): moved in
                    running = 0
            return len(self._failed) + running

    def stats(self) -> LoaderStats:
        """A typed snapshot: throughput, stall %, GPU, CPU, memory, stages, bottleneck."""
        if self._monitor is None and self._stats_at_close is not None:
            return self._stats_at_close  # the record of the run, after `close()`
        active = self._epoch()
        engine = active.engine_stats() if active is not None else self._last_engine_stats
        # A monitor made only to read a snapshot never samples: no CUDA call for it (QA:
        # a stats() before the first epoch initialised CUDA, and a fork after it failed).
        monitor = self._monitor or _make_monitor(self, for_sampling=False)
        return monitor.stats(engine, failures=self._failure_count())

    def batching_stats(self) -> BatcherStats | None:
        """The batcher's record for the running (or last) epoch: batches, moved samples and
        their delay in batches, held-back time, and (CPU path, straggler mode) the copies
        that moved samples cost; None before the first epoch."""
        active = self._epoch()
        if active is not None:
            return active.batching_stats()
        return self._last_batcher_stats

    def close(self) -> None:
        """Stop the running epoch and the monitor's threads, and join them. Idempotent.

        The loader stays usable: the next iteration starts new threads. `stats()` answers
        with the last figures until then; the next epoch's monitor starts its counters
        (samples, batches, times) from zero, while ``failures`` and `failed_samples()`
        keep the loader's whole history.
        """
        self._stop_epoch("ImageLoader.close() was called")
        if self._gpu_worker_pool is not None:  # the decoders' device memory goes too
            self._gpu_worker_pool.clear()
        if self._logger is not None:
            self._logger.close()
            self._logger = None
        if self._monitor is not None:
            self._stats_at_close = self.stats()  # `stats()` keeps answering with it
            self._monitor.close()
            self._monitor = None

    def __enter__(self) -> ImageLoader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        # At interpreter shutdown modules may already be gone: nothing left to report to.
        with contextlib.suppress(Exception):
            self.close()

    def _stop_epoch(self, reason: str | None = None) -> None:
        active = self._epoch()
        if active is not None:
            active.close(reason)

    def _leave_epoch(self, reason: str) -> None:
        """Stop the running epoch and forget its progress: another epoch is chosen, and
        state_dict() must not pair that epoch's number with this one's progress."""
        self._stop_epoch(reason)
        self._active = None
        self._closed_progress = None

    def _epoch(self) -> EpochBase | None:
        return self._active() if self._active is not None else None

    def _monitor_for_epoch(self) -> Monitor:
        """The loader's monitor (made again after `close()`); `_start_monitoring` starts
        its samplers."""
        if self._monitor is None:
            self._monitor = _make_monitor(self)
            self._stats_at_close = None
        return self._monitor

    def _log_fields(self) -> dict[str, int | float | str]:
        """The loader's own keys on each JSON line: its epoch, and what tells one
        process's lines from another's when ranks or runs share a file or are merged (QA:
        two ranks' lines could not be told apart)."""
        import socket

        return {
            "epoch": self.epoch,
            "rank": self.sampler.rank,
            "world_size": self.sampler.world_size,
            "host": socket.gethostname(),
            "pid": os.getpid(),
        }

    def _start_monitoring(self) -> None:
        """Start the monitor's samplers (and the JSON-lines logger) for an epoch."""
        monitor = self._monitor_for_epoch()
        if self._logger is None and self.options.log_jsonl is not None:
            self._logger = JsonlLogger(
                self.options.log_jsonl,
                self.options.log_interval_s,
                source=self.stats,
                fields=self._log_fields,
            )
        monitor.start()
        if self._logger is not None:
            self._logger.start()

    # -- called by the epochs -------------------------------------------------------------
    def _make_progress(self, samples: int, monitor: Monitor) -> ProgressReporter | None:
        if not self.options.progress:
            return None
        # The monitor counts samples and failures over every epoch; this bar, this pass's
        # (``samples``: those it has left). Made before the pass starts its threads, so
        # every failure counted now is another epoch's or from before a resume (QA55: a
        # resumed bar counted those as done and reached its total early).
        return ProgressReporter(
            samples,
            desc=f"epoch {self.epoch}",
            start=monitor.rate.samples,
            start_failures=self._failure_count(),
        )

    def _pin_batches(self) -> bool:
        """Pin CPU batches that will be copied to a CUDA device (faster, asynchronous)."""
        return self._pin

    def _batch_pool(self) -> BatchPool:
        """CPU batch tensors recycled across batches and epochs (see `_batch_pool`)."""
        import torch

        h, w = self.transform.output_size
        tail = (3, h, w)
        dtype = getattr(torch, self.dtype)
        if self._pool is None or self._pool.tail != tail or self._pool.dtype != dtype:
            keep = self.options.prefetch_batches + self.options.max_delay_batches + 2
            self._pool = BatchPool(tail, dtype, keep=keep)
        return self._pool

    def _samples_per_task(self) -> int:
        """`LoaderOptions.samples_per_task` as the CPU path's epoch uses it (straggler
        mode's automatic runs are sized by `_run_sizer` instead)."""
        opts = self.options
        if opts.samples_per_task is not None:
            return opts.samples_per_task
        if self.batching == "straggler":
            return 1
        return self._most_per_task()

    def _straggler_threshold(self, name: str) -> AdaptiveThreshold:
        """Straggler mode's limit for task ``name`` (`EpochBase.straggler_threshold`).
        p75 x 4 rather than a high percentile: with 10% stragglers p95 *is* a straggler,
        and a threshold above it would never move one. The floor keeps thread churn away
        from tasks too short to matter. Kept across epochs as the run sizer is: a later
        epoch starts from what the last one measured instead of with no limit for its
        first 32 tasks."""
        threshold = self._thresholds.get(name)
        if threshold is None:
            threshold = AdaptiveThreshold(percentile=0.75, factor=4.0, floor_s=STRAGGLER_FLOOR_S)
            self._thresholds[name] = threshold
        return threshold

    def _run_sizer(self) -> RunSizer | None:
        """Straggler mode's run sizes on the CPU path, with `samples_per_task` automatic:
        kept across epochs, so an epoch starts from what the last one measured."""
        if self.batching != "straggler" or self.options.samples_per_task is not None:
            return None
        if self.options.cost_lookahead > 1:
            # Its start order puts a block's largest files next to each other: in runs,
            # one thread would decode them one after another instead of all at once.
            return None
        most = self._most_per_task()
        if most <= 1:
            return None
        if self._sizer is None or self._sizer.most != most:
            cap = self._most_per_task(MOST_LONG)
            self._sizer = RunSizer(most, lengths=RunLength(most, cap) if cap > most else None)
        return self._sizer

    def _run_length(self) -> RunLength | None:
        """The CPU path's run lengths, with `samples_per_task` automatic: longer than
        `_most_per_task` while samples are cheap (`RunLength`); kept across epochs, as the
        run sizer is. In straggler mode the sizer's, which it follows while runs are on."""
        if self.options.samples_per_task is not None:
            return None
        if self.batching == "straggler":
            sizer = self._run_sizer()
            return sizer.lengths if sizer is not None else None
        base, cap = self._most_per_task(), self._most_per_task(MOST_LONG)
        if cap <= base:
            return None
        if self._length is None or (self._length.base, self._length.cap) != (base, cap):
            self._length = RunLength(base, cap)
        return self._length

    def _most_per_task(self, most: int = 8) -> int:
        # Two runs per thread fit in the in-flight window, so no thread waits for work,
        # and a batch's reads spread over every I/O thread (a run reads one file after
        # another: with slow remote reads a long run delays its batch).
        threads = self.io_threads + self.decode_threads
        return max(
            1, min(most, self._window() // (2 * threads), self.batch_size // self.io_threads)
        )

    def _window(self) -> int:
        """Samples an epoch keeps in flight: (D + 1) * B lets fast samples run ahead by the
        full lateness bound D, plus the batches prefetched (the batching README shows a
        smaller window can deadlock)."""
        opts = self.options
        return self.batch_size * (opts.prefetch_batches + opts.max_delay_batches + 1)

    def _sample_spares(self) -> collections.deque[torch.Tensor]:
        """Straggler mode's private sample tensors (CPU path), kept across epochs."""
        key = (self.transform.output_size, self.dtype)
        if self._spares is None or self._spares[0] != key:
            self._spares = (key, collections.deque())
        return self._spares[1]

    def _gpu_ports(self) -> GpuPorts:
        """The GPU path's ports: the options' own, or the CUDA ones made once per loader
        (`cuda_ports` returns a new object each call, and the arenas and the worker pool
        are kept across epochs only while the ports are the same object)."""
        if self.options.gpu_ports is not None:
            return self.options.gpu_ports
        if self._cuda_ports is None:
            from gpu_loader.cuda import cuda_ports

            self._cuda_ports = cuda_ports(self.device)
        return self._cuda_ports

    def _gpu_arenas(self, ports: GpuPorts) -> tuple[PinnedArena, PinnedArena]:
        """The pinned arenas, made once and reused every epoch: one for fetched bytes, and
        one a quarter of its size for decoded non-JPEG pixels on their way to the GPU
        (allocated at its first use)."""
        from gpu_loader.cuda import PinnedArena

        if self._arenas is None or self._arena_ports is not ports:
            alloc = ports.runtime.alloc_pinned
            self._arenas = (
                PinnedArena(self.options.arena_bytes, allocator=alloc),
                PinnedArena(self.options.arena_bytes // 4, allocator=alloc, lazy=True),
            )
            self._arena_ports = ports
        return self._arenas

    def _drop_gpu_arenas(self, arena: PinnedArena) -> None:
        """Stop reusing the arenas ``arena`` belongs to (a thread may still use them)."""
        if self._arenas is not None and self._arenas[0] is arena:
            self._arenas = None

    def _gpu_workers(self, ports: GpuPorts) -> WorkerPool:
        """GPU worker states (stream + decoder), kept across epochs like the arena."""
        from gpu_loader.cuda import WorkerPool

        pool = self._gpu_worker_pool
        if pool is None or pool.ports is not ports:
            pool = self._gpu_worker_pool = WorkerPool(ports)
        return pool

    def _decode_on_gpu(self) -> bool:
        mode = self.options.decode_on
        if mode == "gpu" and self.device.type != "cuda" and self.options.gpu_ports is None:
            raise ValueError(
                "LoaderOptions(decode_on='gpu') needs device='cuda' (or gpu_ports for tests); "
                f"this loader's device is {self.device}"
            )
        on_gpu = self.decodes_on_gpu
        self._check_cpu_only(on_gpu)
        return on_gpu

    @property
    def decodes_on_gpu(self) -> bool:
        """Whether batches take the GPU decode path: ``LoaderOptions(decode_on="gpu")``,
        or ``"auto"`` on a CUDA device unless the loader asks for what only the CPU path
        does (an ``augment`` function)."""
        mode = self.options.decode_on
        auto_gpu = self.device.type == "cuda" and not self._cpu_only()
        return mode == "gpu" or (mode == "auto" and auto_gpu)

    def _check_cpu_only(self, on_gpu: bool) -> None:
        """Refuse, on the GPU decode path, what only the CPU path does."""
        if on_gpu and (why := self._cpu_only()):
            raise ValueError(why)

    def _cpu_only(self) -> str | None:
        """Why this loader needs the CPU decode path (as the GPU path's refusal): an
        ``augment`` function; None where it does not."""
        if self.augment is None:
            return None
        return (
            "`augment` runs on the CPU decode path only (the GPU path decodes and "
            "transforms whole batches in one kernel); leave LoaderOptions(decode_on=...) "
            "at 'auto' or 'cpu', or augment the batch on the device in the training loop"
        )

    def _epoch_closed(
        self,
        epoch: EpochBase,
        records: list[FailedSample],
        engine_stats: Any,
        batcher_stats: BatcherStats,
    ) -> None:
        latest = epoch.pass_number == self._passes  # no newer pass has started
        if latest:
            self._closed_progress = epoch.received
        texts = self._failure_texts  # keys too: ImageFolder builds each key on each call
        records = [
            replace(f, key=texts.setdefault(f.key, f.key), error=texts.setdefault(f.error, f.error))
            for f in records
        ]
        with self._lock:
            self._failed.extend(records)
            epoch.reported = True  # `failed_samples` now finds its records in `_failed`
            if latest:
                self._last_engine_stats = engine_stats
                self._last_batcher_stats = batcher_stats
        if not latest:
            return  # closed late (an abandoned pass): the monitor is the newer pass's now
        # No thread outlives an epoch: the samplers and the logger start again with the next.
        # The monitor first: its samplers take their last readings as they stop, which the
        # log's last line must carry (QA55: an epoch under the 0.5 s sampling interval
        # logged no cpu_percent at all, while stats() had one).
        logger, self._logger = self._logger, None
        try:
            if self._monitor is not None:
                self._monitor.suspend()
        finally:  # whatever stopping the monitor raised, the log gets its last line
            if logger is not None:
                logger.close()

    def _epoch_finished(self) -> None:
        self._epoch_done = True


class _EpochBatches(itertools.chain["Batch"]):
    """What ``iter(loader)`` returns: the epoch's generator, with a length as
    DataLoader's iterator has one (``tqdm(iter(loader))``, ``len(it)``): the batches this
    pass owes, which is `len(loader)` less those a resumed epoch had handed over. A pass
    yields that many unless whole batches' samples failed (and no other batch was left to
    split); a distributed one always does. ``close``, ``send`` and ``throw`` are the
    generator's. Each ``iter(loader)`` starts a pass: ask the length of the iterator
    that is looped over.

    ``next()`` is `itertools.chain`'s, in C: a Python ``__next__`` around the generator
    was a frame in which a Ctrl-C could land after the batch was recorded as handed over
    and before the loop had it (QA66: the resume then skipped that batch's samples)."""

    __slots__ = ("__weakref__", "_gen", "_len")
    _gen: Generator[Batch, None, None]
    _len: int

    def __new__(cls, gen: Generator[Batch, None, None], length: int) -> _EpochBatches:
        self = super().__new__(cls, gen)
        self._gen = gen
        self._len = length
        return self

    def __len__(self) -> int:
        return self._len

    def send(self, value: None) -> Batch:
        return self._gen.send(value)

    def throw(
        self,
        typ: BaseException | type[BaseException],
        val: object = None,
        tb: TracebackType | None = None,
    ) -> Batch:
        if val is None and tb is None:
            return self._gen.throw(typ)
        return self._gen.throw(typ, val, tb)  # type: ignore[arg-type]  # as generators take

    def close(self) -> None:
        """Stop the epoch, as leaving a ``for`` loop does."""
        self._gen.close()

    def __reduce__(self) -> NoReturn:
        # itertools.chain's own would copy or pickle the bare generator (QA70: copy.copy
        # failed on __new__'s arguments instead), and its __setstate__ below would swap
        # in another iterable behind the epoch's back.
        raise TypeError(
            "an ImageLoader's epoch iterator cannot be copied or pickled: save "
            "loader.state_dict() and resume from it"
        )

    def __setstate__(self, state: object) -> NoReturn:
        raise TypeError("an ImageLoader's epoch iterator cannot be restored from a state")


def _no_batches() -> Generator[Batch, None, None]:
    yield from ()


def _close_abandoned(epoch: EpochBase) -> None:
    """Close an epoch whose iterator was dropped before it started, from a thread of its
    own: this runs wherever the garbage collector freed the iterator, which may be inside
    a section holding a lock that closing takes (the loader's, a monitor's)."""
    closer = threading.Thread(target=epoch.close, name="gpu_loader-close-abandoned", daemon=True)
    with contextlib.suppress(RuntimeError):  # the interpreter is exiting: no new threads
        closer.start()


def _as_int(value: object, refusal: str) -> int:
    """``value`` as an int (an int or a numpy integer, not a bool); TypeError(refusal)."""
    if isinstance(value, bool):
        raise TypeError(refusal)
    try:
        return operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        raise TypeError(refusal) from None


# DataLoader arguments a migrating training script passes, and what takes their place.
_DATALOADER_ARGS = {
    "num_workers": "use LoaderOptions(decode_threads=n) (threads, not processes; default: "
    "the CPU count)",
    "pin_memory": "use LoaderOptions(pin_memory=True)",
    "pin_memory_device": "not needed (batches arrive on `device`, staged in pinned "
    "memory on their way to a CUDA one; LoaderOptions(pin_memory=True) pins batches that "
    "stay on the CPU)",
    "prefetch_factor": "use LoaderOptions(prefetch_batches=n), in batches for the loader",
    "persistent_workers": "not needed (threads start with each epoch, in milliseconds)",
    "collate_fn": "not supported (batches are always images [B, 3, H, W] and int64 labels "
    "[B]; change them in the training loop)",
    "batch_sampler": "use batch_size=, drop_last=, shuffle=, seed=, rank= and world_size=",
    "generator": "use seed=",
    "worker_init_fn": "not needed (there are no worker processes)",
    "multiprocessing_context": "not needed (there are no worker processes)",
    "timeout": "use LoaderOptions(batch_timeout_s=seconds) (None: wait as long as it takes)",
    "in_order": "use batching='ordered' (the default) or 'straggler'",
}


def _check_sampler_args(
    shuffle: bool, rank: int | None, world_size: int | None, sample_weights: Any
) -> None:
    """What cannot go with ``sampler=``: it decides the order and shards for itself."""
    if shuffle:
        raise ValueError(
            "`sampler` decides the order: leave `shuffle` unset (as DataLoader, which "
            "refuses sampler= with shuffle=True)"
        )
    if rank is not None or world_size is not None:
        raise ValueError(
            "`sampler` shards for itself (give each rank's sampler its rank, as "
            "DistributedSampler takes them): `rank` and `world_size` shard the loader's "
            "own order, so leave them unset"
        )
    if sample_weights is not None:
        raise ValueError(
            "`sample_weights` and `sampler` both decide which samples an epoch draws: "
            "give one (a WeightedRandomSampler as `sampler`, or the weights)"
        )


def _dataloader_kwargs_advice(kwargs: Mapping[str, object]) -> str:
    lines = []
    for name in kwargs:
        advice = _DATALOADER_ARGS.get(name)
        if advice is None:
            return f"ImageLoader() got an unexpected keyword argument {name!r}"
        lines.append(f"no `{name}` (a DataLoader argument): {advice}")
    return "ImageLoader() takes " + "; ".join(lines)


def _resolve_device(device: str) -> torch.device:
    import torch

    from gpu_loader.cuda import cuda_available

    if device == "auto":
        return torch.device("cuda" if cuda_available() else "cpu")
    try:
        resolved = torch.device(device)
    except (RuntimeError, TypeError):  # torch lists every backend it knows; say what fits
        resolved = None
    if resolved is None or resolved.type not in ("cpu", "cuda"):
        raise ValueError(f"`device` must be 'cpu', 'cuda', 'cuda:N' or 'auto', got {device!r}")
    if resolved.type == "cuda" and not cuda_available():
        raise RuntimeError(
            f"device={device!r} was asked for but no CUDA device is usable here; "
            "use device='cpu' or device='auto'"
        )
    return resolved


def _pin_batches(device: torch.device, pin_memory: bool | None) -> bool:
    """Whether the CPU path's batch tensors are pinned (`LoaderOptions.pin_memory`)."""
    if device.type == "cuda":
        return pin_memory is not False
    if not pin_memory:
        return False
    import torch

    if torch.cuda.is_available():
        return True
    _log.warning("pin_memory=True has no effect here: torch sees no CUDA device")
    return False


def _default_io_threads(source: SampleIndex) -> int:
    """Reads through fsspec wait on the network, so they get more threads than local files."""
    from gpu_loader.sources._io import local_path

    remote = len(source) > 0 and local_path(source.key(0)) is None
    return 16 if remote else 2


def _make_monitor(loader: ImageLoader, *, for_sampling: bool = True) -> Monitor:
    """NVML sampling of the loader's GPU when the device is CUDA, else of every GPU there is
    (the CPU path may be feeding one); without NVML the report says "no GPU" once. Which
    GPU is found through torch, which initialises CUDA: only for a monitor that will
    sample (an epoch's, which initialises CUDA anyway)."""
    if not loader.options.monitor_gpu:
        return Monitor(MonitorConfig(gpu="off"))
    devices = uuids = None
    if loader.device.type == "cuda" and for_sampling:
        index = _cuda_index(loader.device)
        devices = nvml_indices_for_cuda([index])  # the fallback: a MIG instance, old torch
        uuid = _cuda_uuid(index)
        uuids = (uuid,) if uuid else None
    return Monitor(MonitorConfig(gpu="auto", gpu_devices=devices, gpu_uuids=uuids))


def _cuda_uuid(index: int) -> str | None:
    """The device's UUID as torch reads it from the driver (NVML's, less its "GPU-"):
    names it whatever ``CUDA_VISIBLE_DEVICES`` and ``CUDA_DEVICE_ORDER`` say. None
    without usable CUDA (the monitor then maps the index)."""
    import torch

    try:
        return str(torch.cuda.get_device_properties(index).uuid) or None
    except Exception:  # torch without CUDA, or older than `uuid`: the index decides then
        return None


def _cuda_index(device: torch.device) -> int:
    """The CUDA device a plain "cuda" means: torch's current one (what the copies and the
    GPU path's streams use; DDP sets it per rank with `torch.cuda.set_device`), not 0."""
    if device.index is not None:
        return device.index
    import torch

    try:
        return int(torch.cuda.current_device())
    except (RuntimeError, AssertionError):  # no usable CUDA: the monitor says "no GPU"
        return 0
