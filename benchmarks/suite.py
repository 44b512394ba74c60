"""`gpu-loader bench`: run the benchmarks that apply here, chart them, print their tables."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

# name -> does it apply on this machine? (None = yes, else the reason it does not)
BENCHMARKS = ("cpu_loaders", "pipeline_overhead", "stragglers", "gpu_vs_cpu", "gpu_profile")


def applies(name: str) -> str | None:
    """None when benchmark `name` can run here, else why not."""
    if name.startswith("gpu_"):
        from gpu_loader.cuda import cuda_available

        if not cuda_available():
            return "no usable CUDA device"
    return None


def run_suite(out: Path, *, only: str | None = None, quick: bool = False) -> int:
    """Run each benchmark in its own process; returns 0 when every one ran, else 1."""
    names = [n.strip() for n in only.split(",") if n.strip()] if only is not None else []
    if only is not None and not names:  # `--only ""` ran everything
        raise ValueError(f"--only names no benchmark; choose from {list(BENCHMARKS)}")
    names = names or list(BENCHMARKS)
    unknown = sorted(set(names) - set(BENCHMARKS))
    if unknown:
        raise ValueError(f"unknown benchmark(s) {unknown}; choose from {list(BENCHMARKS)}")
    out.mkdir(parents=True, exist_ok=True)
    failed = 0
    for name in names:
        why = applies(name)
        if why is not None:
            print(f"[skip] {name}: {why}")
            continue
        path = out / f"{name}.json"
        cmd = [sys.executable, "-m", f"gpu_loader.benchmarks.{name}", "--out", str(path)]
        if quick:
            cmd.append("--quick")
        print(f"[run] {name}: {' '.join(cmd[1:])}", flush=True)
        if subprocess.run(cmd, check=False).returncode != 0 or not path.is_file():
            print(f"[fail] {name}: see its output above")
            failed += 1
    cpu = out / "cpu_loaders.json"
    if cpu.is_file():
        try:
            import matplotlib  # noqa: F401  (the [bench] extra; a plain install lacks it)
        except ImportError:
            print("chart: skipped, matplotlib is not installed (pip install matplotlib)")
        else:
            png = chart_cpu_loaders(json.loads(cpu.read_text()), out / "cpu_loaders.png")
            print(f"chart: {png}")
    return 1 if failed else 0


def chart_cpu_loaders(result: dict[str, Any], path: Path) -> Path:
    """Bar charts of img/s and CPU-seconds per 1000 images per system, one group per transform."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in result["rows"] if r.get("img_per_s")]
    kinds = sorted({r["transform"] for r in rows})
    systems = list(dict.fromkeys(r["system"] for r in rows))
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    width = 0.8 / max(1, len(kinds))
    for k, kind in enumerate(kinds):
        by = {r["system"]: r for r in rows if r["transform"] == kind}
        xs = [i + k * width for i in range(len(systems))]
        for ax, key in zip(axes, ("img_per_s", "cpu_s_per_1000"), strict=True):
            ax.bar(xs, [by.get(s, {}).get(key, 0) for s in systems], width, label=kind)
    titles = (
        "throughput (img/s, higher is better)",
        "CPU-seconds per 1000 images (lower is better)",
    )
    for ax, title in zip(axes, titles, strict=True):
        ax.set_title(title)
        ax.set_xticks([i + width * (len(kinds) - 1) / 2 for i in range(len(systems))])
        ax.set_xticklabels(systems, rotation=30, ha="right", fontsize=8)
        ax.legend()
    machine = result.get("machine", {})
    fig.suptitle(f"CPU loaders, batch {result.get('batch_size')}, {machine.get('cpu_count')} CPUs")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


if __name__ == "__main__":  # the body of `gpu-loader bench`, which takes the same flags
    from gpu_loader.cli import main

    sys.exit(main(["bench", *sys.argv[1:]]))
