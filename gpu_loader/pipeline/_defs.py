"""Stage configuration: the skip marker, the slow-lane hook and validated stage specs.

Specs are frozen dataclasses checked in ``__post_init__`` so a bad argument fails at
``pipe(...)``, where the user wrote it, not later on a worker thread.
"""

from __future__ import annotations

import inspect
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, Protocol, runtime_checkable

OutputOrder = Literal["input", "completion"]
_ORDERS = ("input", "completion")


class _Marker:
    """The type of the engine's markers (:data:`SKIP`, :data:`IDLE`): one instance per
    name, so ``x is SKIP`` works, also after a copy or a pickle round trip."""

    _instances: ClassVar[dict[str, _Marker]] = {}
    _name: str

    def __new__(cls, name: str) -> _Marker:
        marker = cls._instances.get(name)
        if marker is None:
            marker = cls._instances[name] = super().__new__(cls)
            marker._name = name
        return marker

    def __repr__(self) -> str:
        return self._name

    def __reduce__(self) -> str:
        return self._name


SKIP = _Marker("SKIP")
"""Return this from an op to drop the item without counting a failure."""

IDLE = _Marker("IDLE")
"""Yielded by ``Pipeline.iterate(idle_s=...)`` when no output arrived for ``idle_s`` seconds."""


@runtime_checkable
class LaneThreshold(Protocol):
    """How long a task may run on the fast lane before its worker moves to the slow lane.

    The engine calls ``observe`` with the duration (seconds, measured with the stage's
    clock; per unit of weight when the lane has a `SlowLane.weight`) of every finished task and ``limit`` from its watchdog thread. Both calls are
    made under the stage's lock, so implementations need no locking of their own.
    """

    def observe(self, duration_s: float) -> None:
        """Record one finished task's duration."""

    def limit(self) -> float | None:
        """The current limit in seconds, or None while no limit is known yet."""


@dataclass(frozen=True)
class SlowLane:
    """A slow lane for a ``pipe`` stage (needs ``output_order="completion"``).

    When a task on a fast-lane worker has run longer than ``threshold.limit()``, the
    worker moves to the slow lane (its task keeps running, it is never restarted) and a
    replacement worker starts, so the fast lane stays at ``concurrency``. At most
    ``max_threads`` workers are in the slow lane at once; when it is full nothing moves
    and the stage runs at reduced strength. A slow-lane worker exits after its task.
    """

    max_threads: int
    """Most workers in the slow lane at once (>= 1)."""
    threshold: LaneThreshold
    """Decides when a running task is too slow (see :class:`LaneThreshold`)."""
    clock: Callable[[], float] = time.monotonic
    """Seconds, monotonic; injectable so tests can script time."""
    poll_s: float = 0.002
    """The watchdog's shortest sleep: it checks running tasks when the oldest could pass
    the limit, at least ``poll_s`` and at most ``10 * poll_s`` apart."""
    weight: Callable[[Any], float] | None = None
    """A task's size, for stages whose items are of different sizes (runs of samples,
    say): the threshold observes each task's duration divided by its weight, and a task
    moves once it has run ``limit() * weight``. None: every task weighs 1. Weights must
    be >= 1 (the watchdog sleeps as long as a task of weight 1 needs to pass the limit);
    a weight function that raises or breaks that stops the run, as an engine error
    does."""

    def __post_init__(self) -> None:
        if isinstance(self.max_threads, bool) or not isinstance(self.max_threads, int):
            raise TypeError(f"`max_threads` must be an int, got {self.max_threads!r}")
        if self.max_threads < 1:
            raise ValueError(
                f"`max_threads` must be >= 1, got {self.max_threads}; "
                "leave `slow_lane=None` for no slow lane"
            )
        if not isinstance(self.threshold, LaneThreshold):
            raise TypeError(
                "`threshold` must have `observe(duration_s)` and `limit()` methods "
                f"(the LaneThreshold protocol), got {type(self.threshold).__name__}"
            )
        if not callable(self.clock):
            raise TypeError(f"`clock` must be a callable returning seconds, got {self.clock!r}")
        if not 0 < self.poll_s <= threading.TIMEOUT_MAX / 10:  # inf killed the watchdog (QA52)
            raise ValueError(f"`poll_s` must be > 0 seconds and finite, got {self.poll_s}")
        if self.weight is not None and not callable(self.weight):
            raise TypeError(f"`weight` must be a callable or None, got {self.weight!r}")


