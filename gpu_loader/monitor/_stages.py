"""Reading the engine's per-stage records without importing the engine.

The monitor only needs a few named numbers from each stage record, so it reads them by
attribute instead of importing ``gpu_loader.pipeline``: the engine's ``StageStats``, a
test's record, or another loader's all work; a missing number is simply not shown.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Iterable
from typing import Any, Protocol

# Canonical field -> (attribute of gpu_loader.pipeline.StageStats, scale, flat-dict key).
# Task times go to the flat dict in ms (readable in a dashboard); worker-seconds stay in s.
_FIELDS: dict[str, tuple[str, float, str]] = {
    "concurrency": ("concurrency", 1.0, "concurrency"),
    "tasks_done": ("tasks_done", 1.0, "tasks_done"),
    "failures": ("failures", 1.0, "failures"),
    "mean_s": ("task_time_mean_s", 1000.0, "mean_ms"),
    "p50_s": ("task_time_p50_s", 1000.0, "p50_ms"),
    "p90_s": ("task_time_p90_s", 1000.0, "p90_ms"),
    "p99_s": ("task_time_p99_s", 1000.0, "p99_ms"),
    "busy_fraction": ("busy_fraction", 1.0, "busy_fraction"),
    "queue_mean": ("input_queue_mean", 1.0, "queue_mean"),
    "blocked_in_s": ("blocked_input_s", 1.0, "blocked_in_s"),
    "blocked_out_s": ("blocked_output_s", 1.0, "blocked_out_s"),
}
_COUNTS = frozenset({"concurrency", "tasks_done", "failures"})


class StageStatsLike(Protocol):
    """What the monitor reads from a stage record: ``name`` and, when present, the
    numbers of ``gpu_loader.pipeline.StageStats`` (``concurrency``, ``tasks_done``,
    ``failures``, ``task_time_{mean,p50,p90,p99}_s``, ``busy_fraction``,
    ``input_queue_mean``, ``blocked_input_s``, ``blocked_output_s``). A missing number
    shows as "-" in the summary and is left out of the flat dict.
    """

    @property
    def name(self) -> str:
        """The stage's name."""


class EngineStatsLike(Protocol):
    """What the monitor reads from the engine's whole-pipeline record
    (``gpu_loader.pipeline.PipelineStats``); ``bottleneck`` and ``bottleneck_reason``
    are used when present.
    """

    @property
    def stages(self) -> Iterable[Any]:
        """Per-stage records."""


def stage_value(stage: Any, field: str) -> float | None:
    """The canonical ``field`` of ``stage`` (see ``_FIELDS``) or None if it has none."""
    value = getattr(stage, _FIELDS[field][0], None)
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


def stage_name(stage: Any) -> str:
    """The stage's name, ``"?"`` if it has none."""
    return str(getattr(stage, "name", "?"))


def _key(name: str) -> str:
    # Dots separate key levels in the flat dict; keep names to one level.
    return re.sub(r"[^A-Za-z0-9_\-]+", "_", name) or "_"


def flatten_stage(stage: Any) -> dict[str, float | int]:
    """``{"stage.<name>.<field>": number}`` for every known field the record has."""
    prefix = f"stage.{_key(stage_name(stage))}."
    out: dict[str, float | int] = {}
    for field, (_, scale, key) in _FIELDS.items():
        value = stage_value(stage, field)
        if value is None:
            continue
        out[prefix + key] = int(value) if field in _COUNTS else value * scale
    if dataclasses.is_dataclass(stage):  # other numeric fields the engine adds
        known = {attr for attr, _, _ in _FIELDS.values()}
        for f in dataclasses.fields(stage):
            value = getattr(stage, f.name)
            if f.name in known or isinstance(value, bool):
                continue
            if isinstance(value, (int, float)) and math.isfinite(value):
                out[prefix + _key(f.name)] = value
    return out
