"""Every pipeline test must leave no pipeline thread behind."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from ._helpers import pipeline_threads, wait_no_pipeline_threads


@pytest.fixture(autouse=True)
def no_leaked_threads() -> Iterator[None]:
    assert pipeline_threads() == [], "a previous test leaked pipeline threads"
    yield
    left = wait_no_pipeline_threads(timeout=3.0)
    assert left == [], f"leaked threads: {[t.name for t in left]}"
