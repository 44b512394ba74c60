"""Batch formation: ordered and straggler-aware batchers, the adaptive slow-lane threshold.

Pure logic with an injectable clock: no threads of its own, no I/O, no torch.
See README.md in this folder for the files and the exact rules.
"""

from gpu_loader.batching._cost import CostModel, order_by_cost
from gpu_loader.batching._ordered import OrderedBatcher
from gpu_loader.batching._plan import Batch, BatcherStats, BatchPlan
from gpu_loader.batching._straggler import StragglerBatcher
from gpu_loader.batching._threshold import AdaptiveThreshold, ThresholdStats

__all__ = [
    "AdaptiveThreshold",
    "Batch",
    "BatchPlan",
    "BatcherStats",
    "CostModel",
    "OrderedBatcher",
    "StragglerBatcher",
    "ThresholdStats",
    "order_by_cost",
]