def check_max_failures(value: int | float | None) -> None:
    if value is None:
        return
    if isinstance(value, bool):
        raise TypeError(f"`max_failures` must be an int, a float in (0, 1] or None, got {value}")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"`max_failures` must be >= 0 as a count, got {value}")
        return
    if isinstance(value, float):
        if not 0.0 < value <= 1.0:  # 1.0: every sample may fail, as None
            raise ValueError(
                f"`max_failures` as a rate must be in (0, 1], got {value}; pass an int for a "
                "count, or None for no limit"
            )
        return
    raise TypeError(f"`max_failures` must be an int, a float in (0, 1] or None, got {value!r}")


def op_name(op: Callable[..., Any]) -> str:
    """A readable default stage name for ``op``."""
    name = getattr(op, "__name__", None)
    if isinstance(name, str):
        return name
    inner = getattr(op, "func", None)  # functools.partial
    if inner is not None:
        return op_name(inner)
    return type(op).__name__


def _is_generator_op(op: Callable[..., Any]) -> bool:
    if inspect.isgeneratorfunction(op):
        return True
    return inspect.isgeneratorfunction(type(op).__call__)


def _is_async_op(op: Callable[..., Any]) -> bool:
    if inspect.iscoroutinefunction(op) or inspect.isasyncgenfunction(op):
        return True
    call = type(op).__call__
    return inspect.iscoroutinefunction(call) or inspect.isasyncgenfunction(call)


def check_failures_before(value: object) -> None:
    """``(calls, failures)``: two ints, ``0 <= failures <= calls``."""
    pair = value if isinstance(value, tuple) and len(value) == 2 else (-1, -1)
    whole = all(isinstance(v, int) and not isinstance(v, bool) for v in pair)
    if not whole or not 0 <= pair[1] <= pair[0]:
        raise ValueError(
            f"`failures_before` must be (calls, failures) with 0 <= failures <= calls, "
            f"got {value!r}"
        )


@dataclass(frozen=True)
class PipeSpec:
    """A validated ``pipe(...)`` stage."""

    op: Callable[..., Any]
    name: str
    concurrency: int = 1
    output_order: OutputOrder = "input"
    max_failures: int | float | None = None
    key_fn: Callable[[Any], object] | None = None
    worker_init: Callable[[], Any] | None = None
    slow_lane: SlowLane | None = None
    failures_before: tuple[int, int] = (0, 0)
    is_generator: bool = field(init=False)

    def __post_init__(self) -> None:
        if not callable(self.op):
            raise TypeError(f"`op` must be callable, got {self.op!r}")
        if _is_async_op(self.op):
            raise TypeError(
                f"`op` {self.name!r} is async; the engine runs ops on threads, "
                "pass a plain or generator function"
            )
        if isinstance(self.concurrency, bool) or not isinstance(self.concurrency, int):
            raise TypeError(f"`concurrency` must be an int, got {self.concurrency!r}")
        if self.concurrency < 1:
            raise ValueError(f"`concurrency` must be >= 1, got {self.concurrency}")
        if self.output_order not in _ORDERS:
            raise ValueError(f"`output_order` must be one of {_ORDERS}, got {self.output_order!r}")
        check_max_failures(self.max_failures)
        check_failures_before(self.failures_before)
        if self.key_fn is not None and not callable(self.key_fn):
            raise TypeError(f"`key_fn` must be callable or None, got {self.key_fn!r}")
        if self.worker_init is not None and not callable(self.worker_init):
            raise TypeError(f"`worker_init` must be callable or None, got {self.worker_init!r}")
        if self.slow_lane is not None:
            if not isinstance(self.slow_lane, SlowLane):
                raise TypeError(f"`slow_lane` must be a SlowLane or None, got {self.slow_lane!r}")
            if self.output_order != "completion":
                raise ValueError(
                    f"stage {self.name!r}: a slow lane reorders results, so it needs "
                    f'output_order="completion", got {self.output_order!r}'
                )
        object.__setattr__(self, "is_generator", _is_generator_op(self.op))


@dataclass(frozen=True)
class AggregateSpec:
    """A validated ``aggregate(n, drop_last=...)`` stage."""

    size: int
    drop_last: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.size, bool) or not isinstance(self.size, int):
            raise TypeError(f"aggregate size must be an int, got {self.size!r}")
        if self.size < 1:
            raise ValueError(f"aggregate size must be >= 1, got {self.size}")
        if not isinstance(self.drop_last, bool):
            raise TypeError(f"`drop_last` must be a bool, got {self.drop_last!r}")


@dataclass(frozen=True)
class DisaggregateSpec:
    """A ``disaggregate()`` stage: each incoming sequence is emitted item by item."""
