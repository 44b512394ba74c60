"""Test harness: the `needs_cuda` marker skips cleanly when no CUDA device is usable."""

from __future__ import annotations

import pytest


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    marked = [item for item in items if item.get_closest_marker("needs_cuda")]
    if not marked:
        return
    from gpu_loader.cuda import cuda_available

    if cuda_available():
        return
    skip = pytest.mark.skip(reason="needs_cuda: no usable CUDA device (torch sees none)")
    for item in marked:
        item.add_marker(skip)
