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


def test_switch_interval_is_checked_before_anything_runs() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "gpu_loader.benchmarks.gpu_profile", "--switch-interval", "0"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2
    assert "--switch-interval must be > 0" in result.stderr


def test_timed_ports_time_every_decode_call_and_pass_results_through() -> None:
    from gpu_loader.benchmarks.gpu_profile import TimedDecoder, timed_ports

    from gpu_loader.cuda import standin_ports
    from gpu_loader.cuda._standin_device import StandinRuntime
    from tests.cuda.conftest import sample_files

    runtime = StandinRuntime()
    calls: list[float] = []
    ports = timed_ports(standin_ports(runtime), calls)
    decoder = ports.make_decoder()
    assert isinstance(decoder, TimedDecoder)
    files = sample_files()
    blobs = [memoryview(files[name]) for name in ("a.jpg", "c.jpg", "truncated.jpg")]
    stream = runtime.new_stream()
    images = decoder.decode(blobs, stream)
    runtime.record_event(stream).synchronize()
    assert [im is not None for im in images] == [True, True, False]
    assert (images[0].height, images[0].width) == (120, 160)
    decoder.decode(blobs[:1], stream)
    runtime.record_event(stream).synchronize()
    assert len(calls) == 2 and all(c > 0 for c in calls)
    assert ports.runtime is runtime  # only the decoder factory is replaced


@pytest.mark.parametrize("exif_orientation", [True, False])
def test_the_stage_decodes_through_the_timed_decoder(exif_orientation: bool) -> None:
    # QA59: the stage passed a third argument that TimedDecoder.decode did not take; the
    # TypeError sent every batch to the CPU decoder, and the sweep timed that instead.
    from gpu_loader.benchmarks.gpu_profile import timed_ports

    from gpu_loader.cuda import standin_ports
    from gpu_loader.cuda._arena import PinnedArena
    from gpu_loader.cuda._gpu_stage import GpuBatchStage, GpuFetcher, handoff
    from gpu_loader.cuda._standin_device import StandinRuntime
    from gpu_loader.ops import TrainTransform
    from gpu_loader.sources import FileList
    from tests.cuda.conftest import sample_files

    files = sample_files()
    names = ["a.jpg", "c.jpg", "exif6.jpg"]
    source = FileList([(f"memory://timed/{n}", 0) for n in names])
    import fsspec

    fs = fsspec.filesystem("memory")
    for name in names:
        fs.pipe_file(f"/timed/{name}", files[name])
    runtime = StandinRuntime()
    calls: list[float] = []
    transform = TrainTransform(32, exif_orientation=exif_orientation)
    stage = GpuBatchStage(timed_ports(standin_ports(runtime), calls), transform, source.labels)
    cpu_decodes: list[str] = []
    fallback = stage._fallback
    stage._fallback = lambda sample, stream: (  # type: ignore[method-assign]
        cpu_decodes.append(sample.key) or fallback(sample, stream)
    )
    arena = PinnedArena(1 << 20, allocator=runtime.alloc_pinned)
    fetch = GpuFetcher(source, arena, transform, seed=0, epoch=0)
    batch = stage([fetch.fetch(i, i) for i in range(len(names))], stage.worker_init())
    handoff(batch)
    assert batch.failed == [] and len(batch.positions) == len(names)
    assert len(calls) == 1 and cpu_decodes == []
