"""The one compiled part: gpu_loader.ops._native (the CPU fast path, C + libjpeg-turbo).

Everything else is configured in pyproject.toml. The extension is optional: without a C
compiler or libjpeg's headers (Debian/Ubuntu `libjpeg-dev`, Fedora `libjpeg-turbo-devel`)
the package still installs and `gpu_loader.ops` falls back to its Pillow path (slower, same
function); `gpu_loader.ops.cpu_backend()` says which one runs.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "gpu_loader.ops._native",
            sources=["gpu_loader/ops/_native.c"],
            libraries=["jpeg"],
            # -O3 vectorises the row loops; -fno-trapping-math lets it turn the casts'
            # selects into vector blends (no result changes); no -ffast-math: rounding
            # must stay IEEE, and -ffp-contract=off keeps a*b+c from fusing where a build
            # targets FMA (train_params must round as numpy's Philox draws do).
            extra_compile_args=[
                "-O3",
                "-fno-trapping-math",
                "-ffp-contract=off",
                "-std=c11",
                "-Wall",
                "-Wextra",
                "-Wno-unused-parameter",
            ],
            optional=True,
        )
    ]
)
