"""Straggler-aware batching vs ordered batching vs DataLoader on heavy-tailed data (issue 6).

Two scenarios on the same generated folder, and a control:

* ``decode``: about 10% "heavy" images (3-4x the sides: 9-16x the pixels), so decode cost
  is heavy-tailed;
* ``reads``: the same images, and 10% of reads take an extra 150 ms (a GIL-free sleep),
  the stragglers of remote storage;
* ``control``: a folder generated the same way with no heavy images (it keeps the 2%
  PNGs both folders have). What ``decode`` stalls beyond it, system by system, is the
  stall its heavy images cause: ``stall_from_heavy_images`` in the JSON.

A consumer simulates a training step with a fixed GIL-free wait,
sized so the loader's mean throughput is about 10% above what the consumer needs. For
each system we measure the data-stall fraction (time the training loop waits for a batch
over its total time, after the first batch: start-up is reported apart) and the epoch
time, against the ideal ``max(total compute / threads, total consumer time)``.

    python benchmarks/stragglers.py               # 1200 images, 2 epochs per system
    python benchmarks/stragglers.py --rounds 3    # each system 3 times; medians
    python benchmarks/stragglers.py --quick       # 200 images, 1 epoch

Results: ``benchmarks/results/stragglers.json`` and a markdown table on stdout.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make `gpu_loader.benchmarks` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gpu_loader.benchmarks._common import add_out_argument, format_table, run_worker, write_results

BATCH = 32
SIZE = 224
HEADROOM = 1.10  # loader throughput / consumer need
# straggler_cost: straggler mode with cost-aware start order (larger files first within each
# nominal batch's block of positions, LoaderOptions(cost_lookahead=BATCH)).
SYSTEMS = ("ordered", "straggler", "straggler_cost", "dataloader_w2")
SCENARIOS = ("decode", "reads", "control")
SLOW_FRACTION = 0.10
SLOW_READ_S = 0.150


def is_slow(index: int) -> bool:
    """The same deterministic 10% of samples are slow to read for every system."""
    return (index * 2654435761) % 1000 < SLOW_FRACTION * 1000


class SlowReads:
    """A SampleIndex whose reads of the `is_slow` samples wait `SLOW_READ_S` first."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def __len__(self) -> int:
        return len(self.inner)

    def read(self, i: int) -> bytes:
        if is_slow(i):
            time.sleep(SLOW_READ_S)
        return bytes(self.inner.read(i))


def make_index(data: Path, scenario: str) -> Any:
    import gpu_loader as gl

    index = gl.sources.ImageFolder(data)
    return SlowReads(index) if scenario == "reads" else index


def make_loader(data: Path, system: str, scenario: str = "decode", batch: int = BATCH) -> Any:
    import gpu_loader as gl

    cost = system == "straggler_cost"
    return gl.ImageLoader(
        make_index(data, scenario),
        batch_size=batch,
        transform=gl.ops.TrainTransform(SIZE),
        batching="straggler" if cost else system,
        seed=0,
        options=gl.LoaderOptions(monitor_gpu=False, cost_lookahead=batch if cost else 0),
    )


def make_dataloader(data: Path, scenario: str, batch: int = BATCH) -> Iterable[Any]:
    import torch.utils.data as tud
    from gpu_loader.benchmarks.cpu_loaders import FastSample, list_files

    class Sample(FastSample):
        def __getitem__(self, i: int) -> tuple[Any, int]:
            if scenario == "reads" and is_slow(i):
                time.sleep(SLOW_READ_S)
            return super().__getitem__(i)

    files, labels = list_files(data)
    return tud.DataLoader(
        Sample(files, labels, "train"),
        batch_size=batch,
        shuffle=True,
        num_workers=2,
        prefetch_factor=2,
    )


