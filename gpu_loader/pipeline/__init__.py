"""The engine: threads, per-stage concurrency, bounded queues, failures and live stats.

It knows nothing about images, torch or CUDA. See README.md in this folder.
"""

from __future__ import annotations

from ._builder import PipelineBuilder
from ._defs import IDLE, SKIP, LaneThreshold, OutputOrder, SlowLane
from ._errors import FailureRecord, PipelineFailure
from ._pipeline import Pipeline
from ._stats import PipelineStats, StageStats

__all__ = [  # noqa: RUF022 - plain sorted(), as the API tests check
    "FailureRecord",
    "IDLE",
    "LaneThreshold",
    "OutputOrder",
    "Pipeline",
    "PipelineBuilder",
    "PipelineFailure",
    "PipelineStats",
    "SKIP",
    "SlowLane",
    "StageStats",
]
