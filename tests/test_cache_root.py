"""One cache folder for everything the package makes, and the variables that move it."""

from __future__ import annotations

import os
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


def test_no_writable_home_falls_back_to_a_private_temp_folder(
    clean_env: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    temp = tmp_path / "tmp"
    temp.mkdir()
    clean_env.setattr(tempfile, "gettempdir", lambda: str(temp))
    clean_env.setenv("HOME", str(tmp_path / "missing"))
    root = cache_root()
    assert root == temp / f"gpu_loader-{os.getuid()}"
    assert root.stat().st_mode & 0o777 == 0o700
    assert cache_root() == root  # the same folder next time


def test_no_home_at_all(clean_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # No $HOME and a uid with no passwd entry (some containers): Path.home() raises.
    def no_home() -> Path:
        raise RuntimeError("Could not determine home directory.")

    clean_env.setattr(Path, "home", staticmethod(no_home))
    clean_env.setattr(tempfile, "gettempdir", lambda: str(tmp_path))
    assert cache_root() == tmp_path / f"gpu_loader-{os.getuid()}"


def test_a_temp_folder_others_can_write_is_not_used(
    clean_env: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # Its name is predictable, and the kernels' emulation loads libraries from it.
    clean_env.setattr(tempfile, "gettempdir", lambda: str(tmp_path))
    clean_env.setenv("HOME", str(tmp_path / "missing"))
    planted = tmp_path / f"gpu_loader-{os.getuid()}"
    planted.mkdir()
    planted.chmod(0o777)
    root = cache_root()
    assert root != planted and root.parent == tmp_path and root.is_dir()
    assert root.stat().st_mode & 0o077 == 0
