"""One cache folder for everything the package makes, and the variables that move it."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

from gpu_loader._resources import cache_root
from gpu_loader.cli import cache_dir
from gpu_loader.cuda import _emulation


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> pytest.MonkeyPatch:
    for var in ("GPU_LOADER_CACHE", "GPU_LOADER_CACHE_DIR", "XDG_CACHE_HOME"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / "home").mkdir()
    return monkeypatch


def test_datasets_and_emulation_builds_share_one_root(
    clean_env: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    assert cache_root() == tmp_path / "home" / ".cache" / "gpu_loader"
    clean_env.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_root() == tmp_path / "xdg" / "gpu_loader"
    clean_env.setenv("GPU_LOADER_CACHE_DIR", str(tmp_path / "old"))  # the emulation's old name
    assert cache_root() == tmp_path / "old"
    clean_env.setenv("GPU_LOADER_CACHE", str(tmp_path / "new"))  # wins over both
    assert cache_root() == tmp_path / "new"
    assert cache_dir() == tmp_path / "new"
    assert _emulation.cache_dir() == tmp_path / "new" / "emulation"


def test_no_writable_home_falls_back_to_a_per_user_temp_folder(
    clean_env: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    clean_env.setenv("HOME", str(tmp_path / "missing"))
    root = cache_root()
    assert root.parent == Path(tempfile.gettempdir())
    assert root.name.startswith("gpu_loader-")
