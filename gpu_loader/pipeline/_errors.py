"""Failure records, the failure policy of a stage and the error raised to the consumer."""

from __future__ import annotations

import builtins
import contextlib
import inspect
import math
import reprlib
import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from gpu_loader._compat import add_note as add_note  # its home before _compat

if sys.version_info >= (3, 11):
    _ExceptionGroup = builtins.ExceptionGroup
else:  # pragma: no cover - Python 3.10 uses the backport
    from exceptiongroup import ExceptionGroup as _ExceptionGroup

# A rate limit (`max_failures=0.05`) is only checked after this many calls of the stage,
# so one early failure in ten calls does not stop a run; at end of stream it is always checked.
RATE_WARMUP_CALLS = 100
# Before the end, a rate stops the run only when it is above the limit beyond doubt: the
# lower end of the failure rate's Wilson interval at this z (99.9% two-sided) is above it.
# Judged on the running rate alone, a stream whose whole rate was under the limit stopped
# by chance (QA: 25% corrupt files against max_failures=0.3, 33 of the first 101 failed).
RATE_EARLY_Z = 3.29


def rate_clearly_over(failed: int, calls: int, limit: float) -> bool:
    """Whether ``failed`` of ``calls`` shows a failure rate above ``limit`` with 99.9%
    confidence (the Wilson score interval's lower bound), after the warm-up calls."""
    if calls < RATE_WARMUP_CALLS or failed <= limit * calls:
        return False
    n, z2 = float(calls), RATE_EARLY_Z * RATE_EARLY_Z
    p = failed / n
    spread = RATE_EARLY_Z * math.sqrt(p * (1.0 - p) / n + z2 / (4.0 * n * n))
    return (p + z2 / (2.0 * n) - spread) / (1.0 + z2 / n) > limit


def rate_passed(failed: int, calls: int, limit: float, *, final: bool) -> bool:
    """Whether a rate ``limit`` stops the run: at the end (``final``) the whole rate is over
    it; before, it is `rate_clearly_over`."""
    # A quotient, not `failed > limit * calls`: 0.29 * 100 is 28.999999999999996, so 29
    # failures of 100 passed a limit of 0.29 (QA52).
    return failed / max(calls, 1) > limit if final else rate_clearly_over(failed, calls, limit)


# PipelineFailure carries at most this many causes; all of them stay in `failures()`.
MAX_CAUSES = 64

_repr = reprlib.Repr()
_repr.maxstring = 60
_repr.maxother = 60


class PipelineFailure(_ExceptionGroup[Exception]):  # type: ignore[misc]
    """Raised to the consumer when a stage passes its ``max_failures`` (or fails fatally).

    Each cause carries a note ``"stage: <name>, sample: <key>"`` and its original traceback.
    ``limit_reached`` tells the two apart: True when failures passed ``max_failures``
    (more tolerance would let the run go on), False for a fatal error of a stage.
    """

    limit_reached: bool = False

    def derive(self, excs: Sequence[Exception]) -> PipelineFailure:  # type: ignore[override]
        derived = PipelineFailure(self.message, excs)
        derived.limit_reached = self.limit_reached
        return derived


def limit_failure(message: str, causes: Sequence[Exception]) -> PipelineFailure:
    """A `PipelineFailure` for failures past ``max_failures`` (``limit_reached``)."""
    failure = PipelineFailure(message, causes)
    failure.limit_reached = True
    return failure


def release_locals(exc: BaseException) -> None:
    """Drop the local variables of the finished frames in ``exc``'s traceback, and in its
    cause, context and (for a group) members; the traceback itself stays printable.

    A recorded failure lives until the epoch ends, and its frames' locals would keep the
    failed item alive with it: with 200 MB files, 200 MB per bad file (a QA run grew to
    5 GB over 24 of them). Frames still running (the stage's own loop) and the frames of
    generators and coroutines are left as they are. For failures that are kept, not for
    one raised to the caller (whose locals a debugger may want).
    """
    todo: list[BaseException | None] = [exc]
    seen: set[int] = set()
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        tb = e.__traceback__
        while tb is not None:
            # Not a generator's or coroutine's frame: clearing a suspended one closes it
            # (a worker's own coroutine that an op resumes would end).
            if not tb.tb_frame.f_code.co_flags & _SUSPENDABLE:
                with contextlib.suppress(RuntimeError):  # still running: left as it is
                    tb.tb_frame.clear()
            tb = tb.tb_next
        todo += [e.__cause__, e.__context__]
        members = getattr(e, "exceptions", None)
        if isinstance(members, tuple):
            todo += [m for m in members if isinstance(m, BaseException)]


_SUSPENDABLE = inspect.CO_GENERATOR | inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR


