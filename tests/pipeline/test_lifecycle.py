"""Every way of leaving a pipeline stops and joins all its threads, quickly."""

from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from gpu_loader.pipeline import Pipeline, PipelineBuilder, PipelineFailure

from ._helpers import pipeline_threads, wait_no_pipeline_threads


def busy_pipeline(n: int = 1_000_000, concurrency: int = 3) -> Pipeline:
    return (
        PipelineBuilder()
        .add_source(range(n))
        .pipe(lambda x: x, concurrency=concurrency, output_order="completion")
        .pipe(lambda x: x + 1, concurrency=concurrency)
        .aggregate(4)
        .add_sink(2)
        .build()
    )


def test_threads_exist_while_running_and_none_after_close() -> None:
    before = set(threading.enumerate())
    p = busy_pipeline().start()
    time.sleep(0.05)  # let every stage block on a full queue
    assert len(pipeline_threads()) == 1 + 3 + 3 + 1  # source, two stages, aggregate
    t0 = time.monotonic()
    p.close()
    assert time.monotonic() - t0 < 2.0
    assert set(threading.enumerate()) - before == set()
    p.close()  # idempotent


def test_leak_check_can_fail() -> None:
    # Guards the checks below: an un-closed pipeline is seen as leaked threads.
    p = busy_pipeline().start()
    try:
        assert pipeline_threads() != []
    finally:
        p.close()
    assert pipeline_threads() == []


def test_normal_end() -> None:
    before = set(threading.enumerate())
    with busy_pipeline(n=100) as p:
        assert len(list(p)) == 25
    assert set(threading.enumerate()) - before == set()


def test_break_out_of_iteration_without_with() -> None:
    before = set(threading.enumerate())
    p = busy_pipeline()
    for i, _ in enumerate(p):
        if i == 3:
            break
    # The abandoned iterator is collected at once, and it closes the pipeline.
    assert set(threading.enumerate()) - before == set()
    with pytest.raises(RuntimeError, match="closed"):
        iter(p)


def test_break_inside_with() -> None:
    before = set(threading.enumerate())
    with busy_pipeline() as p:
        for _ in p:
            break
    assert set(threading.enumerate()) - before == set()


def test_del_stops_threads() -> None:
    before = set(threading.enumerate())
    p = busy_pipeline().start()
    it = iter(p)
    next(it)
    del it, p
    gc.collect()
    assert set(threading.enumerate()) - before == set()


def test_del_of_a_started_pipeline_never_iterated() -> None:
    before = set(threading.enumerate())
    p = busy_pipeline().start()
    del p
    assert set(threading.enumerate()) - before == set()


def test_exception_in_consumer_loop() -> None:
    before = set(threading.enumerate())
    with pytest.raises(ZeroDivisionError), busy_pipeline() as p:
        for _ in p:
            _ = 1 / 0
    assert set(threading.enumerate()) - before == set()


def test_keyboard_interrupt_in_consumer_loop() -> None:
    before = set(threading.enumerate())
    with pytest.raises(KeyboardInterrupt), busy_pipeline() as p:
        for i, _ in enumerate(p):
            if i == 10:
                raise KeyboardInterrupt
    assert set(threading.enumerate()) - before == set()


def test_keyboard_interrupt_without_with() -> None:
    before = set(threading.enumerate())
    p = busy_pipeline()
    with pytest.raises(KeyboardInterrupt):
        for i, _ in enumerate(p):
            if i == 10:
                raise KeyboardInterrupt
    assert set(threading.enumerate()) - before == set()


def test_failure_path_joins_everything() -> None:
    before = set(threading.enumerate())

    def explode(x: int) -> int:
        if x == 50:
            raise ValueError("x")
        return x

    p = PipelineBuilder().add_source(range(10**6)).pipe(explode, concurrency=4, max_failures=0)
    with pytest.raises(PipelineFailure), p.add_sink(2).build() as pipeline:
        list(pipeline)
    assert set(threading.enumerate()) - before == set()


def test_close_while_stages_wait_on_an_empty_queue() -> None:
    def slow_source() -> Iterator[int]:
        for i in range(1000):
            time.sleep(0.05)
            yield i

    before = set(threading.enumerate())
    p = PipelineBuilder().add_source(slow_source()).pipe(lambda x: x, concurrency=8)
    pipeline = p.aggregate(100).add_sink(2).build().start()
    time.sleep(0.1)
    t0 = time.monotonic()
    pipeline.close()
    assert time.monotonic() - t0 < 2.0
    assert set(threading.enumerate()) - before == set()


def test_close_from_another_thread_ends_iteration() -> None:
    p = busy_pipeline().start()
    threading.Timer(0.1, p.close).start()
    count = sum(1 for _ in p)  # ends quietly instead of hanging
    assert count > 0
    assert pipeline_threads() == []


