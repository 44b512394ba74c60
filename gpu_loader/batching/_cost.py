"""Cost-aware start order: begin expected-slow samples early, within a bounded look-ahead."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class CostModel:
    """Predicted task cost ``base + per_byte * nbytes + per_pixel * pixels`` (any unit).

    Only the order of the predictions matters to `order_by_cost`, so the defaults rank by
    file size. Where the image size is cheap to know (a JPEG header), weight pixels: decode
    and resize time grow with them.
    """

    base: float = 0.0
    """Fixed cost per sample."""
    per_byte: float = 1.0
    """Cost per byte of the encoded file."""
    per_pixel: float = 0.0
    """Cost per decoded pixel (width * height)."""

    def __post_init__(self) -> None:
        for name in ("base", "per_byte", "per_pixel"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise TypeError(f"`{name}` must be a number, got {value!r}")
            if not 0.0 <= value < math.inf:
                raise ValueError(f"`{name}` must be finite and >= 0, got {value}")

    def estimate(self, nbytes: int, pixels: int | None = None) -> float:
        """Predicted cost of one sample; ``pixels=None`` when the size is unknown."""
        if nbytes < 0 or (pixels is not None and pixels < 0):
            raise ValueError(f"sizes must be >= 0, got nbytes={nbytes}, pixels={pixels}")
        cost = self.base + self.per_byte * nbytes
        return cost if pixels is None else cost + self.per_pixel * pixels


def order_by_cost(positions: Sequence[int], costs: Sequence[float], lookahead: int) -> list[int]:
    """Reorder a start order so expected-slow samples start earlier, by at most ``lookahead``.

    ``costs[i]`` is the predicted cost of ``positions[i]``. The sequence is cut into
    consecutive blocks of ``lookahead`` entries and each block is sorted by descending
    cost (ties keep their order). Every entry therefore stays in its block: it moves by
    less than ``lookahead`` places, so the nominal batch it completes for changes by at
    most ``ceil(lookahead / batch_size)`` and the set of positions started by any time
    differs from the plain order only inside one block. ``lookahead <= 1`` keeps the order.
    """
    if len(positions) != len(costs):
        raise ValueError(
            f"`positions` and `costs` must have the same length, got {len(positions)} "
            f"and {len(costs)} (costs[i] is the cost of positions[i])"
        )
    if isinstance(lookahead, bool) or not isinstance(lookahead, int) or lookahead < 0:
        raise ValueError(f"`lookahead` must be an int >= 0, got {lookahead!r}")
    if lookahead <= 1:
        return list(positions)
    out: list[int] = []
    for start in range(0, len(positions), lookahead):
        block = range(start, min(start + lookahead, len(positions)))
        # sorted() is stable, so equal costs keep their original order.
        out.extend(positions[i] for i in sorted(block, key=lambda i: -costs[i]))
    return out
