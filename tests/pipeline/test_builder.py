"""The builder rejects bad arguments where they are written, with a message saying the fix."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

import gpu_loader.pipeline as pipeline_pkg
from gpu_loader.pipeline import SKIP, PipelineBuilder


def ident(x: Any) -> Any:
    return x


def test_public_names_are_sorted_and_exact() -> None:
    assert pipeline_pkg.__all__ == sorted(pipeline_pkg.__all__)
    assert set(pipeline_pkg.__all__) == {
        "FailureRecord", "IDLE", "LaneThreshold", "OutputOrder", "Pipeline", "PipelineBuilder",
        "PipelineFailure", "PipelineStats", "SKIP", "SlowLane", "StageStats",
    }  # fmt: skip
    assert repr(SKIP) == "SKIP"


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"concurrency": 0}, ValueError, "`concurrency` must be >= 1, got 0"),
        ({"concurrency": 2.0}, TypeError, "`concurrency` must be an int"),
        ({"output_order": "random"}, ValueError, "`output_order` must be one of"),
        ({"max_failures": -1}, ValueError, "`max_failures` must be >= 0"),
        ({"max_failures": 1.5}, ValueError, r"rate must be in \(0, 1\]"),
        ({"max_failures": True}, TypeError, "`max_failures` must be"),
        ({"name": ""}, ValueError, "`name` must be a non-empty str"),
        ({"worker_init": 3}, TypeError, "`worker_init` must be callable"),
    ],
)
def test_pipe_argument_errors(kwargs: dict[str, Any], error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        PipelineBuilder().add_source([]).pipe(ident, **kwargs)


def test_async_ops_are_rejected() -> None:
    async def coro(x: int) -> int:
        return x

    async def agen(x: int) -> AsyncIterator[int]:
        yield x

    for op in (coro, agen):
        with pytest.raises(TypeError, match="async"):
            PipelineBuilder().add_source([]).pipe(op)


def test_order_of_calls() -> None:
    with pytest.raises(ValueError, match="add_source"):
        PipelineBuilder().pipe(ident)
    with pytest.raises(ValueError, match="one source"):
        PipelineBuilder().add_source([]).add_source([])
    with pytest.raises(ValueError, match="add_sink"):
        PipelineBuilder().add_source([]).build()
    with pytest.raises(ValueError, match="must come last"):
        PipelineBuilder().add_source([]).add_sink().pipe(ident)
    with pytest.raises(TypeError, match="iterable"):
        PipelineBuilder().add_source(3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="aggregate size must be >= 1"):
        PipelineBuilder().add_source([]).aggregate(0)
    with pytest.raises(ValueError, match="`buffer_size` must be >= 1"):
        PipelineBuilder().add_source([]).add_sink(0)
    with pytest.raises(ValueError, match="report_interval"):
        PipelineBuilder().add_source([]).add_sink().build(report_interval=0)


def test_stage_names_unique() -> None:
    with pytest.raises(ValueError, match="used twice"):
        PipelineBuilder().add_source([]).pipe(ident, name="a").pipe(ident, name="a")
    p = PipelineBuilder().add_source([1]).pipe(ident).pipe(ident).add_sink().build()
    assert [s.name for s in p.stats().stages] == ["source", "ident", "ident#2"]
    p.close()
