"""Every kernels/*.cu compiles: nvcc for sm_75 to sm_120, NVRTC with the loader's exact
options, and the host C++ compiler through the emulation header."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from gpu_loader._resources import kernel_dir, read_kernel
from gpu_loader.cuda._emulation import CXX_FLAGS, EMULATION_HEADER, compiler, load_library
from gpu_loader.cuda._kernels import KERNEL_SOURCES, NVRTC_OPTIONS, nvrtc_options
from gpu_loader.cuda._launch import KERNEL_NAMES

KERNEL_DIR = Path(str(kernel_dir()))
ARCHES = ("75", "80", "86", "89", "90", "100", "120")  # T4 .. H100, B200, RTX 50xx


def nvcc_path() -> str | None:
    found = shutil.which("nvcc")
    if found:
        return found
    default = Path("/usr/local/cuda/bin/nvcc")
    return str(default) if default.is_file() else None


def test_every_source_is_listed() -> None:
    on_disk = sorted(p.name for p in KERNEL_DIR.glob("*.cu"))
    assert on_disk == sorted(KERNEL_SOURCES)


@pytest.mark.parametrize("source", KERNEL_SOURCES)
def test_nvcc_compiles_for_sm80_and_sm90(source: str, tmp_path: Path) -> None:
    nvcc = nvcc_path()
    if nvcc is None:
        pytest.skip("nvcc is not installed (looked on PATH and in /usr/local/cuda/bin)")
    gencode = [f"-gencode=arch=compute_{a},code=sm_{a}" for a in ARCHES]
    cmd = [
        nvcc, "--fatbin", *gencode, *NVRTC_OPTIONS, "--Werror", "all-warnings",
        # Spills to local memory would mean the kernel is not what docs/kernels.md describes.
        "-Xptxas", "-warn-spills,-warn-lmem-usage,-Werror",
        str(KERNEL_DIR / source), "-o", str(tmp_path / "k.fatbin"),
    ]  # fmt: skip
    result = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=300)
    assert result.returncode == 0, f"{' '.join(cmd)}\n{result.stderr}"
    assert (tmp_path / "k.fatbin").stat().st_size > 0


# 5 blocks of BLOCK's 256 threads fit an SM's 65,536 registers at 48 a thread or fewer
# (registers go to a warp in units of 256: 49-56 a thread cost as much as 56, 4 blocks).
MAX_REGISTERS = 48


@pytest.mark.parametrize("arch", ["80", "90"])
def test_every_entry_point_keeps_to_the_register_budget(arch: str, tmp_path: Path) -> None:
    # QA59: the filter chosen at run time inside one kernel took 54 registers, so 4 blocks
    # an SM instead of 5, for bilinear users too; each filter now has its own entry points.
    nvcc = nvcc_path()
    if nvcc is None:
        pytest.skip("nvcc is not installed (looked on PATH and in /usr/local/cuda/bin)")
    cmd = [
        nvcc, "--cubin", f"-gencode=arch=compute_{arch},code=sm_{arch}", *NVRTC_OPTIONS,
        "-Xptxas", "-v", str(KERNEL_DIR / "fused_resize.cu"), "-o", str(tmp_path / "k.cubin"),
    ]  # fmt: skip
    result = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=300)
    assert result.returncode == 0, result.stderr
    used = dict(
        re.findall(r"Compiling entry function '(\w+)'.*?Used (\d+) registers", result.stderr, re.S)
    )
    assert set(used) == set(KERNEL_NAMES.values()), sorted(used)
    over = {name: int(n) for name, n in used.items() if int(n) > MAX_REGISTERS}
    assert not over, f"sm_{arch}: over {MAX_REGISTERS} registers a thread: {over}"


def _nvrtc():  # type: ignore[no-untyped-def]
    try:
        from cupy_backends.cuda.libs import nvrtc

        nvrtc.getVersion()
    except (ImportError, OSError, RuntimeError) as exc:
        pytest.skip(f"NVRTC is not loadable (pip install 'gpu-loader[cuda12]'): {exc}")
    return nvrtc


# What cupy.RawModule appends to the loader's options: `-ftz=true` always, then
# `-arch=sm_XX` (a cubin) when NVRTC knows the device, else `-arch=compute_XX` (PTX).
CUPY_ADDED = ("-ftz=true",)


@pytest.mark.parametrize("target", [f"{kind}_{a}" for a in ARCHES for kind in ("sm", "compute")])
@pytest.mark.parametrize("source", KERNEL_SOURCES)
def test_nvrtc_compiles_with_the_loader_options(source: str, target: str) -> None:
    nvrtc = _nvrtc()
    options = nvrtc_options()
    assert options[: len(NVRTC_OPTIONS)] == NVRTC_OPTIONS
    program = nvrtc.createProgram(read_kernel(source), source, [], [])
    try:
        try:
            nvrtc.compileProgram(program, [*options, *CUPY_ADDED, f"-arch={target}"])
        except nvrtc.NVRTCError as exc:
            pytest.fail(f"NVRTC failed on {source}: {exc}\n{nvrtc.getProgramLog(program)}")
        if target.startswith("sm_"):
            binary = bytes(nvrtc.getCUBIN(program))
            assert binary[:4] == b"\x7fELF"
            for name in KERNEL_NAMES.values():
                assert name.encode() in binary
            return
        ptx = nvrtc.getPTX(program)
    finally:
        nvrtc.destroyProgram(program)
    text = ptx.decode() if isinstance(ptx, bytes) else str(ptx)
    entries = set(re.findall(r"\.entry\s+(\w+)", text))
    assert set(KERNEL_NAMES.values()) <= entries


@pytest.mark.parametrize("source", KERNEL_SOURCES)
def test_host_compiler_builds_the_emulation_without_warnings(source: str, tmp_path: Path) -> None:
    (tmp_path / source).write_text(read_kernel(source))
    (tmp_path / EMULATION_HEADER).write_text(read_kernel(EMULATION_HEADER))
    cmd = [
        compiler(), *CXX_FLAGS, "-Wall", "-Wextra", "-Werror", f"-I{tmp_path}",
        str(tmp_path / source), "-o", str(tmp_path / "k.so"),
    ]  # fmt: skip
    result = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=300)
    assert result.returncode == 0, result.stderr


def test_emulation_library_exports_every_kernel() -> None:
    library = load_library()
    for name in KERNEL_NAMES.values():
        assert hasattr(library, f"emulated_{name}")


def test_emulation_library_is_cached_by_source_hash(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import gpu_loader.cuda._emulation as emulation

    monkeypatch.setenv("GPU_LOADER_CACHE", str(tmp_path))
    emulation.load_library.cache_clear()
    try:
        emulation.load_library()
        built = sorted(p.name for p in (tmp_path / "emulation").iterdir())
        assert len(built) == 1 and built[0].startswith("fused_resize-") and built[0].endswith(".so")
        # A changed source gets its own library; a broken one says why.
        original = emulation.read_kernel
        monkeypatch.setattr(
            emulation,
            "read_kernel",
            lambda name: original(name) + ("\nthis is not C++;\n" if name.endswith(".cu") else ""),
        )
        emulation.load_library.cache_clear()
        with pytest.raises(RuntimeError, match=r"fused_resize\.cu failed"):
            emulation.load_library()
        assert sorted(p.name for p in (tmp_path / "emulation").iterdir()) == built
    finally:
        emulation.load_library.cache_clear()
