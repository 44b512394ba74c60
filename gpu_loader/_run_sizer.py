"""How many samples straggler mode's next read and decode call takes (CPU path).

One sample per engine call lets the slow lane move a single slow sample, but pays the
per-call costs under the GIL (queue hops, stage counters, the slow-lane bookkeeping) for
every sample: about twice the CPU per image of runs of 8 with decode made free. A run
reads its files one after another, so a slow read holds the rest of its run: that is
what the slow lane exists for when reads are slow (remote storage), and costs little
when no read takes longer than decoding a run. So the loader measures both per sample
and runs up to ``most`` samples per call while the slowest reads (their p99) are no
longer than decoding a run (``most`` x the median decode), one sample per call
otherwise, and until it has seen enough of each (``min_samples``).

Decode stragglers are not a reason to stop runs: the samples a run has decoded reach the
batcher only when it ends, so a slow decode would hold them, but a batch waits for them
only until that decode passes the per-sample straggler limit (`StragglerRows.hold_back`),
as it waits for a single slow decode.
"""

from __future__ import annotations

from collections.abc import Sequence

from gpu_loader.batching import AdaptiveThreshold

MIN_SAMPLES = 64
"""Per-sample reads and decodes seen before runs are considered (once per loader: the
sizer lives as long as its loader, so later epochs start from what it measured)."""


class RunSizer:
    """Per-sample read and decode times, and the run size they allow. Thread-safe."""

    def __init__(self, most: int, *, min_samples: int = MIN_SAMPLES) -> None:
        if most < 1:
            raise ValueError(f"`most` must be >= 1, got {most}")
        self.most = most
        # Raw percentiles (factor 1): the slowest reads, the typical decode.
        self.reads = AdaptiveThreshold(
            percentile=0.99, factor=1.0, window=256, min_samples=min_samples, refresh_every=32
        )
        self.decodes = AdaptiveThreshold(
            percentile=0.5, factor=1.0, window=256, min_samples=min_samples, refresh_every=32
        )

    def observe(self, stage: str, seconds: Sequence[float]) -> None:
        """Samples' reads (``stage="read"``) or decodes took ``seconds`` each."""
        (self.reads if stage == "read" else self.decodes).observe_many(seconds)

    def size(self) -> int:
        """Samples for the next run: ``most`` while no read outlasts decoding a run."""
        slowest_read = self.reads.limit()
        typical_decode = self.decodes.limit()
        if slowest_read is None or typical_decode is None:
            return 1
        return self.most if slowest_read <= self.most * typical_decode else 1
