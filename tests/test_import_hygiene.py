"""Importing gpu_loader needs no GPU package, and asking for a GPU feature says what to install."""

from __future__ import annotations

import json
import pkgutil
import subprocess
import sys
import textwrap

import gpu_loader

BLOCKED = ("torch", "cupy", "cupyx", "cupy_backends", "nvidia.nvimgcodec", "pynvml")

# Modules documented as needing one of the blocked packages at import time.
NEEDS_GPU_PACKAGE_AT_IMPORT: set[str] = set()

BLOCKER = textwrap.dedent(
    """
    import importlib.abc, sys
    BLOCKED = {blocked!r}
    class Blocker(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if any(name == b or name.startswith(b + ".") for b in BLOCKED):
                raise ImportError(f"blocked for the test: {{name}}")
            return None
    sys.meta_path.insert(0, Blocker())
    for b in BLOCKED:
        sys.modules.pop(b, None)
    """
).format(blocked=BLOCKED)


def all_modules() -> list[str]:
    names = ["gpu_loader"]
    for info in pkgutil.walk_packages(gpu_loader.__path__, prefix="gpu_loader."):
        names.append(info.name)
    return sorted(names)


def run_blocked(body: str) -> subprocess.CompletedProcess[str]:
    code = BLOCKER + "\n" + textwrap.dedent(body)
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )


def test_walk_finds_the_subpackages() -> None:
    names = all_modules()
    for sub in ("pipeline", "sources", "ops", "cuda", "batching", "monitor"):
        assert f"gpu_loader.{sub}" in names


def test_every_module_imports_without_gpu_packages() -> None:
    modules = [m for m in all_modules() if m not in NEEDS_GPU_PACKAGE_AT_IMPORT]
    result = run_blocked(
        f"""
        import importlib, json
        failures = {{}}
        for name in {modules!r}:
            try:
                importlib.import_module(name)
            except Exception as exc:
                failures[name] = repr(exc)
        leaked = sorted(b for b in BLOCKED if b in sys.modules)
        print(json.dumps({{"failures": failures, "leaked": leaked}}))
        """
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["failures"] == {}
    assert report["leaked"] == []


def test_blocker_really_blocks() -> None:
    # Guards the test above: if the blocker did nothing it would pass vacuously.
    result = run_blocked("import cupy")
    assert result.returncode != 0
    assert "blocked for the test" in result.stderr


def test_gpu_feature_without_packages_names_the_extra() -> None:
    result = run_blocked(
        """
        from gpu_loader._optional import require
        try:
            require("cupy", "the fused CUDA kernels")
        except ImportError as exc:
            print(str(exc))
        """
    )
    assert result.returncode == 0, result.stderr
    assert "the fused CUDA kernels needs CuPy" in result.stdout
    # The package itself is not on an index: the hint names what pip can find.
    assert "pip install cupy-cuda12x for CUDA 12, cupy-cuda13x for CUDA 13" in result.stdout
    assert "gpu-loader[" not in result.stdout


def test_cuda_probe_is_false_without_packages() -> None:
    result = run_blocked(
        """
        from gpu_loader.cuda import cuda_available
        print(cuda_available())
        """
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False"
