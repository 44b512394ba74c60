"""The public surface is small, sorted and exactly the documented names."""

from __future__ import annotations

import importlib

import pytest

import gpu_loader

# The documented top-level names (README "Public API", docs/architecture.md).
DOCUMENTED = [
    "FailedSample",
    "ImageLoader",
    "LoaderOptions",
    "PipelineFailure",
    "__version__",
    "batching",
    "cuda",
    "datasets",
    "monitor",
    "ops",
    "pipeline",
    "sources",
]


def test_all_is_sorted() -> None:
    assert list(gpu_loader.__all__) == sorted(gpu_loader.__all__)


def test_all_is_the_documented_surface() -> None:
    assert list(gpu_loader.__all__) == DOCUMENTED


def test_every_public_name_resolves() -> None:
    for name in gpu_loader.__all__:
        assert getattr(gpu_loader, name) is not None


def test_unknown_name_is_an_attribute_error() -> None:
    try:
        gpu_loader.not_a_name  # noqa: B018
    except AttributeError as exc:
        assert "not_a_name" in str(exc)
    else:
        raise AssertionError("expected AttributeError")


@pytest.mark.parametrize("name", ["batching", "cuda", "monitor", "ops", "pipeline", "sources"])
def test_each_subpackages_names_resolve_once(name: str) -> None:
    # Their order is ruff's (RUF022, isort-style: constants, classes, functions), which
    # `make test` checks; `pipeline` keeps plain sorted() (tests/pipeline/test_builder.py).
    module = importlib.import_module(f"gpu_loader.{name}")
    names = list(module.__all__)
    assert len(names) == len(set(names))
    for public in names:
        assert getattr(module, public) is not None, public
