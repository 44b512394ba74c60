"""`Batch`: what the loader yields, an ``(images, labels)`` pair that also knows its samples.

A named tuple, so ``for images, labels in loader`` keeps working and the helpers that
rebuild a batch field by field (``torch.utils.data``'s ``pin_memory``, ``torch.utils._pytree``
``tree_map``, Lightning's ``apply_to_collection``) treat it as one; ``batch.indices`` and
``batch.keys()`` say which samples fill the rows (per-file evaluation output, debugging a
bad batch), which a plain pair could not without a source rebuilt around the index.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    import numpy as np
    import torch

    from gpu_loader.sources import SampleIndex


class _Pair(NamedTuple):
    images: torch.Tensor
    """``[N, 3, H, W]`` on the loader's device."""
    labels: torch.Tensor
    """``[N]`` int64 on the loader's device."""


class Batch(_Pair):
    """``(images, labels)``, with the samples' source indices in row order.

    ``indices`` is an ``[N]`` int64 CPU tensor of positions in the loader's source
    (``loader.dataset``), row for row. A batch rebuilt from its fields (by ``pin_memory``,
    ``tree_map``, ``Batch(images, labels)``) has ``indices`` None; ``_replace`` keeps
    them while the images keep their row count.
    """

    indices: torch.Tensor | None = None
    _origin: SampleIndex | None = None

    def __new__(
        cls,
        images: torch.Tensor,
        labels: torch.Tensor,
        indices: np.ndarray[Any, Any] | None = None,
        source: SampleIndex | None = None,
    ) -> Batch:
        batch = super().__new__(cls, images, labels)
        if indices is not None:
            import torch

            batch.indices = torch.from_numpy(indices)
            batch._origin = source
        return batch

    def _replace(self, /, **fields: Any) -> Batch:
        """A copy with fields replaced, as a named tuple's (``batch._replace(images=
        images.cuda())``); it keeps naming its rows while its images keep their row count
        (QA65: ``indices`` was dropped)."""
        new = Batch(fields.pop("images", self.images), fields.pop("labels", self.labels))
        if fields:
            raise ValueError(f"Batch has no field(s) {sorted(fields)}: only images, labels")
        if self.indices is not None and len(new.images) == len(self.indices):
            new.indices, new._origin = self.indices, self._origin
        return new

    def keys(self) -> list[str]:
        """Each row's sample key (its path, URL or ``shard:member``)."""
        if self.indices is None or self._origin is None:
            raise ValueError(
                "this batch was rebuilt from its tensors (pin_memory, tree_map, ...) and no "
                "longer knows its samples: read .keys() on the batch the loader yielded"
            )
        key = self._origin.key
        return [key(i) for i in self.indices.tolist()]

    def __reduce__(self) -> Any:
        # A plain pair when pickled or copied: readable without gpu_loader, and the
        # source (which may hold a whole file list) stays here.
        return (tuple, ((self.images, self.labels),))

    def __repr__(self) -> str:
        rows = "?" if self.indices is None else len(self.indices)
        return (
            f"Batch(images={tuple(self.images.shape)} {self.images.dtype} on "
            f"{self.images.device}, {rows} samples)"
        )
