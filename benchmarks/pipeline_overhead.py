"""Engine overhead: gpu_loader.pipeline vs SPDL 0.8 vs a bare queue.Queue + threads chain.

Shapes (all in one run, same machine, same process):
  (a) 3 no-op stages at concurrency 1 and 4: items/s;
  (b) one stage that waits 1 ms with the GIL released (time.sleep) at concurrency
      1, 8 and 32: efficiency = measured items/s / (concurrency / 1 ms).
Each cell is the median of ``--repeats`` runs; engines take turns within each repeat. Writes JSON with machine metadata.

    .venv/bin/python benchmarks/pipeline_overhead.py            # full run (~2 min on 2 cores)
    .venv/bin/python benchmarks/pipeline_overhead.py --quick    # smoke run
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import queue
import statistics
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make `gpu_loader.benchmarks` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gpu_loader.benchmarks._common import (
    BENCH_EXTRA_HINT,
    add_out_argument,
    default_results_dir,
    machine_metadata,
)

from gpu_loader.pipeline import PipelineBuilder

WAIT_S = 0.001


def noop(x: Any) -> Any:
    return x


def wait_1ms(x: Any) -> Any:
    time.sleep(WAIT_S)
    return x


# One runner per engine: (op, stages, concurrency, n_items, order) -> seconds for n items.


def run_ours(
    op: Callable[[Any], Any], stages: int, conc: int, n: int, order: str, stats_on: bool = True
) -> float:
    builder = PipelineBuilder().add_source(range(n))
    for i in range(stages):
        builder.pipe(op, concurrency=conc, name=f"s{i}", output_order=order)  # type: ignore[arg-type]
    pipeline = builder.add_sink(2).build()
    if not stats_on:
        _disable_stats(pipeline)
    t0 = time.perf_counter()
    with pipeline:
        count = sum(1 for _ in pipeline)
    elapsed = time.perf_counter() - t0
    if count != n:
        raise RuntimeError(f"ours delivered {count} of {n}")
    return elapsed


def _disable_stats(pipeline: Any) -> None:
    """Swap every stage's per-task counter update for a no-op (to price the stats)."""
    from gpu_loader.pipeline import _stats

    class NoCounting(_stats.WorkerCounters):
        def add_task(self, *args: Any) -> None:
            return None

    def new_worker(self: Any) -> Any:
        return NoCounting()

    for stage in pipeline._core.stages:
        stage.counters.new_worker = new_worker.__get__(stage.counters)