@dataclass(frozen=True)
class FailureRecord:
    """One item dropped because an op raised."""

    stage: str
    """Name of the stage whose op raised."""
    key: str
    """The item's key: ``key_fn(item)``, else its ``key`` attribute, else a short repr."""
    error: BaseException
    """The exception, with its traceback and a note naming stage and key."""

    @property
    def error_text(self) -> str:
        """``"ExcType: message"``."""
        return error_text(self.error)

    def __str__(self) -> str:
        return self.error_text


def error_text(exc: BaseException) -> str:
    """``"ExcType: message"``, also for an error whose ``__str__`` raises: formatting one in
    a stage thread's error handling killed the thread before it reported, and the
    consumer waited forever (QA52)."""
    try:
        text = str(exc)
    except Exception as inner:
        text = f"<str() raised {type(inner).__name__}>"
    return f"{type(exc).__name__}: {text}"


def item_key(item: object, key_fn: Callable[[Any], object] | None) -> str:
    """The key used in failure records (see :attr:`FailureRecord.key`)."""
    if key_fn is not None:
        try:
            return str(key_fn(item))
        except Exception as exc:  # a broken key_fn must not hide the real failure
            return f"{_repr.repr(item)} (key_fn raised {type(exc).__name__})"
    key = getattr(item, "key", None)
    if key is not None and not callable(key):
        try:
            return str(key)
        except Exception as exc:  # nor a key that cannot be shown (QA52: a fatal error)
            return f"{_repr.repr(item)} (str() of its key raised {type(exc).__name__})"
    return _repr.repr(item)


def _describe_limit(limit: int | float) -> str:
    if isinstance(limit, float):
        return f"failure rate above {limit:g}"
    return f"more than {limit} failure{'s' if limit != 1 else ''}"


class FailurePolicy:
    """Counts one stage's calls and failures and decides when the pipeline must stop.

    ``before``: (calls, failures) of this stage already counted against ``limit``, by
    an earlier run of the same stream (a resumed epoch): the limit applies to the whole.
    """

    def __init__(
        self, stage: str, limit: int | float | None, before: tuple[int, int] = (0, 0)
    ) -> None:
        self._stage = stage
        self._limit = limit
        self._calls_before, self._failed_before = before
        self._lock = threading.Lock()
        self._records: list[FailureRecord] = []
        self._tripped = False  # the limit error is returned once, so the first one wins

    def record(self, record: FailureRecord, calls: int) -> PipelineFailure | None:
        """Store ``record``; return the error to raise if the limit is now passed.

        ``calls`` is the stage's number of calls so far, this one included.
        """
        with self._lock:
            self._records.append(record)
            # Never fewer calls than failures: a thread that numbered its call before
            # another thread's failure may record after it.
            return self._check(max(calls, len(self._records)), final=False)

    def check_start(self) -> PipelineFailure | None:
        """Before the first call: the failures counted ``before`` may pass the limit
        already (a resume under a lower ``max_failures``). They were checked only at the
        next failure or the end, so a stream with no new failure ran to its end first
        (QA52)."""
        with self._lock:
            return self._check(0, final=False)

    def check_final(self, calls: int) -> PipelineFailure | None:
        """At end of stream: check a rate limit whatever the number of calls."""
        with self._lock:
            return self._check(calls, final=True)

    def records(self) -> list[FailureRecord]:
        with self._lock:
            return list(self._records)

    def failures(self) -> int:
        with self._lock:
            return len(self._records)

    def _check(self, calls: int, *, final: bool) -> PipelineFailure | None:
        limit, failed = self._limit, len(self._records) + self._failed_before
        calls += self._calls_before
        if limit is None or failed == 0 or self._tripped:
            return None
        if isinstance(limit, float):
            if not rate_passed(failed, calls, limit, final=final):
                return None
            detail = f"{failed} of {calls} items failed"
        else:
            if failed <= limit:
                return None
            detail = f"{failed} item{'s' if failed > 1 else ''} failed"
        self._tripped = True
        causes = [r.error for r in self._records[:MAX_CAUSES] if isinstance(r.error, Exception)]
        if not causes:  # all of them before a resume, whose state keeps no errors
            before = self._failed_before
            causes = [
                RuntimeError(
                    f"{before} failure(s) of stage {self._stage!r} before the point this "
                    "run resumed from (their errors were not saved)"
                    if before
                    else f"stage {self._stage!r} failed"
                )
            ]
        return limit_failure(
            f"stage {self._stage!r}: {_describe_limit(limit)} ({detail}); "
            "raise `max_failures` to tolerate more; every failure is recorded "
            "(Pipeline.failures(), or failed_samples() on an ImageLoader)",
            causes,
        )
