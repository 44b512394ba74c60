"""`gpu_loader.inspect`'s sampling and timing, in process: which images it times and how
long, so that one noisy run of a few milliseconds does not pick the thread counts."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from gpu_loader import inspect as insp
from gpu_loader.datasets import make_image_folder
from gpu_loader.sources import ImageFolder


def test_spread_covers_the_whole_index() -> None:
    # A folder's first images are its first classes only (QA: inspect read those).
    assert insp.spread(100, 4) == [0, 25, 50, 75]
    assert insp.spread(10, 3) == [0, 3, 6]
    assert insp.spread(5, 8) == [0, 1, 2, 3, 4]  # all of a small index, once each
    picked = insp.spread(1000, 256)
    assert len(set(picked)) == 256 and picked[-1] >= 990


def test_a_stage_is_timed_for_at_least_the_minimum() -> None:
    calls: list[int] = []

    def work(i: int) -> int:
        calls.append(i)
        time.sleep(0.01)  # a pass of 8 on 2 threads: 40 ms or more
        return i

    began = time.perf_counter()
    profile = insp.time_stage("read", work, list(range(8)), threads=2, min_s=0.1)
    took = time.perf_counter() - began
    assert took >= 0.1
    assert len(calls) % 8 == 0 and len(calls) > 8  # whole passes, more than one
    assert profile.items_per_s <= len(calls) / 0.1  # over the whole run, not one pass
    assert profile.failures == 0


def test_passes_are_capped_and_failures_are_those_of_one_pass() -> None:
    def work(i: int) -> int:
        if i == 3:
            raise ValueError("bad sample")
        return i

    calls = 0

    def counted(i: int) -> int:
        nonlocal calls
        calls += 1
        return work(i)

    profile = insp.time_stage("decode", counted, list(range(5)), threads=1, min_s=60.0)
    assert calls == 5 * insp.MAX_PASSES  # not a minute of passes over a tiny sample
    assert profile.failures == 1


def test_each_count_keeps_its_faster_run(monkeypatch: pytest.MonkeyPatch) -> None:
    runs: list[int] = []
    rates = iter([10.0, 50.0, 40.0, 20.0])  # counts 1, 2 rising, then 2, 1 falling

    def fake(name: str, fn: object, items: object, threads: int) -> insp.StageProfile:
        runs.append(threads)
        return insp.StageProfile(name, threads, next(rates), 0)

    monkeypatch.setattr(insp, "time_stage", fake)
    profiles = insp.profile_stage("read", lambda i: i, [0], [1, 2])
    assert runs == [1, 2, 2, 1]
    assert [(p.threads, p.items_per_s) for p in profiles] == [(1, 20.0), (2, 50.0)]


def test_the_loader_check_runs_on_the_spread_samples(tmp_path: Path) -> None:
    root = make_image_folder(
        tmp_path, num_images=12, num_classes=4, seed=0, min_side=32, max_side=64
    )
    index = ImageFolder(root)
    positions = insp.spread(len(index), 4)
    subset = insp._Subset(index, positions)
    assert [subset.key(i) for i in range(4)] == [index.key(p) for p in positions]
    assert subset.labels.tolist() == [index.labels[p] for p in positions]
    assert len(set(subset.labels.tolist())) > 1  # not only the first class
    assert subset.fingerprint() != insp._Subset(index, [0, 1, 2, 3]).fingerprint()
    assert insp.loader_rate(index, positions, 32, 1, 1, min_s=0.05) > 0


def test_the_recommendation_is_the_fewest_threads_near_the_best() -> None:
    def p(threads: int, rate: float) -> insp.StageProfile:
        return insp.StageProfile("decode", threads, rate, 0)

    assert insp.recommend([p(1, 100), p(2, 99), p(4, 100)]) == 1  # within 5% of the best
    assert insp.recommend([p(1, 50), p(2, 96), p(4, 100)]) == 2
    assert insp.thread_counts(2) == [1, 2, 4] and insp.thread_counts(4) == [1, 2, 4, 8]


def test_failed_items_do_not_count_as_throughput() -> None:
    def half_fail(i: int) -> int:
        if i % 2:
            raise ValueError("bad")
        time.sleep(0.002)
        return i

    def all_pass(i: int) -> int:
        time.sleep(0.002)
        return i

    items = list(range(20))
    failing = insp.time_stage("decode", half_fail, items, threads=1, min_s=0.05)
    assert failing.failures == 10
    # Ten sleeps a pass, counted as ten items: the same pace per good item as all_pass.
    good = insp.time_stage("decode", all_pass, items[:10], threads=1, min_s=0.05)
    assert failing.items_per_s < 1.5 * good.items_per_s


def test_the_report_names_the_slower_stage_as_the_bottleneck(tmp_path: Path) -> None:
    from gpu_loader.sources import FileList

    index = FileList([(str(tmp_path / "a.jpg"), 0)])
    read = [insp.StageProfile("read", 1, 1000.0, 0)]
    decode = [insp.StageProfile("decode", 1, 100.0, 0)]
    assert "bottleneck: decode (best read 1000" in insp.format_report(
        index, 1, 2, read, decode, 90.0
    )
    read = [insp.StageProfile("read", 1, 50.0, 0)]
    assert "bottleneck: read" in insp.format_report(index, 1, 2, read, decode, 40.0)


def test_the_bad_file_share_says_what_the_default_limit_would_do(tmp_path: Path) -> None:
    from gpu_loader.sources import FileList

    index = FileList([(str(tmp_path / f"{i}.jpg"), 0) for i in range(6)])
    few = insp.format_bad_files(index, {5: "decode: DecodeError: x"}, 3000)
    assert "(1 of 3000 sampled, <0.1%; the loader skips and reports them" in few  # not 0.0%
    assert f"{tmp_path / '5.jpg'}: decode: DecodeError: x" in few
    many = insp.format_bad_files(index, {1: "e", 2: "e"}, 8)
    assert "(2 of 8 sampled, 25.0%; more than the loader's default max_failures" in many
    assert insp.format_bad_files(index, {}, 8) == ""
    edge = insp.format_bad_files(index, dict.fromkeys(range(6), "e"), 594)
    assert "(6 of 594 sampled, 1.01%; more than" in edge  # not "1.0%; more than ... 1%"
    # Exactly 1% is within the limit: the loader stops only past max_failures * calls.
    at_limit = insp.format_bad_files(index, dict.fromkeys(range(6), "e"), 600)
    assert "(6 of 600 sampled, 1.00%; the loader skips" in at_limit


def test_verify_lists_bad_files_in_source_order_whatever_failed_first(tmp_path: Path) -> None:
    # A decode failure at the front is recorded after the quick read failures behind it.
    import io

    import numpy as np
    from PIL import Image

    from gpu_loader.sources import FileList

    buf = io.BytesIO()
    noise = np.random.default_rng(0).integers(0, 256, (1500, 1500, 3), dtype=np.uint8)
    Image.fromarray(noise).save(buf, "JPEG", quality=95)
    slow_bad = tmp_path / "cut.jpg"
    slow_bad.write_bytes(buf.getvalue()[: len(buf.getvalue()) * 3 // 4])
    missing = [str(tmp_path / f"gone{i}.jpg") for i in range(12)]
    good, bad = insp.verify(FileList([(str(slow_bad), 0)] + [(m, 0) for m in missing]), threads=2)
    assert good == []
    assert [b.index for b in bad] == list(range(13))
    assert [b.stage for b in bad] == ["decode"] + ["read"] * 12


def test_verify_reports_progress_through_a_stretch_of_bad_files() -> None:
    # report() was called only when a good file came: a long run of bad files (slow to
    # fail, say on a remote store) showed no progress at all, like a hang (QA58).
    from gpu_loader.sources import FileList

    class SlowToFail(FileList):
        def read(self, index: int) -> bytes:
            time.sleep(0.06)
            raise OSError(f"unreadable {index}")

    source = SlowToFail([(f"/nowhere/{i}.jpg", 0) for i in range(30)])
    reports: list[tuple[int, int]] = []
    good, bad = insp.verify(source, threads=1, report=lambda d, b: reports.append((d, b)))
    assert good == [] and len(bad) == 30
    assert reports and all(done == 0 and 0 < failed <= 30 for done, failed in reports)