def run_bare(op: Callable[[Any], Any], stages: int, conc: int, n: int, order: str) -> float:
    """The floor: queue.Queue hand-off between plain threads, no stats, no reordering."""
    done = object()
    queues = [queue.Queue[Any](max(2, 2 * conc)) for _ in range(stages)] + [queue.Queue[Any](2)]

    def source() -> None:
        q = queues[0]
        for i in range(n):
            q.put(i)
        q.put(done)

    def worker(i: int, remaining: list[int], lock: threading.Lock) -> None:
        get, put = queues[i].get, queues[i + 1].put
        while True:
            item = get()
            if item is done:
                queues[i].put(done)
                with lock:
                    remaining[0] -= 1
                    last = remaining[0] == 0
                if last:
                    put(done)
                return
            put(op(item))

    threads = [threading.Thread(target=source)]
    for i in range(stages):
        remaining, lock = [conc], threading.Lock()
        threads += [threading.Thread(target=worker, args=(i, remaining, lock)) for _ in range(conc)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    count, get = 0, queues[-1].get
    while get() is not done:
        count += 1
    elapsed = time.perf_counter() - t0
    for t in threads:
        t.join()
    if count != n:
        raise RuntimeError(f"bare delivered {count} of {n}")
    return elapsed


def run_spdl(op: Callable[[Any], Any], stages: int, conc: int, n: int, order: str) -> float:
    from spdl.pipeline import PipelineBuilder as SpdlBuilder

    builder = SpdlBuilder().add_source(range(n))
    for i in range(stages):
        builder = builder.pipe(op, concurrency=conc, name=f"s{i}", output_order=order)
    pipeline = builder.add_sink(2).build(num_threads=conc * stages)
    t0 = time.perf_counter()
    with pipeline.auto_stop():
        count = sum(1 for _ in pipeline)
    elapsed = time.perf_counter() - t0
    if count != n:
        raise RuntimeError(f"spdl delivered {count} of {n}")
    return elapsed


def measure_round_robin(
    engines: list[tuple[str, Callable[..., float], int]], repeats: int, *args: Any
) -> dict[str, float]:
    """Median items/s per engine; engines take turns each repeat so load drift hits all alike.

    ``args`` are (op, stages, concurrency, order); the item count comes from ``engines``,
    or from ``n_override`` when given as a fifth arg.
    """
    op, stages, conc, order, *rest = args
    rates: dict[str, list[float]] = {name: [] for name, _, _ in engines}
    for _ in range(repeats):
        for name, runner, n in engines:
            n = rest[0] if rest else n
            rates[name].append(n / runner(op, stages, conc, n, order))
    return {name: statistics.median(r) for name, r in rates.items()}


def markdown_table(rows: list[dict[str, Any]]) -> str:
    """The README table: one row per shape, one column per engine."""
    engines = list(dict.fromkeys(r["engine"] for r in rows))
    cells: dict[tuple[str, ...], dict[str, str]] = {}
    for r in rows:
        if r["shape"].startswith("a"):
            key = ("(a) 3 no-op stages, items/s", str(r["concurrency"]), r["output_order"])
            cell = f"{r['items_per_s']:,.0f}"
        else:
            key = ("(b) 1 ms wait, efficiency", str(r["concurrency"]), r["output_order"])
            cell = f"{r['efficiency']:.0%} ({r['items_per_s']:,.0f}/s)"
        cells.setdefault(key, {})[r["engine"]] = cell
    lines = [
        "| shape | conc | order | " + " | ".join(engines) + " |",
        "|---|---|---|" + "---|" * len(engines),
    ]
    for key, by_engine in cells.items():
        lines.append(
            "| "
            + " | ".join(key)
            + " | "
            + " | ".join(by_engine.get(e, "") for e in engines)
            + " |"
        )
    return "\n".join(lines)


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="few items, one repeat")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--no-spdl", action="store_true", help="skip SPDL (not installed)")
    add_out_argument(parser, default_results_dir() / "pipeline_overhead.json")
    args = parser.parse_args()
    repeats = 1 if args.quick else args.repeats
    scale = 0.1 if args.quick else 1.0
    n_noop, n_spdl = int(20_000 * scale), int(3_000 * scale)
    rows: list[dict[str, Any]] = []

    engines: list[tuple[str, Callable[..., float], int]] = [
        ("bare queue.Queue chain", run_bare, n_noop),
        ("gpu_loader (stats on)", run_ours, n_noop),
        ("gpu_loader (stats off)", lambda *a: run_ours(*a, stats_on=False), n_noop),
    ]
    if not args.no_spdl:
        if not _installed("spdl"):
            print(
                f"[skip] SPDL 0.8: spdl is not installed ({BENCH_EXTRA_HINT})",
                file=sys.stderr,
            )
        else:
            engines.append(("SPDL 0.8", run_spdl, n_spdl))

    for conc in (1, 4):
        for order in ("completion", "input"):
            rates = measure_round_robin(engines, repeats, noop, 3, conc, order)
            for engine, _, n in engines:
                rate = rates[engine]
                rows.append(
                    {
                        "shape": "a: 3 no-op stages",
                        "engine": engine,
                        "concurrency": conc,
                        "output_order": order,
                        "items": n,
                        "items_per_s": round(rate, 1),
                    }
                )
                print(
                    f"(a) conc={conc:<2} {order:<10} {engine:<24} {rate:>10,.0f} items/s",
                    flush=True,
                )
    for conc in (1, 8, 32):
        ideal = conc / WAIT_S
        n_wait = max(int(ideal * 0.6 * scale), 200)
        rates = measure_round_robin(engines, repeats, wait_1ms, 1, conc, "completion", n_wait)
        for engine, _, _ in engines:
            rate = rates[engine]
            rows.append(
                {
                    "shape": "b: 1 stage, 1 ms GIL-free wait",
                    "engine": engine,
                    "concurrency": conc,
                    "output_order": "completion",
                    "items": n_wait,
                    "items_per_s": round(rate, 1),
                    "efficiency": round(rate / ideal, 3),
                }
            )
            print(
                f"(b) conc={conc:<2} {engine:<24} {rate:>10,.0f} items/s  eff {rate / ideal:.0%}",
                flush=True,
            )

    report = {
        "benchmark": "pipeline_overhead",
        "repeats": repeats,
        "quick": args.quick,
        "machine": machine_metadata(),
        "rows": rows,
    }
    print(markdown_table(rows))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
