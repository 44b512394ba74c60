"""benchmarks/cpu_loaders.py's summary: medians over rounds, ratios within a round."""

from __future__ import annotations

import pytest
from gpu_loader.benchmarks.cpu_loaders import summarize


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
        {"round": 2, "transform": "train", "system": "dali_cpu", "error": "exit 1"},
    ]
    rows = {r["system"]: r for r in summarize(runs)}
    ours = rows["gpu_loader"]
    assert ours["img_per_s"] == 900.0  # median of 1000, 500, 900
    assert ours["speedup_vs_pillow_w2"] == pytest.approx(2.5)  # median of 2.5, 2.5, 3.0
    assert ours["cpu_vs_pillow_w2"] == pytest.approx(1.0 / 3.0)  # median of 1/3, 1/3, 1/2
    assert ours["cores"] == pytest.approx(1.0)  # median of 1.0, 0.5, 1.08
    assert ours["peak_pss_mb"] == 102.0
    assert rows["dali_cpu"]["rounds"] == 2  # the failed round is left out
    assert ours["best_other"] == "dali_cpu"
    assert ours["vs_best_other"] == pytest.approx(900.0 / 600.0)


def test_a_system_that_never_ran_keeps_its_error() -> None:
    runs = [{"round": 0, "transform": "eval", "system": "spdl_io", "error": "exit 1: boom"}]
    (row,) = summarize(runs)
    assert row["error"] == "exit 1: boom"
    assert "img_per_s" not in row
