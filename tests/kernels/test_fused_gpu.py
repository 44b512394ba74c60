"""The fused kernel on a real GPU, through the CUDA launcher and the shared checker.

Skipped cleanly (needs_cuda) on machines without a usable CUDA device.
"""

from __future__ import annotations

import numpy as np
import pytest

from gpu_loader.cuda._launch import OUTPUT_DTYPES, OutputDtype
from tests.kernels.checker import TOLERANCES, check_fused_kernel, random_case, run_cupy


@pytest.mark.needs_cuda
@pytest.mark.parametrize("interpolation", ["bilinear", "bicubic"])
@pytest.mark.parametrize("dtype", OUTPUT_DTYPES)
@pytest.mark.parametrize("seed", range(3))
def test_cuda_kernel_matches_the_reference(
    dtype: OutputDtype, seed: int, interpolation: str
) -> None:
    from gpu_loader.cuda._fused import launch_fused

    rng = np.random.default_rng([seed, 7])
    case = random_case(
        rng, dtype, n=int(rng.integers(2, 6)), label=f"gpu seed {seed}",
        interpolation=interpolation,
    )  # fmt: skip
    check_fused_kernel(run_cupy(launch_fused), case)


@pytest.mark.needs_cuda
def test_cuda_kernel_equals_the_emulation_for_reduced_precision() -> None:
    # float16/bfloat16/uint8 stores are the same conversions on both sides; the float32
    # arithmetic before them may differ (the device contracts to FMA more eagerly), by at
    # most twice the checker's float32 bound: near zero, after normalisation cancels,
    # that is several float16 steps (seen on an H100: 7.6e-6 at -0.0021).
    from gpu_loader.cuda._emulation import launch_fused_emulated
    from gpu_loader.cuda._fused import launch_fused
    from tests.kernels.checker import as_float64, run_host

    rng = np.random.default_rng(3)
    for dtype, interpolation in [
        (dtype, interpolation)
        for dtype in ("float16", "bfloat16", "uint8")
        for interpolation in ("bilinear", "bicubic")
    ]:
        case = random_case(rng, dtype, n=4, interpolation=interpolation)  # type: ignore[arg-type]
        gpu = as_float64(run_cupy(launch_fused)(case, 0), dtype)
        cpu = as_float64(run_host(launch_fused_emulated)(case, 0), dtype)
        ulp = {"float16": 2.0**-10, "bfloat16": 2.0**-7, "uint8": 0.0}[dtype]
        arithmetic = 2 * TOLERANCES["float32"][1]
        excess = np.abs(gpu - cpu) - (ulp * np.abs(cpu) + (1.0 if dtype == "uint8" else arithmetic))
        worst = np.unravel_index(int(np.argmax(excess)), excess.shape)
        assert excess[worst] <= 0, (
            f"{dtype}, {interpolation}: {int(np.count_nonzero(excess > 0))} of {excess.size} values differ by "
            f"more than one step; worst at {tuple(int(i) for i in worst)}: "
            f"device {gpu[worst]!r}, emulation {cpu[worst]!r}"
        )
