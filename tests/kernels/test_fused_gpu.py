"""The fused kernel on a real GPU, through the CUDA launcher and the shared checker.

Skipped cleanly (needs_cuda) on machines without a usable CUDA device.
"""

from __future__ import annotations

import numpy as np
import pytest

from gpu_loader.cuda._launch import OUTPUT_DTYPES, OutputDtype
from tests.kernels.checker import check_fused_kernel, random_case, run_cupy


@pytest.mark.needs_cuda
@pytest.mark.parametrize("dtype", OUTPUT_DTYPES)
@pytest.mark.parametrize("seed", range(3))
def test_cuda_kernel_matches_the_reference(dtype: OutputDtype, seed: int) -> None:
    from gpu_loader.cuda._fused import launch_fused

    rng = np.random.default_rng([seed, 7])
    case = random_case(rng, dtype, n=int(rng.integers(2, 6)), label=f"gpu seed {seed}")
    check_fused_kernel(run_cupy(launch_fused), case)


@pytest.mark.needs_cuda
def test_cuda_kernel_equals_the_emulation_for_reduced_precision() -> None:
    # float16/bfloat16/uint8 stores are the same conversions on both sides; the float32
    # arithmetic may differ in the last bits (the device contracts to FMA more eagerly).
    from gpu_loader.cuda._emulation import launch_fused_emulated
    from gpu_loader.cuda._fused import launch_fused
    from tests.kernels.checker import as_float64, run_host

    rng = np.random.default_rng(3)
    for dtype in ("float16", "bfloat16", "uint8"):
        case = random_case(rng, dtype, n=4)  # type: ignore[arg-type]
        gpu = as_float64(run_cupy(launch_fused)(case, 0), dtype)
        cpu = as_float64(run_host(launch_fused_emulated)(case, 0), dtype)
        ulp = {"float16": 2.0**-10, "bfloat16": 2.0**-7, "uint8": 0.0}[dtype]
        assert np.all(np.abs(gpu - cpu) <= ulp * np.abs(cpu) + (1.0 if dtype == "uint8" else 1e-6))