def calibrate(
    data: Path, epochs: int, scenario: str, batch: int = BATCH, system: str = "ordered"
) -> dict[str, Any]:
    """Loader throughput with no consumer wait, and the total read + decode time."""
    loader = make_loader(data, system, scenario, batch)
    start = time.perf_counter()
    images = 0
    with loader:
        for epoch in range(epochs):
            loader.set_epoch(epoch)
            for x, _ in loader:
                images += int(x.shape[0])
        stats = loader.stats()
    wall = time.perf_counter() - start
    decode = next(s for s in stats.stages if s.name == "decode")
    read = next(s for s in stats.stages if s.name == "read")
    per_epoch_compute = (
        decode.task_time_mean_s * decode.tasks_done + read.task_time_mean_s * read.tasks_done
    )
    return {
        "img_per_s": images / wall,
        "compute_s_per_epoch": per_epoch_compute,  # stats cover the last epoch's pipeline
        "threads": loader.decode_threads,
    }


def consume(batches: Iterable[Any], step_s: float) -> dict[str, float]:
    """The simulated training loop: wait for a batch, then a GIL-free step.

    The first wait (threads or worker processes starting, first decodes) is start-up,
    reported as ``startup_s`` and left out of ``stall_s`` and ``epoch_s``.
    """
    waited = startup = 0.0
    count = 0
    start = time.perf_counter()
    iterator = iter(batches)
    while True:
        t0 = time.perf_counter()
        batch = next(iterator, None)
        wait = time.perf_counter() - t0
        if count == 0:
            startup = wait
            start = time.perf_counter()
        else:
            waited += wait
        if batch is None:
            break
        count += 1
        time.sleep(step_s)
    total = time.perf_counter() - start
    return {"epoch_s": total, "stall_s": waited, "batches": count, "startup_s": startup}


def worker(
    system: str, data: Path, step_s: float, epochs: int, scenario: str, batch: int = BATCH
) -> dict[str, Any]:
    epochs_out = []
    moved: list[dict[str, float]] = []
    if system == "dataloader_w2":
        loader: Any = make_dataloader(data, scenario, batch)
        for _ in range(epochs):
            epochs_out.append(consume(loader, step_s))
    else:
        loader = make_loader(data, system, scenario, batch)
        with loader:
            for epoch in range(epochs):
                loader.set_epoch(epoch)
                epochs_out.append(consume(loader, step_s))
                b = loader.batching_stats()
                moved.append(
                    {
                        "moved": b.moved,
                        "mean_delay": b.mean_moved_delay,
                        "max_delay": b.max_delay,
                        "held_back_s": b.held_back_s,
                        "rows_copied": b.rows_copied,
                        "batches_copied": b.batches_copied,
                    }
                )
    # The first batch's wait is start-up (threads, first decodes), the same for all systems.
    epoch_s = sum(e["epoch_s"] for e in epochs_out)
    stall_s = sum(e["stall_s"] for e in epochs_out)
    later = epochs_out[1:]
    return {
        "epoch_s": epoch_s / epochs,
        "stall_fraction": stall_s / epoch_s,
        # Diagnostics beside the headline figure (which is over every epoch): the first
        # epoch starts with an empty queue in every system (see the README).
        "stall_fraction_by_epoch": [e["stall_s"] / e["epoch_s"] for e in epochs_out],
        "stall_fraction_later_epochs": (
            sum(e["stall_s"] for e in later) / sum(e["epoch_s"] for e in later) if later else None
        ),
        "startup_s": sum(e["startup_s"] for e in epochs_out) / epochs,
        "batches_per_epoch": epochs_out[0]["batches"],
        "moved": sum(m["moved"] for m in moved) if moved else None,
        "mean_delay_batches": (
            sum(m["mean_delay"] * m["moved"] for m in moved)
            / max(1, sum(m["moved"] for m in moved))
            if moved
            else None
        ),
        "max_delay_batches": max(m["max_delay"] for m in moved) if moved else None,
        # What moving samples cost the CPU loader: rows copied into batches, and batches
        # copied whole because no nominal batch's tensor could hold them.
        "rows_copied": sum(m["rows_copied"] for m in moved) if moved else None,
        "batches_copied": sum(m["batches_copied"] for m in moved) if moved else None,
    }


