"""Benchmark summaries: cpu_loaders.py (medians over rounds, ratios within a round) and
stragglers.py (the stall heavy images cause)."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest
from gpu_loader.benchmarks.cpu_loaders import baseline, summarize, systems

RESULTS = Path(__file__).resolve().parent.parent / "benchmarks" / "results"


def run(round_no: int, system: str, img_s: float, cpu: float) -> dict[str, object]:
    return {
        "round": round_no,
        "transform": "train",
        "system": system,
        "img_per_s": img_s,
        "cpu_s_per_1000": cpu,
        "peak_pss_mb": 100.0 + round_no,
    }


def test_ratios_are_taken_within_a_round_then_the_median() -> None:
    # The machine halves its speed in round 1: raw medians move, same-round ratios do not.
    runs = [
        run(0, "gpu_loader", 1000.0, 1.0),
        run(0, "dataloader_pillow_w2", 400.0, 3.0),
        run(0, "dali_cpu", 800.0, 1.5),
        run(1, "gpu_loader", 500.0, 1.0),
        run(1, "dataloader_pillow_w2", 200.0, 3.0),
        run(1, "dali_cpu", 400.0, 1.5),
        run(2, "gpu_loader", 900.0, 1.2),
        run(2, "dataloader_pillow_w2", 300.0, 2.4),
        # gpu_loader with one setting changed: not a peer, even when it is the fastest.
        run(0, "gpu_loader_per_sample", 2000.0, 1.0),
        {"round": 2, "transform": "train", "system": "dali_cpu", "error": "exit 1"},
    ]
    rows = {r["system"]: r for r in summarize(runs, "dataloader_pillow_w2")}
    ours = rows["gpu_loader"]
    assert ours["img_per_s"] == 900.0  # median of 1000, 500, 900
    assert ours["speedup_vs_baseline"] == pytest.approx(2.5)  # median of 2.5, 2.5, 3.0
    assert ours["cpu_vs_baseline"] == pytest.approx(1.0 / 3.0)  # median of 1/3, 1/3, 1/2
    assert ours["cores"] == pytest.approx(1.0)  # median of 1.0, 0.5, 1.08
    assert ours["peak_pss_mb"] == 102.0
    assert rows["dali_cpu"]["rounds"] == 2  # the failed round is left out
    assert ours["best_other"] == "dali_cpu"
    assert ours["vs_best_other"] == pytest.approx(900.0 / 600.0)


def test_a_system_that_never_ran_keeps_its_error() -> None:
    runs = [{"round": 0, "transform": "eval", "system": "spdl_io", "error": "exit 1: boom"}]
    (row,) = summarize(runs, "dataloader_pillow_w2")
    assert row["error"] == "exit 1: boom"
    assert "img_per_s" not in row


def test_peers_scale_with_the_machine() -> None:
    # On 16 CPUs, DataLoader and SPDL at 2 workers would flatter gpu_loader's 16 threads.
    names = systems(16)
    assert baseline(16) == "dataloader_pillow_w16" and baseline(16) in names
    assert {"dataloader_pillow_w32", "dataloader_fast_w16"} <= set(names)
    assert "16 threads" in names["spdl_fast"] and "16 threads" in names["dali_cpu"]
    assert list(systems(2)) == [
        "gpu_loader",
        "gpu_loader_per_sample",
        "dataloader_pillow_w2",
        "dataloader_pillow_w4",
        "dataloader_fast_w2",
        "spdl_io",
        "spdl_fast",
        "spdl_simplejpeg",
        "dali_cpu",
    ]


def test_heavy_stall_is_decode_minus_its_control_per_system() -> None:
    from gpu_loader.benchmarks.stragglers import stall_from_heavy_images

    def row(scenario: str, system: str, stall: float | None) -> dict[str, object]:
        if stall is None:  # a worker that failed has an error, no stall
            return {"scenario": scenario, "system": system, "error": "boom"}
        return {"scenario": scenario, "system": system, "stall_fraction": stall}

    rows = [
        row("decode", "ordered", 0.05),
        row("decode", "straggler", 0.02),
        row("decode", "dataloader_w2", 0.30),
        row("reads", "ordered", 0.06),  # no counterpart: left out
        row("control", "ordered", 0.04),
        row("control", "straggler", 0.03),
        row("control", "dataloader_w2", None),
    ]
    got = stall_from_heavy_images(rows)
    assert got == pytest.approx({"ordered": 0.01, "straggler": -0.01})
    assert stall_from_heavy_images([r for r in rows if r["scenario"] != "control"]) == {}


def test_straggler_rounds_report_each_figure_s_median() -> None:
    from gpu_loader.benchmarks.stragglers import median_result

    rounds = [
        {"stall_fraction": 0.30, "stall_fraction_by_epoch": [0.5, 0.1], "moved": 4, "x": "a"},
        {"stall_fraction": 0.02, "stall_fraction_by_epoch": [0.1, 0.3], "moved": None, "x": "b"},
        {"stall_fraction": 0.04, "stall_fraction_by_epoch": [0.2, 0.2], "moved": 8, "x": "c"},
    ]
    row = median_result(rounds)
    assert row["stall_fraction"] == 0.04  # one slow round does not set the figure
    assert row["stall_fraction_by_epoch"] == [0.2, 0.2]
    assert row["moved"] == 4 and row["x"] == "a"  # not a number in every round: the first
    assert median_result([*rounds, {"error": "exit 1: boom", "peak_pss_mb": 3.0}]) == {
        "error": "exit 1: boom",
        "peak_pss_mb": None,
    }


def test_bench_without_matplotlib_skips_the_chart_and_succeeds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # QA: on a plain install (matplotlib is in the [bench] extra) `gpu-loader bench`
    # wrote its JSON, then ended in a ModuleNotFoundError traceback, exit status 1.
    from gpu_loader.benchmarks import suite

    shutil.copy(RESULTS / "cpu_loaders.json", tmp_path / "cpu_loaders.json")
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import raises ImportError
    monkeypatch.setattr(suite, "applies", lambda name: "not here")  # run nothing
    assert suite.run_suite(tmp_path, only="cpu_loaders") == 0
    assert "chart: skipped, matplotlib is not installed" in capsys.readouterr().out
    assert not (tmp_path / "cpu_loaders.png").exists()


def test_results_stay_beside_the_code_only_in_a_checkout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # QA: run from a wheel, the scripts wrote their JSON into site-packages.
    from gpu_loader.benchmarks import _common

    assert _common.default_results_dir() == RESULTS  # this checkout
    installed = tmp_path / "site-packages" / "gpu_loader" / "benchmarks" / "results"
    monkeypatch.setattr(_common, "RESULTS_DIR", installed)
    monkeypatch.chdir(tmp_path)
    assert _common.default_results_dir() == tmp_path / "benchmark-results"
    path = _common.write_results("x", {"rows": []})
    assert path == tmp_path / "benchmark-results" / "x.json" and path.is_file()


def test_cpu_loaders_runs_another_workload_for_every_system_into_its_own_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Tiny images to a tiny output (the case where gpu_loader led least): every system
    # gets the same output size and batch size, and the main table's file is left alone.
    from gpu_loader.benchmarks import cpu_loaders

    monkeypatch.setenv("GPU_LOADER_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(cpu_loaders, "SIZE", cpu_loaders.SIZE)  # main() sets them
    monkeypatch.setattr(cpu_loaders, "BATCH", cpu_loaders.BATCH)
    monkeypatch.setattr(cpu_loaders, "RESIZE", cpu_loaders.RESIZE)
    args = ["--quick", "--sides", "24,40", "--size", "16", "--batch-size", "8"]
    assert cpu_loaders.main([*args, "--out", str(tmp_path / "tiny.json")]) == 0
    import json

    data = json.loads((tmp_path / "tiny.json").read_text())
    assert data["output_size"] == 16 and data["batch_size"] == 8
    assert data["dataset"]["sides"] == [24, 40] and data["dataset"]["images"] == 11 * 8
    shapes = {r["system"]: r["batch_shape"] for r in data["runs"]}
    assert set(shapes) == set(cpu_loaders.quick_systems(data["peer_workers"]))
    assert all(shape == [8, 3, 16, 16] for shape in shapes.values())
    cached = list((tmp_path / "cache").iterdir())
    assert [p.name for p in cached] == ["bench-photos-88-24-40px"]


@pytest.mark.parametrize("text", ["32", "a,b", "64,32", "4,8"])
def test_cpu_loaders_sides_must_be_a_range(text: str) -> None:
    import argparse

    from gpu_loader.benchmarks.cpu_loaders import _sides

    assert _sides("32,64") == (32, 64)
    with pytest.raises(argparse.ArgumentTypeError, match="MIN"):
        _sides(text)
