"""The GPU benchmarks without a GPU: each says it needs one, exits 0, writes nothing."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from gpu_loader.cuda import cuda_available


@pytest.mark.skipif(cuda_available(), reason="a GPU is present: the benchmark would run")
@pytest.mark.parametrize(
    ("module", "args"), [("gpu_vs_cpu", ["--quick"]), ("gpu_profile", ["--sections", "decode"])]
)
def test_gpu_benchmark_exits_cleanly_without_a_gpu(
    tmp_path: Path, module: str, args: list[str]
) -> None:
    out = tmp_path / f"{module}.json"
    result = subprocess.run(
        [sys.executable, "-m", f"gpu_loader.benchmarks.{module}", *args, "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "needs a usable CUDA GPU" in result.stdout
    assert not out.exists()
