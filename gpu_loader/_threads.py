"""Threads and Ctrl-C: joining threads an interrupt kept from starting, raising an
interrupt again once a generator's finalizer (where it cannot propagate) has returned, and
holding one back from code that cannot take it."""

from __future__ import annotations

import _thread
import contextlib
import signal
import sys
import threading
import time
from collections.abc import Iterator
from types import FrameType
from typing import Any

THREAD_PREFIX = "gpu_loader-"
"""Every thread the loader starts is named with it (the engine's, the batcher, samplers)."""


def loader_thread() -> bool:
    """Whether the calling thread is one the loader started."""
    return threading.current_thread().name.startswith(THREAD_PREFIX)


def join_started(thread: threading.Thread, timeout: float | None = None) -> None:
    """``thread.join(timeout)``, or nothing for a thread that never started.

    A KeyboardInterrupt between creating a thread and its ``start()`` leaves one that
    ``join`` refuses ("cannot join thread before it is started"); raised from a cleanup
    that error replaced the interrupt (QA: Ctrl-C during an epoch's start-up ended the
    script with a RuntimeError, so an ``except KeyboardInterrupt`` never ran).
    """
    if thread.ident is None:  # start() never ran: nothing to wait for
        return
    # Started, but the interrupt cut `start()`'s wait for the new thread to say so: `join`
    # refuses it until it does (QA: about once per 1,000 Ctrl-Cs). It runs soon; wait
    # for that, within the timeout (at most a second without one).
    deadline = time.monotonic() + (1.0 if timeout is None else timeout)
    while True:
        try:
            thread.join(None if timeout is None else max(0.0, deadline - time.monotonic()))
            return
        except RuntimeError as exc:
            if "before it is started" not in str(exc):
                raise
        if time.monotonic() >= deadline:
            return  # it never said it started: nothing to wait for
        time.sleep(0.001)


def interrupt_main_after(inside: FrameType) -> None:
    """Raise KeyboardInterrupt in the main thread once ``inside`` is off its stack.

    For an interrupt caught in a generator's finalizer (a ``break`` closes the iterator
    there): raised from it, Python prints "Exception ignored" and the program goes on;
    raised at once with ``_thread.interrupt_main`` it lands in the same finalizer. A
    helper thread waits until the main thread has left that frame (the frame itself: a
    new epoch runs the same code at once), at most 2 s.
    """
    main = threading.main_thread().ident

    def wait_then_interrupt(frame: FrameType) -> None:
        try:
            deadline = time.monotonic() + 2.0
            while time.monotonic() < deadline:
                top = sys._current_frames().get(main or 0)
                while top is not None and top is not frame:
                    top = top.f_back
                if top is None:
                    break
                del top
                time.sleep(0.001)
        except Exception:  # QA once saw the frame walk fail; the interrupt must not be lost
            pass
        finally:
            interrupt_main_now()

    threading.Thread(
        target=wait_then_interrupt, args=(inside,), name="gpu_loader-interrupt", daemon=True
    ).start()


def set_through_interrupts(event: threading.Event) -> bool:
    """``event.set()``, again if a Ctrl-C stopped it before it took effect; True when a
    Ctrl-C came meanwhile (the caller raises it once its cleanup is done).

    The loader's events hold a Ctrl-C back while they set (`InterruptSafeEvent`), but one
    can still land just before that hold begins: the event was then never set, and a
    join of the thread waiting on it took its full 10 s (QA)."""
    interrupted = False
    while not event.is_set():
        try:
            event.set()
        except KeyboardInterrupt:
            interrupted = True
    return interrupted


def rescue_lost_interrupts() -> None:
    """Deliver again a Ctrl-C that Python would drop: one landing in a weakref callback
    or a finalizer run by the main thread is printed as "Exception ignored" and lost,
    and the loader's threads make such callbacks often (each `threading.Thread` freed
    runs one; QA: about 1 in 100 Ctrl-Cs in a loop of short epochs). Installs a
    `sys.unraisablehook` that hands everything else to the hook it wraps; again if
    another hook has replaced it since (each epoch calls this)."""
    global _rescue_hook
    with _rescue_lock:
        if sys.unraisablehook is _rescue_hook:
            return
        previous = sys.unraisablehook

        def hook(unraisable: Any) -> None:
            if (
                isinstance(unraisable.exc_type, type)
                and issubclass(unraisable.exc_type, KeyboardInterrupt)
                and threading.current_thread() is threading.main_thread()
            ):
                # From a thread, once this callback has returned: raised here it would
                # land in the same callback.
                threading.Timer(0.001, interrupt_main_now).start()
                return
            previous(unraisable)

        sys.unraisablehook = _rescue_hook = hook


_rescue_hook: Any = None
_rescue_lock = threading.Lock()


def interrupt_main_now() -> None:
    """Deliver SIGINT to the main thread as a Ctrl-C would: a real signal when Python
    handles it, so a main thread blocked in a sleep or a wait wakes to it at once
    (``_thread.interrupt_main`` only flags it, and QA saw it wait out a 3 s sleep)."""
    main = threading.main_thread().ident
    if main is not None and callable(signal.getsignal(signal.SIGINT)):
        signal.pthread_kill(main, signal.SIGINT)
    else:
        _thread.interrupt_main()


@contextlib.contextmanager
def interrupt_deferred() -> Iterator[None]:
    """Hold a Ctrl-C back until the block has run, then raise KeyboardInterrupt.

    For short code that a KeyboardInterrupt would leave broken for the rest of the
    process (OpenCV's import). Only in the main thread with Python's own SIGINT handler
    in place (the only one that raises KeyboardInterrupt; a handler of the program's own
    is left alone); elsewhere the block runs as it is.
    """
    if (
        threading.current_thread() is not threading.main_thread()
        or signal.getsignal(signal.SIGINT) is not signal.default_int_handler
    ):
        yield
        return
    caught: list[int] = []
    signal.signal(signal.SIGINT, lambda signum, frame: caught.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if caught:
        raise KeyboardInterrupt


class InterruptSafeEvent(threading.Event):
    """A `threading.Event` whose `set` a Ctrl-C cannot leave half done.

    ``Event.set`` is Python code that takes its Condition's lock in ``Condition.__enter__``
    (Python too): an interrupt landing after the acquire and before the ``with`` took hold
    left the lock held for good, so every later ``wait()`` on the event (a pipeline's
    reporter and slow-lane watcher, the monitor's sampler) blocked without end, and a
    second ``set()`` from the main thread deadlocked on it (a close after the Ctrl-C). In
    the main thread, `set` holds a Ctrl-C back until it has run (`interrupt_deferred`).
    """

    def set(self) -> None:
        with interrupt_deferred():
            super().set()
