"""``PipelineBuilder``: a chain of validated stage specs turned into a ``Pipeline``."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from typing import Any

from ._defs import AggregateSpec, DisaggregateSpec, OutputOrder, PipeSpec, SlowLane, op_name
from ._ordered import OrderedPipeStage
from ._pipe_stage import PipeStage
from ._pipeline import Pipeline
from ._stage import AggregateStage, DisaggregateStage, SourceStage, Stage
from ._stats import PipelineStats

_Spec = PipeSpec | AggregateSpec | DisaggregateSpec


class PipelineBuilder:
    """Describe a pipeline: a source, stages, a sink; then ``build()`` it.

    Every method but ``build`` returns the builder, so calls chain.
    """

    def __init__(self) -> None:
        self._source: Iterable[Any] | None = None
        self._backpressure_s: Callable[[], float] | None = None
        self._specs: list[_Spec] = []
        self._sink: int | None = None

    def add_source(
        self, iterable: Iterable[Any], /, *, backpressure_s: Callable[[], float] | None = None
    ) -> PipelineBuilder:
        """The items to process; iterated once, on the pipeline's source thread.

        ``backpressure_s``: for an iterable that itself waits for room downstream (an
        in-flight window the consumer frees), a function returning the seconds it has
        waited so far. That time counts as blocked on output, not as busy, so the
        source is not named the bottleneck for waiting on the consumer. It is called on
        the source thread, after each item.
        """
        if self._source is not None:
            raise ValueError("add_source() was already called; a pipeline has one source")
        if not isinstance(iterable, Iterable):
            raise TypeError(f"the source must be iterable, got {type(iterable).__name__}")
        if backpressure_s is not None and not callable(backpressure_s):
            raise TypeError("`backpressure_s` must be a function returning seconds, or None")
        self._source = iterable
        self._backpressure_s = backpressure_s
        return self

    def pipe(
        self,
        op: Callable[..., Any],
        /,
        *,
        concurrency: int = 1,
        name: str | None = None,
        output_order: OutputOrder = "input",
        max_failures: int | float | None = None,
        key_fn: Callable[[Any], object] | None = None,
        worker_init: Callable[[], Any] | None = None,
        slow_lane: SlowLane | None = None,
        failures_before: tuple[int, int] = (0, 0),
    ) -> PipelineBuilder:
        """Run ``op`` on every item with ``concurrency`` long-lived worker threads.

        ``op(item)`` returns one output, ``SKIP`` to drop the item quietly, or (generator
        function) yields zero or more outputs. With ``worker_init``, each worker thread
        calls ``state = worker_init()`` once when it starts and the op is called as
        ``op(item, state)``, so per-thread resources (a CUDA stream, a decoder) are made
        once per thread. An op that raises drops the item and records a failure;
        ``max_failures`` (None: no limit; an int: a count; a float in (0, 1]: a rate)
        says when the pipeline must stop and raise ``PipelineFailure``;
        ``failures_before=(calls, failures)`` counts those of an earlier run of the same
        stream against it too (a resumed job: the limit applies to the whole).
        """
        self._need_source("pipe")
        if name is not None and not (isinstance(name, str) and name):
            raise ValueError(f"`name` must be a non-empty str or None, got {name!r}")
        if name == "source":
            raise ValueError("stage name 'source' is the source's own; pick another")
        if name is not None and name in self._names():
            raise ValueError(f"stage name {name!r} is used twice; names must be unique")
        stage_name = name if name is not None else self._unique(op_name(op))
        self._specs.append(
            PipeSpec(
                op=op,
                name=stage_name,
                concurrency=concurrency,
                output_order=output_order,
                max_failures=max_failures,
                key_fn=key_fn,
                worker_init=worker_init,
                slow_lane=slow_lane,
                failures_before=failures_before,
            )
        )
        return self

    def aggregate(self, n: int, /, *, drop_last: bool = False) -> PipelineBuilder:
        """Group items into lists of ``n``; the last short list is dropped if ``drop_last``."""
        self._need_source("aggregate")
        self._specs.append(AggregateSpec(n, drop_last))
        return self

    def disaggregate(self) -> PipelineBuilder:
        """Emit the elements of each incoming list (the inverse of ``aggregate``)."""
        self._need_source("disaggregate")
        self._specs.append(DisaggregateSpec())
        return self

    def add_sink(self, buffer_size: int = 2) -> PipelineBuilder:
        """End the pipeline with a buffer of ``buffer_size`` outputs for the consumer."""
        self._need_source("add_sink")
        if isinstance(buffer_size, bool) or not isinstance(buffer_size, int):
            raise TypeError(f"`buffer_size` must be an int, got {buffer_size!r}")
        if buffer_size < 1:
            raise ValueError(f"`buffer_size` must be >= 1, got {buffer_size}")
        self._sink = buffer_size
        return self

    def build(
        self,
        *,
        report_interval: float | None = None,
        on_report: Callable[[PipelineStats], None] | None = None,
    ) -> Pipeline:
        """Make the pipeline (no thread starts until ``start()`` or ``with``).

        With ``report_interval`` (seconds), a reporter thread calls ``on_report(stats)``
        that often, or logs the stats table at INFO level when ``on_report`` is None.
        """
        if self._source is None:
            raise ValueError("call add_source(iterable) before build()")
        if self._sink is None:
            raise ValueError("call add_sink(buffer_size) before build()")
        if report_interval is not None and not 0 < report_interval <= threading.TIMEOUT_MAX:
            # inf passed, and the reporter thread died of an OverflowError (QA52)
            raise ValueError(
                f"`report_interval` must be > 0 seconds and finite, got {report_interval}"
            )
        if on_report is not None and not callable(on_report):
            raise TypeError(f"`on_report` must be callable or None, got {on_report!r}")
        if on_report is not None and report_interval is None:
            raise ValueError("`on_report` needs `report_interval` (seconds between reports)")
        stages: list[Stage] = [SourceStage(self._source, self._backpressure_s)]
        stages.extend(_make_stage(spec) for spec in self._specs)
        return Pipeline(stages, self._sink, report_interval, on_report)

    # Helpers ---------------------------------------------------------------------------

    def _need_source(self, method: str) -> None:
        if self._source is None:
            raise ValueError(f"call add_source(iterable) before {method}()")
        if self._sink is not None:
            raise ValueError(f"add_sink() must come last; {method}() was called after it")

    def _names(self) -> set[str]:
        return {s.name for s in self._specs if isinstance(s, PipeSpec)}

    def _unique(self, base: str) -> str:
        names, candidate, i = self._names(), base, 1
        while candidate in names or candidate == "source":
            i += 1
            candidate = f"{base}#{i}"
        return candidate


def _make_stage(spec: _Spec) -> Stage:
    if isinstance(spec, AggregateSpec):
        return AggregateStage(spec.size, spec.drop_last)
    if isinstance(spec, DisaggregateSpec):
        return DisaggregateStage()
    if spec.output_order == "input" and spec.concurrency > 1:
        return OrderedPipeStage(spec)
    return PipeStage(spec)