def test_single_pass_and_no_restart() -> None:
    p = busy_pipeline(n=8)
    with p:
        it = iter(p)
        with pytest.raises(RuntimeError, match="already being iterated"):
            iter(p)
        assert len(list(it)) == 2
    with pytest.raises(RuntimeError, match="closed"):
        p.start()


def test_interpreter_exit_with_a_running_pipeline() -> None:
    code = textwrap.dedent(
        """
        from gpu_loader.pipeline import PipelineBuilder
        p = PipelineBuilder().add_source(range(10**9)).pipe(lambda x: x, concurrency=4)
        p = p.add_sink(2).build().start()
        it = iter(p)
        print(next(it), next(it), flush=True)
        # exit without closing: the finalizer must stop and join the threads
        """
    )
    t0 = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["0", "1"]
    assert "still running" not in result.stderr
    assert time.monotonic() - t0 < 30


def test_real_ctrl_c_while_the_consumer_waits() -> None:
    code = textwrap.dedent(
        """
        import threading, time
        from gpu_loader.pipeline import PipelineBuilder
        def slow(x):
            time.sleep(0.3)
            return x
        p = PipelineBuilder().add_source(range(10**6)).pipe(slow, concurrency=2)
        p = p.add_sink(2).build()
        try:
            with p:
                print("ready", flush=True)
                for _ in p:
                    pass
        except KeyboardInterrupt:
            left = [t.name for t in threading.enumerate() if t.name.startswith("gpu_loader-")]
            print("interrupted", left, flush=True)
        """
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready"
    time.sleep(0.2)  # the consumer is now blocked waiting for an item
    t0 = time.monotonic()
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert out.strip() == "interrupted []"
    assert time.monotonic() - t0 < 5


def test_a_failed_start_joins_the_threads_it_started(monkeypatch: pytest.MonkeyPatch) -> None:
    from gpu_loader.pipeline import _runtime

    real_spawn = _runtime.Runtime.spawn
    calls = []

    def flaky_spawn(self: _runtime.Runtime, target: Any, name: str) -> bool:
        calls.append(name)
        if len(calls) == 3:
            raise RuntimeError("can't start new thread")
        return real_spawn(self, target, name)

    monkeypatch.setattr(_runtime.Runtime, "spawn", flaky_spawn)
    p = busy_pipeline()
    with pytest.raises(RuntimeError, match="new thread"):
        p.start()
    assert len(calls) == 3
    assert pipeline_threads() == []


def test_a_stuck_op_costs_the_join_timeout_once_not_once_per_close(
    caplog: pytest.LogCaptureFixture,
) -> None:
    release = threading.Event()
    entered = threading.Event()

    def stuck(x: int) -> int:
        entered.set()
        release.wait(30)  # a read that does not return
        return x

    p = PipelineBuilder().add_source(range(3)).pipe(stuck).add_sink(2).build()
    p.start()
    try:
        assert entered.wait(10)
        rt = p._core.rt
        with caplog.at_level("WARNING", logger="gpu_loader.pipeline"):
            t0 = time.monotonic()
            rt.shutdown(timeout=0.3)
            first = time.monotonic() - t0
            t0 = time.monotonic()
            rt.shutdown(timeout=0.3)  # e.g. the epoch's close after the `with` block's
            p.close()
            again = time.monotonic() - t0
        assert 0.25 <= first < 2.0 and again < 0.1
        assert caplog.text.count("still running after") == 1
    finally:
        release.set()
        p.close()


@pytest.fixture
def waits_without_timeouts(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every queue wait of the engine blocks with no timeout: the state CPython 3.11's
    ``SimpleQueue.get(timeout=...)`` falls into when, woken by a put whose item another
    consumer takes, it finds its deadline passed (it then waits forever; QA saw a read
    worker stuck for good after a ``break``). Only the wake-up at stop can end them."""
    from gpu_loader.pipeline import _channel, _ordered, _pipe_stage, _pipeline, _stage

    for module in (_channel, _ordered, _pipe_stage, _pipeline, _stage):
        monkeypatch.setattr(module, "POLL_S", None)


@pytest.mark.usefixtures("waits_without_timeouts")
@pytest.mark.parametrize("where", ["after a break", "on an empty queue", "on a full sink"])
def test_stop_wakes_threads_stuck_in_a_wait_without_timeout(where: str) -> None:
    def slow_source() -> Iterator[int]:
        for i in range(1000):
            time.sleep(0.05)
            yield i

    if where == "on an empty queue":
        stages = PipelineBuilder().add_source(slow_source()).pipe(lambda x: x, concurrency=8)
        pipeline = stages.pipe(lambda x: x, concurrency=4).add_sink(2).build().start()
        time.sleep(0.2)
    else:
        pipeline = busy_pipeline().start()
        if where == "after a break":
            for i, _ in enumerate(pipeline):
                if i == 50:
                    break
        else:
            time.sleep(0.2)  # nobody consumes: every stage blocks on its full output
    t0 = time.monotonic()
    pipeline.close()
    assert time.monotonic() - t0 < 3.0  # was the 10 s join timeout, threads left behind
    assert pipeline_threads() == []


def test_a_thread_a_ctrl_c_kept_from_starting_does_not_break_the_shutdown(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # QA: Ctrl-C during an epoch's start-up ended the script with "RuntimeError: cannot
    # join thread before it is started" instead of the KeyboardInterrupt.
    from gpu_loader.pipeline._runtime import Runtime

    rt = Runtime("gpu_loader-pipeline-test")
    assert rt.spawn(lambda: rt.stop.wait(5), "first")
    real_start = threading.Thread.start

    def interrupted(self: threading.Thread) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(threading.Thread, "start", interrupted)
    with pytest.raises(KeyboardInterrupt):
        rt.spawn(lambda: None, "never started")
    monkeypatch.setattr(threading.Thread, "start", real_start)
    rt.shutdown()  # joins the first, skips the one that never started
    assert pipeline_threads() == []


def _gated_pipeline(gate: threading.Event) -> Pipeline:
    """A source that waits on ``gate`` after its first item: the stop event does not
    reach it (as the loader's source waits for room in its window)."""

    def source() -> Iterator[int]:
        yield 0
        while not gate.wait(0.05):
            pass
        yield 1

    return PipelineBuilder().add_source(source()).pipe(lambda x: x).add_sink(2).build()


@pytest.mark.parametrize("how", ["close", "break", "del"])
def test_on_close_wakes_a_source_waiting_on_its_owner(how: str) -> None:
    gate = threading.Event()
    p = _gated_pipeline(gate)
    p.on_close(gate.set)
    calls: list[str] = []
    p.on_close(lambda: calls.append(threading.current_thread().name))
    began = time.monotonic()
    if how == "close":
        p.start()
        p.close()
    elif how == "break":
        for _ in p:
            break
    else:
        p.start()
        del p
        gc.collect()
    assert time.monotonic() - began < 5.0  # not the 10 s join timeout
    assert gate.is_set() and calls
    assert wait_no_pipeline_threads() == []


def test_without_on_close_the_same_source_holds_the_join() -> None:
    # Guards the test above: the stop event alone does not end the source's wait.
    gate = threading.Event()
    p = _gated_pipeline(gate).start()
    closer = threading.Thread(target=p.close)
    closer.start()
    closer.join(0.5)
    assert closer.is_alive()  # joining the source thread
    gate.set()
    closer.join(5.0)
    assert not closer.is_alive()


def test_a_broken_on_close_callback_is_logged_and_the_close_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    gate = threading.Event()
    p = _gated_pipeline(gate)

    def broken() -> None:
        raise ValueError("boom")

    p.on_close(broken)
    p.on_close(gate.set)
    p.start()
    p.close()
    assert gate.is_set()
    assert "on_close callback raised" in caplog.text
    assert wait_no_pipeline_threads() == []


class _CtrlCInStopSet:
    """Send a real SIGINT once, from the main thread, inside the next pipeline StopEvent's
    ``set`` (a Ctrl-C that lands while a close stops the threads)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        from gpu_loader.pipeline._channel import StopEvent

        self.armed = False
        real = threading.Event.set

        def set_with_ctrl_c(event: threading.Event) -> None:
            if (
                self.armed
                and isinstance(event, StopEvent)
                and threading.current_thread() is threading.main_thread()
            ):
                self.armed = False
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(0.01)  # let the handler run inside the set
            real(event)

        monkeypatch.setattr(threading.Event, "set", set_with_ctrl_c)


def test_a_ctrl_c_while_a_close_stops_the_threads_costs_no_join_timeout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # QA: raised from the stop event's `set`, the interrupt skipped the wakers and left
    # the join unmarked, so every later close waited out its 10 s (a `break` took 20 s).
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    ctrl_c = _CtrlCInStopSet(monkeypatch)
    p = busy_pipeline()
    p.start()
    ctrl_c.armed = True
    began = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        p.close()
    p.close()
    assert time.monotonic() - began < 5.0
    assert p.threads == []


def test_a_ctrl_c_during_a_breaks_close_reaches_the_main_thread(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Raised from the iterator's finalizer, it was printed as "Exception ignored" and lost.
    ctrl_c = _CtrlCInStopSet(monkeypatch)
    p = busy_pipeline()
    with pytest.raises(KeyboardInterrupt):
        for i, _ in enumerate(p):
            if i == 5:
                ctrl_c.armed = True
                break
        time.sleep(5)  # it comes within moments, waking this sleep
    assert p.threads == []


def test_a_ctrl_c_while_a_dropped_unstarted_iterator_closes_reaches_the_main_thread(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # That close runs from a finalizer too (QA53: "Exception ignored", and lost).
    ctrl_c = _CtrlCInStopSet(monkeypatch)
    p = busy_pipeline()
    outputs = iter(p)
    with pytest.raises(KeyboardInterrupt):
        ctrl_c.armed = True
        del outputs
        time.sleep(5)  # it comes within moments, waking this sleep
    assert p.threads == []


def test_a_generator_op_is_stopped_between_its_yields() -> None:
    # QA: close() gave up on it after 10 s, and it ran on, its output list growing by
    # 100 KB a millisecond.
    yielded = 0

    def endless(x: int) -> Iterator[int]:
        nonlocal yielded
        while True:
            time.sleep(0.001)
            yielded += 1
            yield x

    p = PipelineBuilder().add_source(range(4)).pipe(endless, name="tiles").add_sink(2).build()
    p.start()
    time.sleep(0.1)
    began = time.monotonic()
    p.close()
    assert time.monotonic() - began < 2.0
    assert p.threads == []
    after = yielded
    time.sleep(0.05)
    assert yielded == after
    assert p.failures() == []  # stopped, not failed


def test_completed_tells_a_finished_stream_from_one_closed_early() -> None:
    whole = PipelineBuilder().add_source(range(10)).pipe(lambda x: x).add_sink(2).build()
    with whole:
        assert list(whole) == list(range(10))
    assert whole.completed
    cut = busy_pipeline()
    got = 0
    with cut:
        for _ in cut:
            got += 1
            if got == 3:
                threading.Thread(target=cut.close).start()  # from another thread
    assert got < 1_000_000 and not cut.completed


def test_a_thread_an_interrupt_caught_starting_is_not_a_join_error() -> None:
    # A Ctrl-C while Thread.start() waited for the new thread to say it started: the
    # thread has an ident, and join() refused it ("cannot join thread before it is
    # started"), an error that replaced the interrupt (QA: 1 in ~1,000 Ctrl-Cs).
    from gpu_loader._threads import join_started

    never = threading.Thread(target=lambda: None)
    never._ident = 12345  # type: ignore[attr-defined]  # started, never said so
    began = time.monotonic()
    join_started(never, 0.05)
    assert time.monotonic() - began < 1.0
    with pytest.raises(RuntimeError, match="current thread"):
        join_started(threading.current_thread(), 0.05)


def test_an_interrupt_raised_again_wakes_a_sleeping_main_thread() -> None:
    from gpu_loader._threads import interrupt_main_now

    threading.Timer(0.1, interrupt_main_now).start()
    began = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        time.sleep(5)
    assert time.monotonic() - began < 2.0  # `_thread.interrupt_main` waited out the sleep


def test_an_event_set_cut_short_by_a_ctrl_c_is_set_again() -> None:
    # A Ctrl-C just before an event's set took hold left it unset, and the close then
    # waited 10 s for a thread that never saw it (QA: the process sampler).
    from gpu_loader._threads import set_through_interrupts

    class CutOnce(threading.Event):
        cut = False

        def set(self) -> None:
            if not self.cut:
                self.cut = True
                raise KeyboardInterrupt
            super().set()

    event = CutOnce()
    assert set_through_interrupts(event) is True and event.is_set()
    assert set_through_interrupts(threading.Event()) is False


def test_a_ctrl_c_in_a_weakref_callback_is_delivered_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Python prints "Exception ignored" for it and goes on; the loader's threads run such
    # callbacks as they are freed (QA: ~1 in 100 Ctrl-Cs lost in a loop of short epochs).
    import weakref

    from gpu_loader._threads import rescue_lost_interrupts

    others: list[Any] = []
    monkeypatch.setattr(sys, "unraisablehook", others.append)
    rescue_lost_interrupts()

    class Thing:
        pass

    def interrupted(_: object) -> None:
        raise KeyboardInterrupt

    def failing(_: object) -> None:
        raise ValueError("not an interrupt")

    thing, other = Thing(), Thing()
    refs = [weakref.ref(thing, interrupted), weakref.ref(other, failing)]
    began = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        del thing
        time.sleep(5)
    assert time.monotonic() - began < 2.0
    del other
    assert [u.exc_type for u in others] == [ValueError]  # the rest go to the hook it wrapped
    assert [r() for r in refs] == [None, None]