def median_result(results: list[dict[str, Any]]) -> dict[str, Any]:
    """One system's rounds as one row: each number's median over the rounds that gave it
    (lists, such as the stall per epoch, element by element); the first error, if any
    round failed."""
    if not results:
        return {}
    errors = [r["error"] for r in results if "error" in r]
    if errors:
        return {"error": errors[0], "peak_pss_mb": results[0].get("peak_pss_mb")}
    row: dict[str, Any] = {}
    for key, first in results[0].items():
        values = [r.get(key) for r in results]
        if isinstance(first, list):
            row[key] = [statistics.median(column) for column in zip(*values, strict=True)]
        elif isinstance(first, int | float) and all(isinstance(v, int | float) for v in values):
            row[key] = statistics.median(values)
        else:
            row[key] = first
    return row


def stall_from_heavy_images(rows: list[dict[str, Any]]) -> dict[str, float]:
    """Per system, the ``decode`` stall fraction minus the ``control``'s (the same system on
    the same kind of folder without heavy images): the stall the heavy images cause.
    Only ``decode`` has this counterpart (``reads`` uses a much longer step). Empty unless
    both ran."""
    stall = {
        (r["scenario"], r["system"]): r["stall_fraction"] for r in rows if "stall_fraction" in r
    }
    return {
        system: stall["decode", system] - stall["control", system]
        for scenario, system in stall
        if scenario == "decode" and ("control", system) in stall
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, help="image folder (default: generated, 10%% heavy)")
    parser.add_argument(
        "--control-data",
        type=Path,
        help="the control scenario's folder, without heavy images (default: generated; "
        "with --data and no --control-data the control is skipped)",
    )
    parser.add_argument("--num-images", type=int, default=1200)
    parser.add_argument("--epochs", type=int, default=2)
    add_out_argument(parser)
    parser.add_argument("--quick", action="store_true", help="200 images, 1 epoch")
    parser.add_argument(
        "--batch-size",
        type=int,
        default=BATCH,
        help=f"batch size (default: {BATCH}); see the README on why it matters here",
    )
    parser.add_argument(
        "--scenarios", nargs="+", choices=SCENARIOS, default=list(SCENARIOS), help="which to run"
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="run every system this many times per scenario, in alternating order, and "
        "report each figure's median (the shared machine's speed drifts within a run)",
    )
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--step-s", type=float, help=argparse.SUPPRESS)
    parser.add_argument("--scenario", choices=SCENARIOS, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        result = worker(
            args.worker, args.data, args.step_s, args.epochs, args.scenario, args.batch_size
        )
        print(json.dumps(result))
        return 0

    from gpu_loader.cli import cache_dir
    from gpu_loader.datasets import make_image_folder

    num = 200 if args.quick else args.num_images
    epochs = 1 if args.quick else args.epochs

    def generated(name: str, heavy_fraction: float) -> Path:
        return make_image_folder(
            cache_dir() / name,
            num_images=num,
            num_classes=10,
            seed=1,
            min_side=200,
            max_side=480,
            heavy_fraction=heavy_fraction,
            heavy_scale=(3, 4),
            progress=True,
        )

    scenarios = list(args.scenarios)
    folders: dict[str, Path] = {}
    for scenario in scenarios:
        if scenario != "control":
            folders[scenario] = args.data or generated(f"straggler-photos-{num}", 0.1)
        elif args.control_data or not args.data:
            folders[scenario] = args.control_data or generated(f"straggler-light-{num}", 0.0)
        else:
            print("[skip] control: --data given without --control-data", file=sys.stderr)
    scenarios = [sc for sc in scenarios if sc in folders]
    rows: list[dict[str, Any]] = []
    runs: dict[str, Any] = {}
    for scenario in scenarios:
        data = folders[scenario]
        print(f"[calibrate] {scenario}: loader alone ...", file=sys.stderr, flush=True)
        cal = calibrate(data, 1, scenario, args.batch_size)
        # A diagnostic beside it (the step is sized from ordered mode alone, the same for
        # every system): straggler mode's own throughput with no consumer wait. Its
        # per-sample engine calls cost more CPU than ordered mode's runs (see the README).
        alone = calibrate(data, 1, scenario, args.batch_size, "straggler")["img_per_s"]
        need = cal["img_per_s"] / HEADROOM  # the consumer needs 10% less than the loader gives
        step_s = args.batch_size / need
        batches = -(-num // args.batch_size)
        ideal = max(cal["compute_s_per_epoch"] / cal["threads"], (batches - 1) * step_s)
        runs[scenario] = {
            "data": str(data),
            "calibration": cal,
            "straggler_alone_img_per_s": alone,
            "step_s": step_s,
            "ideal_epoch_s": ideal,
        }
        results: dict[str, list[dict[str, Any]]] = {system: [] for system in SYSTEMS}
        for r in range(args.rounds):
            for system in SYSTEMS if r % 2 == 0 else SYSTEMS[::-1]:
                round_note = f" (round {r + 1}/{args.rounds})" if args.rounds > 1 else ""
                print(f"[run] {scenario}: {system}{round_note} ...", file=sys.stderr, flush=True)
                result, pss = run_worker(
                    [
                        "-m",
                        "gpu_loader.benchmarks.stragglers",
                        "--worker",
                        system,
                        "--data",
                        str(data),
                        "--step-s",
                        str(step_s),
                        "--epochs",
                        str(epochs),
                        "--scenario",
                        scenario,
                        "--batch-size",
                        str(args.batch_size),
                    ]
                )
                results[system].append({"peak_pss_mb": pss, **result})
        for system in SYSTEMS:
            row = {"scenario": scenario, "system": system, **median_result(results[system])}
            if "epoch_s" in row:
                row["epoch_vs_ideal"] = row["epoch_s"] / ideal
            if args.rounds > 1:
                row["rounds"] = results[system]
            rows.append(row)
    checks = {}
    for scenario in scenarios:
        if scenario == "control":
            continue  # no stragglers: nothing for the targets to compare
        by = {r["system"]: r for r in rows if r["scenario"] == scenario}
        if all("stall_fraction" in by[m] for m in ("ordered", "straggler")):
            ordered, straggler = by["ordered"]["stall_fraction"], by["straggler"]["stall_fraction"]
            checks[f"{scenario}: straggler stall <= ordered / 3"] = straggler <= ordered / 3
            checks[f"{scenario}: straggler epoch <= 1.10 x ideal"] = (
                by["straggler"]["epoch_vs_ideal"] <= 1.10
            )
    heavy_stall = stall_from_heavy_images(rows)
    columns = [
        ("scenario", "scenario"),
        ("system", "system"),
        ("stall_pct", "stall"),
        ("stall_later_pct", "stall after epoch 1"),
        ("startup_s", "start-up s"),
        ("epoch_s", "epoch s"),
        ("epoch_vs_ideal", "epoch / ideal"),
        ("moved", "moved samples"),
        ("mean_delay_batches", "mean delay (batches)"),
        ("max_delay_batches", "max delay"),
        ("batches_copied", "whole-batch copies"),
        ("peak_pss_mb", "peak PSS MB"),
        ("error", "error"),
    ]
    for row in rows:  # the table shows stalls as percentages; the JSON keeps fractions
        for key, pct in (
            ("stall_fraction", "stall_pct"),
            ("stall_fraction_later_epochs", "stall_later_pct"),
        ):
            if row.get(key) is not None:
                row[pct] = f"{row[key]:.1%}"
    table = format_table(rows, columns)
    path = write_results(
        "stragglers",
        {
            "dataset": {
                "images": num,
                "heavy_fraction": 0.1,
                "folders": {k: str(v) for k, v in folders.items()},
            },
            "batch_size": args.batch_size,
            "epochs": epochs,
            "rounds": args.rounds,
            "slow_read_s": SLOW_READ_S,
            "scenarios": runs,
            "rows": rows,
            "checks": checks,
            "stall_from_heavy_images": heavy_stall,
            "table": table,
        },
        args.out,
    )
    for scenario, run in runs.items():
        print(
            f"{scenario}: loader {run['calibration']['img_per_s']:.0f} img/s alone (straggler "
            f"mode {run['straggler_alone_img_per_s']:.0f}); step "
            f"{run['step_s'] * 1000:.1f} ms per batch; ideal epoch {run['ideal_epoch_s']:.2f} s"
        )
    print(table)
    print(f"checks: {checks}")
    if heavy_stall:
        print(f"decode stall from heavy images (decode minus control): {heavy_stall}")
    print(f"\nwritten: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
