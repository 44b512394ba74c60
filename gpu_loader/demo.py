"""`gpu-loader demo`: the loader through a simulated training loop, and its report."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from gpu_loader._failed import counted, shown_key

if TYPE_CHECKING:
    import torch

    from gpu_loader.sources import SampleIndex


@dataclass(frozen=True)
class DemoReport:
    """What the demo prints and, on request, writes."""

    text: str
    """The human-readable report (summary table, per-stage table, bottleneck, failures)."""
    json: str
    """The final `LoaderStats.as_dict()` plus run settings, as a JSON document."""


def run_demo(
    index: SampleIndex,
    *,
    epochs: int,
    batch_size: int,
    size: int,
    device: str,
    batching: str,
    step_s: float,
    decode_on: str = "auto",
    threads: int | None,
    progress: bool,
    log_jsonl: Path | None = None,
    max_failures: int | float | None = 0.01,
) -> DemoReport:
    """Run `epochs` epochs; each batch is "trained on" for `step_s` seconds (a GIL-free wait).

    The wait stands in for the forward and backward pass: while it runs the loader keeps
    working in its threads, so the stall fraction shows whether data keeps up.
    """
    from gpu_loader import ImageLoader
    from gpu_loader.inspect import cpu_backend_line
    from gpu_loader.loader import LoaderOptions
    from gpu_loader.monitor import format_summary
    from gpu_loader.ops import TrainTransform, cpu_backend

    options = LoaderOptions(
        decode_threads=threads,
        progress=progress,
        log_jsonl=str(log_jsonl) if log_jsonl is not None else None,
        log_interval_s=1.0,
        decode_on=decode_on,  # type: ignore[arg-type]
    )
    loader = ImageLoader(
        index,
        batch_size=batch_size,
        transform=TrainTransform(size),
        device=device,  # type: ignore[arg-type]
        dtype="float32",
        batching=batching,  # type: ignore[arg-type]
        max_failures=max_failures,
        options=options,
    )
    with loader:
        for epoch in range(epochs):
            loader.set_epoch(epoch)
            for images, _labels in loader:
                _train_step(images, step_s)
        stats = loader.stats()
        failed = loader.failed_samples()
    decoded_on = "gpu" if loader.decodes_on_gpu else "cpu"
    lines = [
        f"gpu-loader demo: {counted(len(index), 'image')}, {epochs} epoch(s), batch {batch_size}, "
        f"{size}x{size}, device {loader.device}, decode on {decoded_on}, batching {batching}, "
        f"{loader.decode_threads} decode thread(s), simulated step {step_s * 1000:.0f} ms",
    ]
    if decoded_on == "cpu":
        # QA68: a failed build of the native extension runs the Pillow path (about a
        # third of the speed here) and the install says nothing unless verbose.
        lines.append(cpu_backend_line())
    lines += ["", format_summary(stats)]
    if reading := _reading(
        stats.samples_per_s, stats.batches_per_s, stats.stall_fraction, batch_size, step_s
    ):
        lines += ["", reading]
    if failed:
        lines += ["", f"failed samples ({len(failed)}):"]
        lines += [
            f"  {shown_key(f.key)}  [{f.stage}, epoch {f.epoch}] {f.error}" for f in failed[:20]
        ]
        if len(failed) > 20:
            lines.append(f"  ... and {len(failed) - 20} more")
    settings = {
        "images": len(index),
        "epochs": epochs,
        "batch_size": batch_size,
        "size": size,
        "device": str(loader.device),
        "decode_on": decoded_on,
        "cpu_backend": cpu_backend(),
        "batching": batching,
        "step_ms": step_s * 1000,
    }
    document = {
        "settings": settings,
        "stats": stats.as_dict(),
        "failed": [
            {"key": f.key, "stage": f.stage, "error": f.error, "epoch": f.epoch} for f in failed
        ],
    }
    return DemoReport(text="\n".join(lines), json=json.dumps(document, indent=2) + "\n")


def _reading(rate: float, batch_rate: float, stall: float, batch_size: int, step_s: float) -> str:
    """One sentence on what the stall means for this run: who is the limit, and the step
    that the loader would keep up with (empty when there is nothing to say). Per batch
    as delivered (``batch_rate``): short last batches and failed samples make a batch
    smaller than ``batch_size`` (QA51: 140 ms of a batch accounted for where one came
    every 73 ms)."""
    if step_s <= 0 or rate <= 0 or batch_rate <= 0:
        return ""
    wanted = batch_size / step_s
    if stall < 0.05:
        return (
            f"reading      : the loader kept up with the simulated step (which alone would "
            f"consume {wanted:,.0f} samples/s): the training loop set the pace."
        )
    # Per batch, as delivered: the loop waited `stall` of it; the rest was its own work,
    # the step and what else it does with a batch (reading it, contending for the CPUs).
    period_ms = 1000 / batch_rate
    waited_ms = stall * period_ms
    other_ms = max(0.0, period_ms - waited_ms - step_s * 1000)
    return (
        f"reading      : the simulated step alone would consume {wanted:,.0f} samples/s "
        f"({batch_size} per {step_s * 1000:.0f} ms); the loader delivered {rate:,.0f}/s, and "
        f"the training loop waited {waited_ms:.1f} ms a batch for it ({stall:.0%}), besides "
        f"the step and {other_ms:.0f} ms a batch of its own (its work with the batch, and "
        f"waiting for CPU time the loader's threads held). A step of about "
        f"{step_s * 1000 + waited_ms:.0f} ms or more (--step-ms) should not wait (an "
        "estimate: the loader's rate varies); more CPU cores (or a GPU) would raise the "
        "loader's rate."
    )


def _train_step(images: torch.Tensor, step_s: float) -> None:
    # Read the batch as a model would (on CUDA .item() also waits for the copy to land),
    # then wait without holding the GIL: the loader's threads work meanwhile.
    images.float().mean().item()
    if step_s > 0:
        time.sleep(step_s)
