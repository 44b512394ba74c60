"""`Batch`: what the loader yields, an ``(images, labels)`` pair that also knows its samples.

A tuple, so ``for images, labels in loader`` keeps working; ``batch.indices`` and
``batch.keys()`` say which samples fill the rows (per-file evaluation output, debugging a
bad batch), which a plain pair could not without a source rebuilt around the index.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np
    import torch

    from gpu_loader.sources import SampleIndex


class Batch(tuple["torch.Tensor", "torch.Tensor"]):
    """``(images, labels)``, with the samples' source indices in row order.

    ``images`` is ``[N, 3, H, W]`` and ``labels`` ``[N]`` int64, both on the loader's
    device; ``indices`` is an ``[N]`` int64 CPU tensor of positions in the loader's
    source (``loader.dataset``), row for row.
    """

    images: torch.Tensor
    labels: torch.Tensor
    indices: torch.Tensor
    _source: SampleIndex

    def __new__(
        cls,
        images: torch.Tensor,
        labels: torch.Tensor,
        indices: np.ndarray[Any, Any],
        source: SampleIndex,
    ) -> Batch:
        import torch

        batch = super().__new__(cls, (images, labels))
        batch.images, batch.labels = images, labels
        batch.indices = torch.from_numpy(indices)
        batch._source = source
        return batch

    def keys(self) -> list[str]:
        """Each row's sample key (its path, URL or ``shard:member``)."""
        key = self._source.key
        return [key(i) for i in self.indices.tolist()]

    def __reduce__(self) -> Any:
        # A pair when pickled or sent to another process: the source stays here.
        return (tuple, ((self.images, self.labels),))

    def __repr__(self) -> str:
        return (
            f"Batch(images={tuple(self.images.shape)} {self.images.dtype} on "
            f"{self.images.device}, {len(self.indices)} samples)"
        )
