"""gpu_loader.monitor: see into the loader while it runs (see README.md in this folder).

NVML and process samplers, data-stall and throughput accounting, the typed
:class:`LoaderStats` snapshot, and reporters (progress bar, summary, JSON lines).
Importing this package imports neither pynvml nor psutil; the samplers do on start.
"""

from __future__ import annotations

from ._gpu_types import DeviceStats, GpuReading, GpuSnapshot
from ._jsonl import JsonlLogger
from ._monitor import Monitor, MonitorConfig
from ._nvml import NvmlSampler, nvml_indices_for_cuda
from ._nvml_parse import aggregate, parse_memory, parse_name, parse_pcie, parse_utilization
from ._process import ProcessSampler, ProcessSnapshot
from ._progress import ProgressReporter, progress_postfix
from ._rate import RateMeter, RateSnapshot
from ._stages import EngineStatsLike, StageStatsLike, flatten_stage
from ._stall import StallMeter, StallSnapshot
from ._stats import LoaderStats, diagnose
from ._summary import format_stage_table, format_summary

__all__ = [
    "DeviceStats",
    "EngineStatsLike",
    "GpuReading",
    "GpuSnapshot",
    "JsonlLogger",
    "LoaderStats",
    "Monitor",
    "MonitorConfig",
    "NvmlSampler",
    "ProcessSampler",
    "ProcessSnapshot",
    "ProgressReporter",
    "RateMeter",
    "RateSnapshot",
    "StageStatsLike",
    "StallMeter",
    "StallSnapshot",
    "aggregate",
    "diagnose",
    "flatten_stage",
    "format_stage_table",
    "format_summary",
    "nvml_indices_for_cuda",
    "parse_memory",
    "parse_name",
    "parse_pcie",
    "parse_utilization",
    "progress_postfix",
]
