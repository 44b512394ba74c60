"""ImageLoader on the CPU: exactly once, failures reported, deterministic, exact resume."""

from __future__ import annotations

import dataclasses
import gc
import json
import pickle
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import gpu_loader as gl
from gpu_loader.ops import EvalTransform, TrainTransform
from gpu_loader.pipeline import PipelineFailure
from gpu_loader.sources import FileList
from tests.loader.conftest import image_files

SIZE = 32


def make(source: Any, **kw: Any) -> gl.ImageLoader:
    kw.setdefault("batch_size", 8)
    kw.setdefault("transform", TrainTransform(SIZE))
    return gl.ImageLoader(source, **kw)


def run_epoch(loader: gl.ImageLoader) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(x.clone(), y.clone()) for x, y in loader]


def labels_of(batches: list[tuple[torch.Tensor, torch.Tensor]]) -> list[int]:
    return [int(v) for _, y in batches for v in y]


def test_batches_have_the_documented_shape_dtype_and_count(unique_list: FileList) -> None:
    loader = make(unique_list, batch_size=10)
    batches = run_epoch(loader)
    assert len(batches) == len(loader) == 5
    for x, y in batches:
        assert x.dtype == torch.float32 and x.shape[1:] == (3, SIZE, SIZE)
        assert y.dtype == torch.int64 and y.shape[0] == x.shape[0]
    assert [b[0].shape[0] for b in batches] == [10, 10, 10, 10, 8]
    assert sorted(labels_of(batches)) == list(range(len(unique_list)))


def test_a_batch_no_machine_here_could_hold_is_refused_and_one_the_data_cannot_fill_is_not(
    unique_list: FileList,
) -> None:
    # Refused as the loader is made, naming both knobs; before, every sample failed on
    # the batch tensor's allocation and was listed as a bad file.
    with pytest.raises(
        ValueError, match=r"one batch of 48 x 3 x 30000 x 30000 .* GiB.*`batch_size`"
    ):
        gl.ImageLoader(unique_list, batch_size=64, transform=EvalTransform(30000))
    # QA63: a batch size far over the data's was refused for memory no batch takes.
    loader = gl.ImageLoader(unique_list, batch_size=10**7, transform=EvalTransform(SIZE))
    assert [len(y) for _, y in loader] == [len(unique_list)]


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "uint8"])
def test_output_dtypes_agree(unique_list: FileList, dtype: str) -> None:
    ref = run_epoch(make(unique_list, transform=EvalTransform(SIZE), shuffle=False))
    got = run_epoch(make(unique_list, transform=EvalTransform(SIZE), shuffle=False, dtype=dtype))
    assert got[0][0].dtype == getattr(torch, dtype)
    for (xr, yr), (xg, yg) in zip(ref, got, strict=True):
        assert torch.equal(yr, yg)
        if dtype == "uint8":
            mean = torch.tensor(EvalTransform(SIZE).mean).view(1, 3, 1, 1)
            std = torch.tensor(EvalTransform(SIZE).std).view(1, 3, 1, 1)
            pixels = (xr * std + mean) * 255
            assert (xg.float() - pixels).abs().max() <= 1.0
        else:
            tol = 1e-6 if dtype == "float32" else (1e-2 if dtype == "float16" else 3e-2)
            assert torch.allclose(xg.float(), xr, atol=tol * 3, rtol=tol)


def test_a_pass_cut_short_moves_on_like_a_completed_one(unique_list: FileList) -> None:
    # The steps-per-epoch loop without set_epoch: each pass restarted the cut epoch, so
    # the same first batches came back every time (80 of 310 samples ever seen).
    loader = make(unique_list, seed=3)
    firsts = []
    for _ in range(3):
        for _, labels in loader:
            firsts.append(labels.tolist())
            break
    assert loader.epoch == 2 and firsts[0] != firsts[1] != firsts[2]
    loader.set_epoch(0)  # an explicit epoch is still run again
    assert next(iter(loader))[1].tolist() == firsts[0]


def test_the_samplers_set_epoch_selects_the_loaders_epoch(unique_list: FileList) -> None:
    # DistributedSampler's habit: loader.sampler.set_epoch(e). It ran epoch e + 1 after a
    # completed pass, and a restored mid-epoch state met another epoch's order.
    reference = make(unique_list, seed=5)
    expected = []
    for epoch in range(3):
        reference.set_epoch(epoch)
        expected.append(labels_of(run_epoch(reference)))
    loader = make(unique_list, seed=5)
    for epoch in range(3):
        loader.sampler.set_epoch(epoch)
        assert labels_of(run_epoch(loader)) == expected[epoch] and loader.epoch == epoch
    loader.sampler.set_epoch(1)
    it = iter(loader)
    done = [int(v) for v in next(it)[1]]
    state = json.loads(json.dumps(loader.state_dict()))
    loader.close()
    resumed = make(unique_list, seed=5)
    resumed.load_state_dict(state)
    resumed.sampler.set_epoch(1)  # the saved epoch: its progress is kept
    assert Counter(done + labels_of(run_epoch(resumed))) == Counter(range(len(unique_list)))


def test_another_ranks_mid_epoch_state_is_refused(unique_list: FileList) -> None:
    # Rank 0's checkpoint lists rank 0's delivered samples: loaded on rank 1 it dropped
    # some of rank 1's samples and repeated others. Between epochs a state may be shared.
    rank0 = make(unique_list, seed=4, rank=0, world_size=2)
    between = rank0.state_dict()
    next(iter(rank0))
    mid = json.loads(json.dumps(rank0.state_dict()))
    rank0.close()
    rank1 = make(unique_list, seed=4, rank=1, world_size=2)
    with pytest.raises(ValueError, match=r"records rank 0's progress .* this loader is rank 1"):
        rank1.load_state_dict(mid)
    rank1.load_state_dict(between)
    own = make(unique_list, seed=4, rank=1, world_size=2)
    assert labels_of(run_epoch(rank1)) == labels_of(run_epoch(own))
    fresh = make(unique_list, seed=4, rank=0, world_size=2)
    fresh.load_state_dict(mid)  # its own rank: taken
    assert len(labels_of(run_epoch(fresh))) == len(fresh.sampler) - 8  # one batch of 8 done


def test_a_state_saved_after_the_epoch_ended_may_be_shared_between_ranks(
    unique_list: FileList,
) -> None:
    rank0 = make(unique_list, seed=4, rank=0, world_size=2)
    run_epoch(rank0)
    ended = json.loads(json.dumps(rank0.state_dict()))
    assert ended["epoch_done"] and ended.get("batcher") is not None  # rank 0's own record
    rank1 = make(unique_list, seed=4, rank=1, world_size=2)
    rank1.load_state_dict(ended)  # taken: nothing of an ended epoch is left on any rank
    rank1.set_epoch(0)
    assert run_epoch(rank1) == []
    rank1.set_epoch(1)
    own = make(unique_list, seed=4, rank=1, world_size=2)
    own.set_epoch(1)
    assert labels_of(run_epoch(rank1)) == labels_of(run_epoch(own))
    # A pass of rank 1's own still alive when the shared state is loaded is forgotten:
    # the next state paired the ended epoch with that pass's progress (QA).
    peeked = make(unique_list, seed=4, rank=1, world_size=2)
    alive = iter(peeked)
    next(alive)
    peeked.load_state_dict(ended)
    peeked.set_epoch(0)
    assert run_epoch(peeked) == []
    saved = json.loads(json.dumps(peeked.state_dict()))
    assert saved["epoch_done"] and "batcher" not in saved
    make(unique_list, seed=4, rank=1, world_size=2).load_state_dict(saved)


@pytest.mark.parametrize("batching", ["ordered", "straggler"])
def test_each_batch_names_its_samples_row_for_row(
    bad_list: tuple[FileList, set[str]], batching: str
) -> None:
    # Labels 0..29 are the good files' own; the bad ones (1000+) never arrive. A batch's
    # indices point into the source row for row, shuffled, with failures left out and
    # (straggler mode) rows in the order of the tensor the batch was built on.
    source, bad_keys = bad_list
    loader = make(source, batching=batching, max_failures=None, shuffle=True)
    seen: list[int] = []
    for batch in loader:
        images, labels = batch  # still a pair
        assert batch.images is images and batch.labels is labels
        assert batch.indices.dtype == torch.int64 and len(batch.indices) == len(labels)
        assert labels.tolist() == [source.label(i) for i in batch.indices.tolist()]
        assert batch.keys() == [source.key(i) for i in batch.indices.tolist()]
        assert not set(batch.keys()) & bad_keys
        seen += batch.indices.tolist()
    assert sorted(source.label(i) for i in seen) == list(range(30))
    sent = pickle.loads(pickle.dumps(batch))  # a plain pair elsewhere
    assert type(sent) is tuple and torch.equal(sent[0], images) and torch.equal(sent[1], labels)
    assert "samples)" in repr(batch)
    # Helpers that rebuild a batch field by field (pin_memory, tree_map, Lightning) see a
    # named tuple; the rebuilt one no longer names its samples, and says so.
    from torch.utils._pytree import tree_map

    moved = tree_map(lambda t: t + 0, batch)
    assert type(moved) is type(batch) and torch.equal(moved.images, images)
    assert moved.indices is None
    with pytest.raises(ValueError, match="rebuilt"):
        moved.keys()
    # _replace keeps the rows' names while the rows stay (QA65: dropped them).
    halved = batch._replace(images=images * 0.5)
    assert torch.equal(halved.images, images * 0.5) and halved.labels is labels
    assert halved.keys() == batch.keys() and halved.indices is batch.indices
    assert batch._replace(images=images[:1]).indices is None  # other rows: no names
    with pytest.raises(ValueError, match="no field"):
        batch._replace(pixels=images)


# Ordered mode one sample per call and in runs of 4 (a run's failed samples are kept by
# the epoch, not the engine); straggler mode always one per call.
@pytest.mark.parametrize(
    ("batching", "per_task"), [("ordered", 1), ("ordered", 4), ("straggler", 1)]
)
def test_bad_files_are_reported_and_the_rest_delivered_once(
    bad_list: tuple[FileList, set[str]], batching: str, per_task: int
) -> None:
    source, bad_keys = bad_list
    options = gl.LoaderOptions(samples_per_task=per_task)
    loader = make(source, batching=batching, max_failures=None, options=options)
    for epoch in range(2):
        loader.set_epoch(epoch)
        labels = labels_of(run_epoch(loader))
        assert Counter(labels) == Counter(range(30)), "each good sample exactly once"
    failed = loader.failed_samples()
    assert {f.key for f in failed} == bad_keys
    assert Counter(f.epoch for f in failed) == {0: 5, 1: 5}
    by_key = {f.key: f for f in failed if f.epoch == 0}
    missing = next(k for k in bad_keys if k.endswith("missing.jpg"))
    assert by_key[missing].stage == "read" and "FileNotFoundError" in by_key[missing].error
    for key in bad_keys - {missing}:
        assert by_key[key].stage == "decode"
    assert {f.key: f for f in loader.failed_samples(epoch=0)} == by_key
    assert loader.failed_samples(np.int64(1)) == loader.failed_samples(1)
    assert loader.stats().failures == len(failed) == 10
    stage_failures = {s.name: s.failures for s in loader.stats().stages}
    assert stage_failures["read"] == 1 and stage_failures["decode"] == 4  # the last epoch's
    # A file failing every epoch keeps one error text (records are kept for every epoch).
    again = {f.key: f for f in loader.failed_samples(1)}
    assert all(again[k].error is by_key[k].error for k in bad_keys)
    assert pickle.loads(pickle.dumps(failed)) == failed  # as all_gather_object sends them


def test_failure_records_of_every_epoch_share_their_key_and_error_text(
    photo_dir: Path, tmp_path: Path
) -> None:
    # ImageFolder builds each key on each call: records kept for every epoch of a file
    # that always fails hold one key and one error text between them.
    for name in ("a", "b"):
        (tmp_path / "cls" / name).mkdir(parents=True)
        (tmp_path / "cls" / name / "bad.jpg").write_bytes(b"not an image")
        (tmp_path / "cls" / name / "good.jpg").write_bytes(image_files(photo_dir)[0].read_bytes())
    loader = make(gl.sources.ImageFolder(tmp_path / "cls"), max_failures=None)
    for epoch in range(3):
        loader.set_epoch(epoch)
        assert len(labels_of(run_epoch(loader))) == 2
    for key in {f.key for f in loader.failed_samples()}:
        same = [f for f in loader.failed_samples() if f.key == key]
        assert len(same) == 3 and len({id(f.key) for f in same}) == 1
        assert len({id(f.error) for f in same}) == 1
    with pytest.raises(TypeError, match="epoch"):
        loader.failed_samples("0")  # type: ignore[arg-type]


@pytest.mark.parametrize("per_task", [1, 4])
def test_on_error_raise_names_the_key(bad_list: tuple[FileList, set[str]], per_task: int) -> None:
    source, bad_keys = bad_list
    options = gl.LoaderOptions(samples_per_task=per_task)
    loader = make(source, on_error="raise", shuffle=False, options=options)
    with pytest.raises(PipelineFailure) as info:
        run_epoch(loader)
    text = "\n".join(
        [str(info.value)]
        + [str(e) + " " + " ".join(getattr(e, "__notes__", [])) for e in info.value.exceptions]
    )
    assert any(key in text for key in bad_keys)
    assert "stage: read, sample: " in text or "stage: decode, sample: " in text
    # The loader's own words: the engine's would advise raising max_failures, which this
    # mode ignores.
    message = str(info.value)
    assert "on_error='raise'" in message and "failed_samples()" in message
    assert "on_error='skip'" in message and "max_failures" not in message
    assert any(key in message for key in bad_keys)
    assert info.value.limit_reached


@pytest.mark.parametrize("per_task", [1, 4])
def test_too_many_failures_raise_pipeline_failure(
    bad_list: tuple[FileList, set[str]], per_task: int
) -> None:
    source, bad_keys = bad_list
    options = gl.LoaderOptions(samples_per_task=per_task)
    loader = make(source, max_failures=2, shuffle=False, options=options)
    with pytest.raises(PipelineFailure) as info:
        run_epoch(loader)
    assert info.value.limit_reached and "max_failures" in str(info.value)
    # Each failure is listed once, also while the raising epoch's iterator is still alive.
    failed = loader.failed_samples()
    assert failed and {f.key for f in failed} <= bad_keys
    assert max(Counter((f.key, f.epoch) for f in failed).values()) == 1
    assert loader.stats().failures == len(failed)
    key, stage, error, epoch = failed[0]  # unpacks as the README shows it
    assert (key, stage, error, epoch) == (failed[0].key, failed[0].stage, failed[0].error, 0)
    assert stage in ("read", "decode") and error.startswith(("DecodeError", "FileNotFound", "OS"))


@pytest.mark.parametrize("on_error", ["skip", "raise"])
def test_the_failure_named_first_is_one_the_exception_holds(
    photo_dir: Path, tmp_path: Path, on_error: str
) -> None:
    # The message named the epoch's first failure, a missing file (read), while the
    # exception held the decode failures that passed the limit (QA: `except*
    # FileNotFoundError` missed what the message described).
    good = [(str(p), i) for i, p in enumerate(image_files(photo_dir)[:8])]
    corrupt = []
    for name in ("corrupt1.jpg", "corrupt2.jpg"):
        (tmp_path / name).write_bytes(b"\xff\xd8\xff\xe0 not a jpeg")
        corrupt.append((str(tmp_path / name), 90 + len(corrupt)))
    items = [(str(tmp_path / "missing.jpg"), 99), *good[:4], *corrupt, *good[4:]]
    limit = 1 if on_error == "skip" else None  # passed with the first bad decode
    loader = make(
        FileList(items), batch_size=2, shuffle=False, on_error=on_error, max_failures=limit
    )
    with pytest.raises(PipelineFailure) as info:
        run_epoch(loader)
    held = info.value.exceptions[0]
    notes = " ".join(getattr(held, "__notes__", []))
    advice = " ".join([str(info.value), *getattr(info.value, "__notes__", [])])
    named = advice.split("First: ")[1].split(" (")[0]
    assert f"sample: {named}" in notes, (str(info.value), notes)
    if on_error == "skip":
        # The epoch's limit, over both stages: the missing file and a bad decode pass it.
        assert str(info.value).startswith("this epoch's failed samples passed max_failures=1")
        assert named in {key for key, _ in [*corrupt, items[0]]}


def test_cost_lookahead_leaves_a_missing_file_to_its_read(
    bad_list: tuple[FileList, set[str]],
) -> None:
    # Sizes for the start order come from the source; a file that is gone must fail its
    # own read (reported, skipped), not the whole epoch.
    source, bad_keys = bad_list
    options = gl.LoaderOptions(cost_lookahead=8)
    loader = make(source, batching="straggler", max_failures=None, options=options)
    assert Counter(labels_of(run_epoch(loader))) == Counter(range(30))
    failed = {f.key: f.stage for f in loader.failed_samples()}
    assert set(failed) == bad_keys
    assert failed[next(k for k in bad_keys if k.endswith("missing.jpg"))] == "read"


@pytest.mark.parametrize(("threads", "per_task"), [(1, 1), (3, 1), (1, 8), (3, 3)])
def test_ordered_batches_do_not_depend_on_thread_count(
    unique_list: FileList, threads: int, per_task: int
) -> None:
    ref = run_epoch(
        make(unique_list, seed=5, options=gl.LoaderOptions(decode_threads=2, samples_per_task=1))
    )
    got = run_epoch(
        make(
            unique_list,
            seed=5,
            options=gl.LoaderOptions(
                decode_threads=threads, io_threads=threads, samples_per_task=per_task
            ),
        )
    )
    assert len(ref) == len(got)
    for (xr, yr), (xg, yg) in zip(ref, got, strict=True):
        assert torch.equal(yr, yg)
        assert torch.equal(xr, xg)


def test_epochs_reshuffle_and_random_crops_change(unique_list: FileList) -> None:
    loader = make(unique_list, seed=1)
    first = run_epoch(loader)
    second = run_epoch(loader)  # no set_epoch: the next pass moves on to epoch 1 by itself
    assert loader.epoch == 1
    assert labels_of(first) != labels_of(second)
    loader.set_epoch(0)
    assert labels_of(run_epoch(loader)) == labels_of(first)


@pytest.mark.parametrize(("stop_after", "per_task"), [(0, 1), (1, 1), (3, 5), (5, 1), (5, 3)])
def test_resume_mid_epoch_yields_exactly_the_remaining_batches(
    unique_list: FileList, stop_after: int, per_task: int
) -> None:
    full = run_epoch(make(unique_list, seed=2))
    options = gl.LoaderOptions(samples_per_task=per_task)
    loader = make(unique_list, seed=2, options=options)
    it = iter(loader)
    for _ in range(stop_after):
        next(it)
    state = json.loads(json.dumps(loader.state_dict()))
    loader.close()
    resumed = make(unique_list, seed=2)
    resumed.load_state_dict(state)
    rest = run_epoch(resumed)
    assert len(rest) == len(full) - stop_after
    for (xr, yr), (xg, yg) in zip(full[stop_after:], rest, strict=True):
        assert torch.equal(yr, yg) and torch.equal(xr, xg)


@pytest.mark.parametrize("batching", ["ordered", "straggler"])
def test_sample_weights_draw_each_epoch_and_resume_to_the_same_draw(
    unique_list: FileList, batching: str
) -> None:
    # Labels are indices; odd ones weigh 0, index 2 weighs 10: a class-balancing habit.
    n = len(unique_list)
    weights = [0.0 if i % 2 else (10.0 if i == 2 else 1.0) for i in range(n)]
    kw: dict[str, Any] = {"seed": 4, "sample_weights": weights, "batching": batching}
    full = labels_of(run_epoch(make(unique_list, **kw)))
    assert len(full) == n and all(label % 2 == 0 for label in full)
    assert Counter(full)[2] > 3  # drawn with replacement, in proportion
    loader = make(unique_list, **kw)
    it = iter(loader)
    first = [int(v) for v in next(it)[1]]
    state = json.loads(json.dumps(loader.state_dict()))
    loader.close()
    resumed = make(unique_list, **kw)
    resumed.load_state_dict(state)
    assert Counter(first + labels_of(run_epoch(resumed))) == Counter(full)
    with pytest.raises(ValueError, match="different sample_weights"):
        make(unique_list, seed=4, batching=batching).load_state_dict(state)


def test_each_repeat_of_a_weighted_draw_gets_its_own_crop(unique_list: FileList) -> None:
    # Review: repeats shared the (seed, epoch, index) stream, so all came out the same:
    # the over-sampled class got no more variety than one copy would give.
    weights = [1.0 if i == 3 else 0.0 for i in range(len(unique_list))]
    kw: dict[str, Any] = {"seed": 1, "sample_weights": weights, "shuffle": True}
    first = run_epoch(make(unique_list, **kw))
    rows = torch.cat([x for x, _ in first])
    assert set(labels_of(first)) == {3} and len(rows) == len(unique_list)
    distinct = {tuple(r.flatten()[:64].tolist()) for r in rows}
    assert len(distinct) > len(rows) // 2  # crops and flips differ between repeats
    again = run_epoch(make(unique_list, **kw))  # and are the same in another run
    assert all(torch.equal(a, b) for (a, _), (b, _) in zip(first, again, strict=True))


@pytest.mark.parametrize("batching", ["ordered", "straggler"])
def test_a_checkpoint_after_break_keeps_its_progress_once_the_epoch_is_collected(
    unique_list: FileList, batching: str
) -> None:
    # "break at max_steps, then save": the cut-short epoch is freed by the garbage
    # collector at some point (a gc.collect() before saving is common); the state must not
    # depend on when.
    loader = make(unique_list, seed=6, batching=batching)
    seen: list[int] = []
    for step, (_, y) in enumerate(loader):
        seen += [int(v) for v in y]
        if step == 1:
            break
    gc.collect()
    state = json.loads(json.dumps(loader.state_dict()))
    assert state.get("batcher") is not None
    resumed = make(unique_list, seed=6, batching=batching)
    resumed.load_state_dict(state)
    rest = labels_of(run_epoch(resumed))
    assert Counter(seen + rest) == Counter(range(len(unique_list)))
    # A later pass has its own progress: the saved one no longer stands for it.
    run_epoch(loader)
    gc.collect()
    later = json.loads(json.dumps(loader.state_dict()))
    assert later["epoch_done"] and later["batcher"] != state["batcher"]
    ended = make(unique_list, seed=6, batching=batching)
    ended.load_state_dict(later)
    ended.set_epoch(loader.epoch)
    assert run_epoch(ended) == []  # that pass ended: nothing of it is left


@pytest.mark.parametrize("choose", ["sampler.set_epoch(next)", "set_epoch(same)"])
def test_a_checkpoint_after_break_and_a_new_epoch_choice_has_no_stale_progress(
    unique_list: FileList, choose: str
) -> None:
    # Either choice makes the next pass start an epoch from its beginning; a state that
    # paired it with the cut-short pass's progress made resume skip samples.
    loader = make(unique_list, seed=7)
    for step, _ in enumerate(loader):
        if step == 1:
            break
    if choose == "set_epoch(same)":
        loader.set_epoch(loader.epoch)
    else:
        loader.sampler.set_epoch(loader.epoch + 1)
    for collect in (False, True):
        if collect:
            gc.collect()
        state = json.loads(json.dumps(loader.state_dict()))
        assert state.get("batcher") is None, collect
        resumed = make(unique_list, seed=7)
        resumed.load_state_dict(state)
        assert sorted(labels_of(run_epoch(resumed))) == list(range(len(unique_list)))
        assert resumed.epoch == loader.sampler.epoch
    assert sorted(labels_of(run_epoch(loader))) == list(range(len(unique_list)))


def test_straggler_resume_delivers_the_rest_once(unique_list: FileList) -> None:
    loader = make(unique_list, seed=4, batching="straggler")
    it = iter(loader)
    seen = [int(v) for _ in range(2) for v in next(it)[1]]
    state = json.loads(json.dumps(loader.state_dict()))
    loader.close()
    resumed = make(unique_list, seed=4, batching="straggler")
    resumed.load_state_dict(state)
    rest = labels_of(run_epoch(resumed))
    assert Counter(seen + rest) == Counter(range(len(unique_list)))


@pytest.mark.parametrize("batching", ["ordered", "straggler"])
def test_resume_survives_the_training_loops_set_epoch(unique_list: FileList, batching: str) -> None:
    # The README's loop calls set_epoch(epoch) at the top of every epoch, the restored one
    # included: that call must not throw the restored progress away.
    loader = make(unique_list, seed=5, batching=batching)
    loader.set_epoch(3)
    it = iter(loader)
    seen = [int(v) for _ in range(2) for v in next(it)[1]]
    state = json.loads(json.dumps(loader.state_dict()))
    loader.close()
    resumed = make(unique_list, seed=5, batching=batching)
    resumed.load_state_dict(state)
    resumed.set_epoch(3)
    rest = labels_of(run_epoch(resumed))
    assert Counter(seen + rest) == Counter(range(len(unique_list)))
    # Another epoch, or the same one set again once the restored part was used, is whole.
    resumed.set_epoch(3)
    assert sorted(labels_of(run_epoch(resumed))) == list(range(len(unique_list)))
    again = make(unique_list, seed=5, batching=batching)
    again.load_state_dict(state)
    again.set_epoch(4)
    assert sorted(labels_of(run_epoch(again))) == list(range(len(unique_list)))


def test_a_failure_reaches_the_resume_state_when_it_is_noted(unique_list: FileList) -> None:
    # Not when the batcher thread drains it: a state taken in between would have the
    # resumed run try the sample again, and report it a second time.
    from gpu_loader._epoch import CpuEpoch

    loader = make(unique_list)
    epoch = CpuEpoch(loader, None)
    try:
        epoch.note_failure(3, "decode")  # as a read or decode thread does
        assert epoch.received.state()["failed"] == [[3, 4]]
        assert epoch.received.state()["failed_stages"] == {"decode": 1}
        assert list(epoch.failed_positions) == [3]  # the batcher still hears of it
    finally:
        epoch.close()
    # With on_error="raise" the user fixes the file and resumes: it must run again.
    strict = CpuEpoch(make(unique_list, on_error="raise"), None)
    try:
        strict.note_failure(3, "decode")
        assert strict.received.state()["failed"] == []
    finally:
        strict.close()


def test_a_fatal_stage_error_gets_no_max_failures_advice(unique_list: FileList) -> None:
    # max_failures cannot help when a stage fails outright (here the index itself).
    class BrokenKeys(FileList):
        def key(self, i: int) -> str:
            if i == 20:
                raise KeyError("the index lost sample 20")
            return super().key(i)

    broken = BrokenKeys([(unique_list.key(i), i) for i in range(len(unique_list))])
    with pytest.raises(PipelineFailure) as info:
        run_epoch(make(broken, shuffle=False))
    assert not info.value.limit_reached
    assert "max_failures" not in " ".join(getattr(info.value, "__notes__", []))


def test_a_refused_state_changes_nothing(unique_list: FileList) -> None:
    loader = make(unique_list, seed=2)
    it = iter(loader)
    first = next(it)
    good = make(unique_list, seed=2).state_dict()
    refused: list[Any] = [
        make(unique_list, seed=3).state_dict(),  # another seed
        {**good, "batcher": {"format": "nonsense"}},
        {**good, "batcher": [1, 2]},
        {k: v for k, v in good.items() if k != "sampler"},
        None,
        [1],
    ]
    for state in refused:
        with pytest.raises((ValueError, TypeError)) as info:
            loader.load_state_dict(state)
        assert "state" in str(info.value)
    rest = [b for b in it]  # the running epoch went on
    assert sorted(labels_of([first, *rest])) == list(range(len(unique_list)))


@pytest.mark.parametrize("epoch", [-1, 2**24, 1.0, True, "3"])
def test_set_epoch_refuses_what_the_random_streams_cannot_key(
    unique_list: FileList, epoch: Any
) -> None:
    with pytest.raises((TypeError, ValueError), match="epoch"):
        make(unique_list).set_epoch(epoch)
    loader = make(unique_list)
    loader.set_epoch(np.int64(3))  # numpy integers are integers
    assert loader.epoch == 3


@pytest.mark.parametrize("epoch", [2**24, 10**30])
def test_a_state_with_an_epoch_set_epoch_refuses_is_refused_too(
    unique_list: FileList, epoch: int
) -> None:
    state = make(unique_list).state_dict()
    state["sampler"]["epoch"] = epoch
    loader = make(unique_list)
    with pytest.raises(ValueError, match=f"epoch {epoch} is not below {2**24}"):
        loader.load_state_dict(state)
    assert sum(len(labels) for _, labels in loader) == len(unique_list)  # nothing changed


def test_state_right_after_a_restore_is_the_restored_one(unique_list: FileList) -> None:
    # An older epoch's iterator may still be alive (stopped by the restore); a checkpoint
    # taken before iterating again must still be the restored progress.
    saver = make(unique_list, seed=8)
    it = iter(saver)
    for _ in range(4):
        next(it)
    saved = json.loads(json.dumps(saver.state_dict()))
    loader = make(unique_list, seed=8)
    old = iter(loader)
    next(old)  # one batch of its own, iterator kept
    loader.load_state_dict(saved)
    assert loader.state_dict()["batcher"] == saved["batcher"]
    loader.set_epoch(0)  # the saved epoch again: still the restored progress
    assert loader.state_dict()["batcher"] == saved["batcher"]
    assert len(labels_of(run_epoch(loader))) == len(unique_list) - 4 * 8


def test_a_stale_iterator_says_so_and_starts_nothing(unique_list: FileList) -> None:
    loader = make(unique_list, options=gl.LoaderOptions(monitor_gpu=False))
    before = set(threading.enumerate())
    stale, _current = iter(loader), iter(loader)  # the second stops the first's epoch
    with pytest.raises(RuntimeError, match="this epoch's iterator was stopped"):
        next(stale)
    assert [t.name for t in set(threading.enumerate()) - before if t.is_alive()] == []


def test_state_from_another_setting_is_refused(unique_list: FileList) -> None:
    state = make(unique_list, seed=2).state_dict()
    with pytest.raises(ValueError, match="batch_size"):
        make(unique_list, seed=2, batch_size=4).load_state_dict(state)
    with pytest.raises(ValueError, match="seed"):
        make(unique_list, seed=3).load_state_dict(state)
    with pytest.raises(ValueError, match="batching='ordered' but this loader has"):
        make(unique_list, seed=2, batching="straggler").load_state_dict(state)
    with pytest.raises(ValueError, match="drop_last=False but this loader has"):
        make(unique_list, seed=2, drop_last=True).load_state_dict(state)


def test_a_hand_edited_state_is_refused_at_load_and_a_loaded_one_is_a_copy(
    unique_list: FileList,
) -> None:
    loader = make(unique_list, seed=2)
    it = iter(loader)
    for _ in range(2):
        next(it)
    state = json.loads(json.dumps(loader.state_dict()))
    loader.close()
    assert state["batcher"]["batches"] == 2 and state["batcher"]["delivered"] == [[0, 16]]

    def edited(**changes: Any) -> dict[str, Any]:
        out = json.loads(json.dumps(state))
        for key, value in changes.items():
            target, _, field = key.rpartition("__")
            (out[target] if target else out)[field] = value
        return out

    # bool("false") is True: a str from a config store skipped the whole epoch (QA).
    with pytest.raises(ValueError, match="'epoch_done' must be True or False, got 'false'"):
        make(unique_list, seed=2).load_state_dict(edited(epoch_done="false"))
    with pytest.raises(ValueError, match="unsupported loader state version True"):
        make(unique_list, seed=2).load_state_dict(edited(version=True))
    # An ended epoch with samples left: its resume depended on set_epoch being called.
    left = len(unique_list) - 16
    with pytest.raises(ValueError, match=f"epoch 0 ended, but its 'batcher' entry has {left} "):
        make(unique_list, seed=2).load_state_dict(edited(epoch_done=True))
    # 16 samples in batches of 8 are 2 batches: 0 made a rank yield past len(loader) (QA).
    for batches in (0, 1, 17):
        with pytest.raises(ValueError, match=f"'batches' is {batches} but 16 delivered"):
            make(unique_list, seed=2).load_state_dict(edited(batcher__batches=batches))
    # QA66: a state nested 5,000 lists deep raised RecursionError; a stage name of a
    # million characters was repeated whole in the refusal.
    deep: list[Any] = []
    for _ in range(5000):
        deep = [deep]
    with pytest.raises(ValueError, match="nested too deeply"):
        make(unique_list, seed=2).load_state_dict(edited(extra=deep))
    with pytest.raises(ValueError, match="'failed_stages' must map") as refused:
        make(unique_list, seed=2).load_state_dict(edited(batcher__failed_stages={"x" * 10**6: 1}))
    assert len(str(refused.value)) < 400
    # Editing the dict after loading changed the resume, past every check (QA).
    resumed = make(unique_list, seed=2)
    resumed.load_state_dict(state)
    state["batcher"]["delivered"] = [[0, len(unique_list)]]
    assert resumed.state_dict()["batcher"]["delivered"] == [[0, 16]]
    resumed.state_dict()["batcher"]["delivered"].append([20, 30])  # nor the one it returns
    assert len(labels_of(run_epoch(resumed))) == len(unique_list) - 16


def test_a_loader_built_before_init_process_group_refuses_to_iterate(
    unique_list: FileList, monkeypatch: pytest.MonkeyPatch
) -> None:
    import sys
    import types

    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    loader = make(unique_list)
    dist = types.ModuleType("torch.distributed")
    dist.is_available = lambda: True  # type: ignore[attr-defined]
    dist.is_initialized = lambda: True  # type: ignore[attr-defined]
    dist.get_rank = lambda: 0  # type: ignore[attr-defined]
    dist.get_world_size = lambda: 2  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "torch.distributed", dist)
    with pytest.raises(RuntimeError, match="Build the loader after init_process_group"):
        iter(loader)


@pytest.mark.parametrize("world_size", [2, 3])
def test_sharding_through_the_loader(unique_list: FileList, world_size: int) -> None:
    shards = [
        labels_of(run_epoch(make(unique_list, rank=r, world_size=world_size, seed=9)))
        for r in range(world_size)
    ]
    assert len({len(s) for s in shards}) == 1, "every rank gets the same number of samples"
    union = Counter(v for s in shards for v in s)
    assert set(union) == set(range(len(unique_list)))


@pytest.mark.parametrize("batching", ["ordered", "straggler"])
def test_a_rank_whose_lone_last_sample_fails_yields_as_many_batches(
    photo_dir: Path, tmp_path: Path, batching: str
) -> None:
    # Each rank's shard in batches of its size less one: [n - 1, 1]. Rank 1's lone last
    # sample is a bad file: its epoch gave one batch where rank 0's gave two, and a DDP
    # job, whose ranks step together, waited in a collective for good.
    files = [(str(p), i) for i, p in enumerate(image_files(photo_dir))]
    shards = {r: list(make(FileList(files), rank=r, world_size=2, shuffle=False).sampler)
              for r in (0, 1)}  # fmt: skip
    size = len(shards[1]) - 1
    last = shards[1][-1]
    (tmp_path / "bad.jpg").write_bytes(b"not an image at all" * 10)
    files[last] = (str(tmp_path / "bad.jpg"), files[last][1])
    for rank in (0, 1):
        loader = make(
            FileList(files), batch_size=size, rank=rank, world_size=2, shuffle=False,
            batching=batching, max_failures=None,
        )  # fmt: skip
        expected = sorted(files[i][1] for i in shards[rank] if i != last)
        for _ in range(2):  # two epochs
            batches = run_epoch(loader)
            assert len(batches) == len(loader) == 2, f"rank {rank}"
            assert sorted(labels_of(batches)) == expected
    assert [f.key for f in loader.failed_samples()] == [files[last][0]] * 2


def bad_rank_1_list(photo_dir: Path, tmp_path: Path, bad: int) -> tuple[FileList, list[int]]:
    """The photos as a FileList whose first ``bad`` samples of rank 1's shard (2 ranks,
    no shuffle) are corrupt files; and those samples' indices."""
    files = [(str(p), i) for i, p in enumerate(image_files(photo_dir))]
    shard = list(make(FileList(files), rank=1, world_size=2, shuffle=False).sampler)
    for n, i in enumerate(shard[:bad]):
        (tmp_path / f"bad{n}.jpg").write_bytes(b"not an image at all" * 10)
        files[i] = (str(tmp_path / f"bad{n}.jpg"), files[i][1])
    return FileList(files), shard[:bad]


@pytest.mark.parametrize("batching", ["ordered", "straggler"])
def test_with_batch_size_1_failed_samples_are_padded_with_repeats_on_each_rank(
    photo_dir: Path, tmp_path: Path, batching: str
) -> None:
    # Each failed sample is a whole batch here: no batch can be cut to make up for it. The
    # rank's epoch ended 3 batches short, and a DDP job waited in a collective for good.
    source, bad = bad_rank_1_list(photo_dir, tmp_path, 3)
    kw: dict[str, Any] = {"batch_size": 1, "shuffle": False, "batching": batching}
    kw |= {"max_failures": None, "world_size": 2, "transform": EvalTransform(SIZE)}
    loader = make(source, rank=1, **kw)
    batches = run_epoch(loader)
    assert len(batches) == len(loader)
    labels = labels_of(batches)
    good = [i for i in loader.sampler if i not in bad]
    assert sorted(labels[: len(good)]) == sorted(good)  # the epoch: each good sample once
    assert labels[len(good) :] == good[:3]  # then repeats of the first ones
    first = {int(y[0]): x[0] for x, y in batches[: len(good)]}
    for x, y in batches[len(good) :]:
        assert torch.equal(x[0], first[int(y[0])])  # the same crop: decoded again alike
    assert sorted(f.key for f in loader.failed_samples()) == sorted(source.key(i) for i in bad)
    # A single process keeps exactly once: nothing waits on it.
    alone = labels_of(run_epoch(make(source, rank=0, **{**kw, "world_size": 1})))
    assert sorted(alone) == sorted(set(range(len(source))) - set(bad))


def test_a_default_device_set_by_the_training_loop_leaves_the_batches_on_the_cpu(
    photo_dir: Path, tmp_path: Path
) -> None:
    # QA62: tensors made in the training loop's thread (the padding batch here, a batch
    # straggler mode forms there) followed its torch.set_default_device: "meta" tensors,
    # and "can't convert meta device type tensor to numpy".
    source, _ = bad_rank_1_list(photo_dir, tmp_path, 3)
    kw: dict[str, Any] = {"batch_size": 1, "shuffle": False, "max_failures": None}
    loader = make(source, rank=1, world_size=2, transform=EvalTransform(SIZE), **kw)
    expected = labels_of(run_epoch(loader))
    torch.set_default_device("meta")
    try:
        loader.set_epoch(0)
        batches = run_epoch(loader)
    finally:
        torch.set_default_device(None)
    assert labels_of(batches) == expected
    assert all(x.device.type == "cpu" for x, _ in batches)


def test_repeats_go_round_the_delivered_samples_as_often_as_it_takes(
    photo_dir: Path, tmp_path: Path
) -> None:
    # More bad files than good on a rank: the padding tried each good sample once and
    # stopped, short, and the ranks hung (QA).
    every, bad = bad_rank_1_list(photo_dir, tmp_path, 4)
    source = FileList([(every.key(i), i) for i in range(14)])  # 7 a rank, 4 of rank 1's bad
    kw: dict[str, Any] = {"batch_size": 1, "shuffle": False, "max_failures": None}
    loader = make(source, rank=1, world_size=2, transform=EvalTransform(SIZE), **kw)
    assert len(loader) == 7
    labels = labels_of(run_epoch(loader))
    good = [i for i in loader.sampler if i not in bad]
    assert len(good) == 3 and labels == [*good, *good, good[0]]


@pytest.mark.parametrize("batching", ["ordered", "straggler"])
def test_a_resume_inside_the_padding_goes_on_with_its_round(
    photo_dir: Path, tmp_path: Path, batching: str
) -> None:
    # The round of repeats was not in the state: a checkpoint after the first padding
    # batch resumed with that batch's sample again (QA: one sample three times, one once).
    source, bad = bad_rank_1_list(photo_dir, tmp_path, 3)
    kw: dict[str, Any] = {"batch_size": 1, "shuffle": False, "batching": batching}
    kw |= {"max_failures": None, "world_size": 2, "rank": 1, "transform": EvalTransform(SIZE)}
    whole = labels_of(run_epoch(make(source, **kw)))
    loader = make(source, **kw)
    it = iter(loader)
    before = [int(next(it)[1][0]) for _ in range(len(loader) - 2)]  # one padding batch in
    state = json.loads(json.dumps(loader.state_dict()))
    assert state["batcher"]["padding"]["next"] == 1
    loader.close()
    resumed = make(source, **kw)
    resumed.load_state_dict(state)
    after = labels_of(run_epoch(resumed))
    good = [i for i in resumed.sampler if i not in bad]
    assert whole[-3:] == good[:3]  # padded with the first three good samples
    assert before[-1:] + after == good[:3]  # and the resumed round goes on from the second
    assert sorted(before[:-1]) == sorted(good)  # (straggler mode: in its own order)


def test_a_rank_with_nothing_to_repeat_says_so_instead_of_ending_short(
    photo_dir: Path, tmp_path: Path
) -> None:
    source, bad = bad_rank_1_list(photo_dir, tmp_path, 24)  # all of rank 1's shard
    loader = make(source, rank=1, world_size=2, batch_size=4, shuffle=False, max_failures=None)
    with pytest.raises(RuntimeError, match=r"rank 1 of 2: epoch 0 is 6 batch\(es\) short"):
        run_epoch(loader)
    assert len(loader.failed_samples()) == len(bad) == 24


def test_repeats_with_augment_leave_the_training_thread_s_torch_width(
    photo_dir: Path, tmp_path: Path
) -> None:
    # A repeat decodes in the training loop's thread: it set that thread's torch ops to
    # one core for good (augment's one intra-op thread is for the loader's threads).
    source, _ = bad_rank_1_list(photo_dir, tmp_path, 2)
    width = torch.get_num_threads()
    torch.set_num_threads(3)
    try:
        loader = make(
            source, rank=1, world_size=2, batch_size=1, shuffle=False, max_failures=None,
            augment=lambda image, generator: image,
        )  # fmt: skip
        assert len(run_epoch(loader)) == len(loader)
        assert torch.get_num_threads() == 3
    finally:
        torch.set_num_threads(width)


def test_a_checkpoint_among_the_repeats_resumes_the_rest_of_them(
    photo_dir: Path, tmp_path: Path
) -> None:
    source, _ = bad_rank_1_list(photo_dir, tmp_path, 3)
    kw: dict[str, Any] = {"batch_size": 1, "shuffle": False, "max_failures": None}
    loader = make(source, rank=1, world_size=2, **kw)
    it = iter(loader)
    taken = [next(it) for _ in range(len(loader) - 2)]  # the epoch and one repeat
    state = loader.state_dict()
    loader.close()
    resumed = make(source, rank=1, world_size=2, **kw)
    resumed.load_state_dict(state)
    rest = run_epoch(resumed)
    assert len(taken) + len(rest) == len(loader)


def test_each_stats_line_says_which_rank_and_process_wrote_it(
    unique_list: FileList, tmp_path: Path
) -> None:
    # Two ranks logging to one file (or files merged later) gave lines no one could tell
    # apart, though the docs said they could be merged (QA).
    import os
    import socket

    path = tmp_path / "stats.jsonl"
    options = gl.LoaderOptions(log_jsonl=str(path), monitor_gpu=False)
    for rank in (0, 1):
        loader = make(unique_list, rank=rank, world_size=2, batch_size=8, options=options)
        run_epoch(loader)
        loader.close()
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert {line["rank"] for line in lines} == {0, 1}
    assert all(line["world_size"] == 2 and line["epoch"] == 0 for line in lines)
    assert all(
        line["host"] == socket.gethostname() and line["pid"] == os.getpid() for line in lines
    )


def test_an_epochs_last_log_line_carries_what_stats_says_after_it(
    unique_list: FileList, tmp_path: Path
) -> None:
    # The last line was written before the samplers took their last readings: an epoch
    # shorter than the 0.5 s sampling interval logged no cpu_percent at all (QA55).
    path = tmp_path / "stats.jsonl"
    options = gl.LoaderOptions(log_jsonl=str(path), log_interval_s=600, monitor_gpu=False)
    loader = make(unique_list, batch_size=8, options=options)
    after = []
    for _ in range(2):
        run_epoch(loader)
        after.append(loader.stats())
    loader.close()
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    for epoch, stats in enumerate(after):
        last = [line for line in lines if line["epoch"] == epoch][-1]
        assert last["samples"] == stats.samples
        assert stats.cpu_percent is not None
        assert last["cpu_percent"] == pytest.approx(stats.cpu_percent)


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full (a full disk)")
def test_a_full_disk_under_the_stats_log_does_not_stop_training(unique_list: FileList) -> None:
    # Closing the log at an epoch's end flushed what a failed write had left and raised
    # ENOSPC from the training loop's last next(); every later pass then failed too.
    options = gl.LoaderOptions(log_jsonl="/dev/full", log_interval_s=0.1, monitor_gpu=False)
    loader = make(unique_list, batch_size=16, options=options)
    for _ in range(3):
        assert sorted(labels_of(run_epoch(loader))) == list(range(len(unique_list)))
    idle = loader.stats().elapsed_s
    time.sleep(0.3)
    assert loader.stats().elapsed_s == idle  # the monitor's clock stopped between epochs


def test_the_stall_counts_all_of_next_the_loader_s_bookkeeping_too(
    unique_list: FileList, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The wait ended once the batch was taken, before the per-batch bookkeeping: QA
    # measured 25-40% of the time inside next() left out of the stall.
    import gpu_loader._epoch as epoch_module

    real = epoch_module.Received.delivered

    def slow(self: Any, positions: Any) -> None:
        time.sleep(0.03)
        real(self, positions)

    monkeypatch.setattr(epoch_module.Received, "delivered", slow)
    loader = make(unique_list, batch_size=8)
    it = iter(loader)
    next(it)  # start-up: apart from the stall
    inside = 0.0
    while True:
        began = time.perf_counter()
        try:
            next(it)
        except StopIteration:
            break
        inside += time.perf_counter() - began
    stall = loader.stats().stall_s
    assert inside >= 0.03 * (len(loader) - 1)
    assert stall >= 0.9 * inside, (stall, inside)


def test_breaking_out_and_exceptions_leave_no_threads(unique_list: FileList) -> None:
    before = set(threading.enumerate())
    loader = make(unique_list, batch_size=4)
    for _ in loader:
        break
    loader.close()
    with pytest.raises(ZeroDivisionError):
        for _ in make(unique_list, batch_size=4):
            raise ZeroDivisionError
    gen: Iterator[Any] = iter(make(unique_list, batch_size=4))
    next(gen)
    del gen
    import gc

    gc.collect()
    for thread in set(threading.enumerate()) - before:
        thread.join(timeout=5)
    leaked = [t for t in set(threading.enumerate()) - before if t.is_alive()]
    assert leaked == []


def test_invalid_arguments_are_clear(unique_list: FileList) -> None:
    with pytest.raises(ValueError, match="batch_size"):
        make(unique_list, batch_size=0)
    with pytest.raises(ValueError, match="batching"):
        make(unique_list, batching="fastest")
    with pytest.raises(ValueError, match="dtype"):
        make(unique_list, dtype="float64")
    with pytest.raises(TypeError, match="transform"):
        make(unique_list, transform=lambda x: x)
    for device in ("tpu", "mps", 3.5):  # unknown to torch, known but unsupported, not a str
        with pytest.raises(ValueError, match="`device` must be 'cpu', 'cuda', 'cuda:N' or 'auto'"):
            make(unique_list, device=device)
    for limit in (-1, 1.5, "x", True):  # refused when built, not at the first batch
        with pytest.raises((TypeError, ValueError), match="max_failures"):
            make(unique_list, max_failures=limit)
    with pytest.raises(TypeError, match="ImageFolder"):
        make([("a.jpg", 0)])


def test_a_path_source_is_opened_as_the_folder_it_names(photo_dir: Path) -> None:
    by_path = make(str(photo_dir), shuffle=False, transform=EvalTransform(SIZE))
    by_index = make(gl.sources.ImageFolder(photo_dir), shuffle=False, transform=EvalTransform(SIZE))
    for (xa, ya), (xb, yb) in zip(run_epoch(by_path), run_epoch(by_index), strict=True):
        assert torch.equal(ya, yb) and torch.equal(xa, xb)


def test_images_match_the_per_sample_cpu_path(unique_list: FileList) -> None:
    from gpu_loader.ops import load_into
    from gpu_loader.sources import sample_rng

    transform = TrainTransform(SIZE)
    loader = make(unique_list, seed=11, transform=transform, batch_size=16)
    x, y = next(iter(loader))
    loader.close()
    indices = loader.sampler.indices()[:16]
    for row, index in enumerate(indices):
        assert int(y[row]) == unique_list.label(int(index))
        out = np.empty((3, SIZE, SIZE), np.float32)
        load_into(
            unique_list.read(int(index)),
            transform,
            sample_rng(11, 0, int(index)),
            out,
            dtype="float32",
        )
        assert np.array_equal(out, x[row].numpy())


@pytest.mark.parametrize("threads", [1, 3])
def test_straggler_rows_hold_the_sample_their_label_names(
    unique_list: FileList, threads: int
) -> None:
    # Straggler batches are built on their nominal batch's tensor with moved samples
    # copied in, so rows need not follow positions: every row must match its label.
    from gpu_loader.ops import load_into
    from gpu_loader.sources import sample_rng

    transform = TrainTransform(SIZE)
    options = gl.LoaderOptions(decode_threads=threads, io_threads=threads, max_delay_batches=1)
    loader = make(
        unique_list,
        seed=4,
        transform=transform,
        batch_size=5,
        batching="straggler",
        options=options,
    )
    batches = run_epoch(loader)
    assert sorted(labels_of(batches)) == list(range(len(unique_list)))
    out = np.empty((3, SIZE, SIZE), np.float32)
    for x, y in batches:
        for row, label in enumerate(y.tolist()):
            index = label  # unique_list: the label is the index
            load_into(
                unique_list.read(index),
                transform,
                sample_rng(4, 0, index),
                out,
                dtype="float32",
            )
            assert np.array_equal(out, x[row].numpy())


def test_straggler_batches_reach_the_loop_in_emission_order(
    unique_list: FileList, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The training loop's thread forms a batch itself when the queue is empty; it must
    # not overtake the one the batcher thread is still assembling. With no lateness
    # allowed (D = 0) and no failures, straggler batches are exactly the ordered ones.
    import gpu_loader._epoch as epoch_module

    assemble = epoch_module.CpuEpoch.assemble

    def slow_in_the_batcher_thread(self: Any, batch: Any) -> Any:
        if threading.current_thread().name == "gpu_loader-batcher":
            time.sleep(0.02)  # widens the window the race needs; it also happens unaided
        return assemble(self, batch)

    monkeypatch.setattr(epoch_module.CpuEpoch, "assemble", slow_in_the_batcher_thread)
    options = gl.LoaderOptions(max_delay_batches=0)
    ordered = labels_of(run_epoch(make(unique_list, seed=6, batch_size=3)))
    loader = make(unique_list, seed=6, batch_size=3, batching="straggler", options=options)
    assert labels_of(run_epoch(loader)) == ordered
    stats = loader.batching_stats()
    assert stats is not None and stats.max_delay == 0


def test_a_slow_large_file_is_left_behind_without_copying_its_batch(
    unique_list: FileList, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A file many times the median size decodes into a private tensor, so when it is
    # late its batch goes without it and is still built on its nominal batch's tensor.
    from PIL import Image

    import gpu_loader._epoch as epoch_module
    from gpu_loader._straggler_rows import StragglerRows
    from gpu_loader.batching import AdaptiveThreshold
    from gpu_loader.pipeline import SlowLane

    big = tmp_path / "big.jpg"
    noise = np.random.default_rng(0).integers(0, 256, (600, 600, 3), np.uint8)
    Image.fromarray(noise).save(big, quality=95)
    items = [(unique_list.key(i), i) for i in range(len(unique_list))]
    big_label = len(items)
    items.insert(40, (str(big), big_label))  # position 40: nominal batch 8 of 5
    real = epoch_module.load_into

    def slow_for_big(data: Any, *args: Any, **kw: Any) -> Any:
        if len(data) > 200_000:
            time.sleep(0.5)  # a straggler decode
        return real(data, *args, **kw)

    assembled: list[tuple[set[int], bool]] = []  # (positions, copied whole) per batch
    assemble, serial = StragglerRows.assemble, threading.Lock()

    def spy(self: StragglerRows, positions: Any, items: Any) -> Any:
        with serial:  # the batcher and the training loop's threads both assemble
            fresh = self.fresh
            out = assemble(self, positions, items)
            assembled.append((set(positions), self.fresh > fresh))
        return out

    def lane(self: Any, name: str, threads: int, *, runs: bool = False) -> SlowLane:
        # A 10 s floor: no ordinary decode turns into a straggler when this busy machine
        # stalls a thread for a few ms (that one's batch would rightly go without it, and
        # be copied whole). The big file is not held back by the lane but by its size.
        return SlowLane(max_threads=threads, threshold=AdaptiveThreshold(floor_s=10.0))

    monkeypatch.setattr(epoch_module, "load_into", slow_for_big)
    monkeypatch.setattr(epoch_module.CpuEpoch, "slow_lane", lane)
    monkeypatch.setattr(StragglerRows, "assemble", spy)
    options = gl.LoaderOptions(decode_threads=2, io_threads=2, max_delay_batches=2)
    loader = make(
        FileList(items), batch_size=5, batching="straggler", shuffle=False, options=options
    )
    batches = []
    for x, y in loader:
        batches.append((x.clone(), y.clone()))
        # A training step: the loader keeps batches queued, so only the big file's 0.5 s
        # drains the queue and makes its batch go without it. (With no step, a machine
        # busy enough to delay a read lets a due batch scatter a nominal one.)
        time.sleep(0.02)
    labels = labels_of(batches)
    assert sorted(labels) == list(range(len(items)))
    assert labels.index(big_label) >= 45, labels  # it joined a later batch than its own
    # The batches that went without it (they hold its neighbours 41-44, not 40) were
    # built in place. (A whole-batch copy can still happen elsewhere: a batch due while
    # samples wait for their reads may scatter a nominal batch, as in a busy epoch.)
    left_behind = [fresh for got, fresh in assembled if got & {41, 42, 43, 44} and 40 not in got]
    assert left_behind and not any(left_behind), assembled
    stats = loader.batching_stats()
    assert stats is not None and stats.large_private >= 1
    assert loader._sample_spares()  # its private tensor waits there for the next epoch
    # The users' view of the copies: the big file's row at least, and the spy's count.
    assert stats.rows_copied >= 1
    assert stats.batches_copied == sum(fresh for _, fresh in assembled)


def test_the_slow_lanes_measure_runs_per_sample(
    unique_list: FileList, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Straggler mode's runs: a decode lane that learnt whole runs' times would be off by
    # the run size whenever that changes (one sample per call while the run sizer warms
    # up, then runs of 8: every run moved to the slow lane in a loader's first epoch).
    decodes_take(monkeypatch, lambda key: 0.005)
    items = [(unique_list.key(i % len(unique_list)), i) for i in range(3 * len(unique_list))]
    options = gl.LoaderOptions(samples_per_task=4, decode_threads=2, io_threads=2)
    loader = make(FileList(items), batch_size=4, batching="straggler", options=options)
    assert sum(len(y) for _, y in loader) == len(items)
    decode = next(s for s in loader.stats().stages if s.name == "decode")
    # 4 x p75 of ~5 ms per sample (runs of 4 take ~20 ms: 4 x that would be ~80 ms)
    assert decode.slow_lane_limit_s is not None and 0.015 < decode.slow_lane_limit_s < 0.05
    loader.close()


def test_a_later_epoch_starts_with_the_straggler_limits_the_last_one_learnt(
    unique_list: FileList, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Limits made per epoch had none for each epoch's first 32 tasks: a slow first decode
    # of a second epoch could not move, and its worker was lost to the stage meanwhile.
    slow = {"key": ""}
    decodes_take(monkeypatch, lambda key: 1.0 if key == slow["key"] else 0.005)
    options = gl.LoaderOptions(samples_per_task=1, io_threads=1, decode_threads=2)
    loader = make(unique_list, batch_size=4, batching="straggler", shuffle=False, options=options)
    run_epoch(loader)
    slow["key"] = unique_list.key(0)  # position 0: the second epoch's first decode
    assert sorted(labels_of(run_epoch(loader))) == list(range(len(unique_list)))
    decode = next(s for s in loader.stats().stages if s.name == "decode")
    assert decode.slow_lane_moves >= 1
    loader.close()


def test_runs_after_the_run_sizers_warm_up_are_not_moved(
    unique_list: FileList, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The automatic run sizer starts at one sample per call and goes to runs of 8 after
    # its early verdict. A decode lane that learnt the single samples' times (its
    # limit: 4 x ~5 ms) moved every run of 8 (~40 ms) after that.
    decodes_take(monkeypatch, lambda key: 0.005)
    items = [(unique_list.key(i % len(unique_list)), i) for i in range(4 * len(unique_list))]
    options = gl.LoaderOptions(decode_threads=2, io_threads=2)
    loader = make(FileList(items), batch_size=16, batching="straggler", options=options)
    assert sum(len(y) for _, y in loader) == len(items)
    assert loader._sizer is not None and loader._sizer.size() == 8  # runs began
    decode = next(s for s in loader.stats().stages if s.name == "decode")
    assert decode.slow_lane_limit_s is not None  # the lane had a limit while runs went
    assert decode.slow_lane_moves == 0
    loader.close()


def test_a_sample_leaves_the_hold_back_list_only_once_the_batcher_has_it(
    unique_list: FileList, monkeypatch: pytest.MonkeyPatch
) -> None:
    # In between, a pop from the training loop's thread would find the sample neither
    # ready nor held back, and could cut a batch that skips it: copied whole, since its
    # slab could not host it.
    from gpu_loader._straggler_rows import StragglerRows
    from gpu_loader.batching import StragglerBatcher

    pushed: set[int] = set()
    early: list[int] = []
    real_push, real_arrived = StragglerBatcher.push, StragglerRows.arrived

    def push(self: Any, position: int, item: Any) -> None:
        real_push(self, position, item)
        pushed.add(position)

    def arrived(self: Any, position: int) -> None:
        if position not in pushed:
            early.append(position)
        real_arrived(self, position)

    monkeypatch.setattr(StragglerBatcher, "push", push)
    monkeypatch.setattr(StragglerRows, "arrived", arrived)
    loader = make(unique_list, batch_size=4, batching="straggler")
    assert sorted(labels_of(run_epoch(loader))) == list(range(len(unique_list)))
    assert len(pushed) == len(unique_list) and early == []
    loader.close()


def test_a_sample_decoding_into_its_batch_holds_it_until_it_is_a_straggler(
    unique_list: FileList, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Leaving behind a sample that decodes into its nominal batch's tensor would cost a
    # copy of the whole batch, so the batch waits for it while it is under the decode
    # stage's straggler limit (here a 10 s floor: never reached).
    import gpu_loader._epoch as epoch_module
    from gpu_loader.batching import AdaptiveThreshold

    slow_key = unique_list.key(20)  # position 20 (shuffle off): nominal batch 4 of 5
    real = epoch_module.load_into

    def slow_for_one(data: Any, *args: Any, key: str = "?", **kw: Any) -> Any:
        if key == slow_key:
            time.sleep(0.3)
        return real(data, *args, key=key, **kw)

    def threshold(self: Any, name: str) -> AdaptiveThreshold:
        return AdaptiveThreshold(floor_s=10.0)

    monkeypatch.setattr(epoch_module, "load_into", slow_for_one)
    monkeypatch.setattr(epoch_module.CpuEpoch, "straggler_threshold", threshold)
    options = gl.LoaderOptions(decode_threads=2, io_threads=2, max_delay_batches=2)
    loader = make(unique_list, batch_size=5, batching="straggler", shuffle=False, options=options)
    labels = labels_of(run_epoch(loader))
    assert sorted(labels) == list(range(len(unique_list)))
    assert labels.index(20) // 5 == 4  # delivered in its own batch: waited for


def test_no_thread_outlives_an_epoch_and_stats_stay_readable(unique_list: FileList) -> None:
    before = set(threading.enumerate())
    loader = make(unique_list, batch_size=16)
    for epoch in range(2):
        assert len(run_epoch(loader)) == 3
        for thread in set(threading.enumerate()) - before:
            thread.join(timeout=5)
        alive = [t.name for t in set(threading.enumerate()) - before if t.is_alive()]
        assert alive == [], f"epoch {epoch}: {alive}"
    stats = loader.stats()
    assert stats.samples == 2 * len(unique_list) and stats.batches == 6
    assert {s.name for s in stats.stages} >= {"read", "decode"}
    loader.close()  # as leaving `with loader:` does: the record of the run stays readable
    closed = loader.stats()
    assert (closed.samples, closed.batches) == (stats.samples, stats.batches)
    assert closed.samples_per_s > 0 and loader.stats() == closed
    run_epoch(loader)  # a loader used again after close() counts afresh
    assert loader.stats().samples == len(unique_list)


def test_waiting_for_the_training_loop_is_not_the_sources_work(unique_list: FileList) -> None:
    # A slow training step fills the in-flight window; the source then waits for room,
    # which must not make it look busy (it was named the bottleneck for it).
    loader = make(unique_list, batch_size=4, options=gl.LoaderOptions(prefetch_batches=1))
    for _ in loader:
        time.sleep(0.02)
    stats = loader.stats()
    source = next(s for s in stats.stages if s.name == "source")
    assert source.busy_fraction < 0.5 and source.blocked_output_s > 0.1
    assert stats.bottleneck == "training step"


def test_startup_is_the_whole_first_wait(unique_list: FileList) -> None:
    # Starting the epoch's threads is part of the training loop's first wait.
    loader = make(unique_list, options=gl.LoaderOptions(monitor_gpu=False))
    it = iter(loader)
    began = time.perf_counter()
    next(it)
    first = time.perf_counter() - began
    startup = loader.stats().startup_s
    assert startup is not None and 0.8 * first <= startup <= first
    loader.close()


def test_remote_sources_get_more_io_threads(unique_list: FileList) -> None:
    import fsspec

    fs = fsspec.filesystem("memory")
    fs.pipe("/remote/a.jpg", unique_list.read(0))
    remote = FileList([("memory://remote/a.jpg", 0)])
    assert make(remote).io_threads == 16
    assert make(unique_list).io_threads == 2


def test_cost_lookahead_starts_larger_files_first_within_blocks(unique_list: FileList) -> None:
    from gpu_loader._epoch import CpuEpoch
    from gpu_loader.batching import order_by_cost

    options = gl.LoaderOptions(cost_lookahead=8)
    loader = make(unique_list, seed=2, batching="straggler", options=options)
    epoch = CpuEpoch(loader, None)
    try:
        order = list(epoch.start_order())
    finally:
        epoch.close()
    indices = loader.sampler.indices()
    sizes = [float(unique_list.nbytes(int(indices[p])) or 0) for p in range(len(indices))]
    assert order == order_by_cost(list(range(len(indices))), sizes, 8)
    assert order != list(range(len(indices)))  # the photos differ in size
    # Every sample still arrives exactly once, with the lateness bound kept.
    batches = run_epoch(loader)
    assert sorted(labels_of(batches)) == list(range(len(unique_list)))
    assert loader.batching_stats() is not None and loader.batching_stats().overdue == 0


def test_a_log_path_through_a_symlink_and_dot_dot_is_taken(tmp_path: Path) -> None:
    # QA64: its folder was found by tidying "a/lnk/.." as text: refused as missing.
    (tmp_path / "real" / "deep").mkdir(parents=True)
    (tmp_path / "real" / "sub").mkdir()
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "lnk").symlink_to(tmp_path / "real" / "deep")
    options = gl.LoaderOptions(log_jsonl=f"{tmp_path}/a/lnk/../sub/log.jsonl")
    assert options.log_jsonl is not None


@pytest.mark.parametrize(
    ("field", "value", "match"),
    [
        ("log_interval_s", 0, "log_interval_s"),
        ("log_interval_s", float("nan"), "log_interval_s"),
        # A line every millisecond built a full stats() a thousand times a second.
        ("log_interval_s", 0.01, "at least 0.1"),
        ("log_jsonl", "/no/such/folder/stats.jsonl", "does not exist"),
        ("progress", "yes", "progress"),
        ("monitor_gpu", 1, "monitor_gpu"),
        ("pin_memory", "auto", "pin_memory"),
        ("samples_per_task", 0, "samples_per_task"),
        ("samples_per_task", True, "samples_per_task"),
        ("samples_per_task", 2.0, "samples_per_task"),
        ("decode_threads", True, "decode_threads"),
        # True passed as 1 (QA: `max_delay_batches=True` quietly meant 1).
        ("prefetch_batches", True, "prefetch_batches"),
        ("max_delay_batches", True, "max_delay_batches"),
        ("max_pixels", True, "max_pixels"),
        ("gpu_streams", True, "gpu_streams"),
        ("arena_bytes", 2.0**30, "arena_bytes"),
        # A folder was taken, and the run then went on with no log but a warning.
        ("log_jsonl", str(Path(__file__).parent), "is a folder"),
    ],
)
def test_options_are_checked_when_made(field: str, value: Any, match: str) -> None:
    # Not at the first batch, minutes into a run.
    with pytest.raises((TypeError, ValueError), match=match):
        gl.LoaderOptions(**{field: value})


class _Delegating:
    """A custom sample index: a FileList's methods, less those named in ``lacks``."""

    def __init__(self, inner: FileList, lacks: tuple[str, ...]) -> None:
        self.inner, self.lacks = inner, lacks

    def __len__(self) -> int:
        return len(self.inner)

    def __getattr__(self, name: str) -> Any:
        if name in self.lacks:
            raise AttributeError(name)
        return getattr(self.inner, name)


@pytest.mark.parametrize("lacks", [("fingerprint",), ("labels",), ("labels", "nbytes")])
def test_a_custom_source_without_what_the_loader_calls_is_refused_by_name(
    unique_list: FileList, lacks: tuple[str, ...]
) -> None:
    # Without `fingerprint`: a bare AttributeError; without `labels`: one at the first
    # batch, minutes into a run (QA).
    with pytest.raises(TypeError, match=f"_Delegating has no {', '.join(lacks)}$"):
        make(_Delegating(unique_list, lacks), batch_size=8)


def test_a_custom_source_needs_no_label_method(unique_list: FileList) -> None:
    # The loader delivers `labels`; a per-sample `label(i)` is the protocol's convenience.
    loader = make(_Delegating(unique_list, ("label", "classes")), batch_size=8)
    assert sorted(labels_of(run_epoch(loader))) == list(range(len(unique_list)))


def test_torch_dtypes_numpy_sizes_and_option_dicts(unique_list: FileList) -> None:
    loader = make(unique_list, batch_size=np.int64(8), dtype=torch.bfloat16)
    images, _ = next(iter(loader))
    assert images.dtype == torch.bfloat16 and images.shape[0] == 8 and loader.dtype == "bfloat16"
    assert type(loader.batch_size) is int  # saved in the JSON state
    loader.close()
    with pytest.raises(ValueError, match=r"`dtype` must be one of .* got torch.float64"):
        make(unique_list, dtype=torch.float64)
    with pytest.raises(ValueError, match="`batch_size` must be an int >= 1, got True"):
        make(unique_list, batch_size=True)
    with pytest.raises(TypeError, match=r"LoaderOptions\(\*\*your_dict\)"):
        make(unique_list, options={"decode_threads": 2})


def test_dataloader_habits_get_answers_not_generic_errors(unique_list: FileList) -> None:
    # A training script moved over from DataLoader passes its arguments and reads its
    # attributes: each refusal names what takes its place.
    with pytest.raises(TypeError, match=r"no `num_workers` .*LoaderOptions\(decode_threads=n\)"):
        make(unique_list, num_workers=4)
    with pytest.raises(TypeError, match=r"no `pin_memory_device` .*batches arrive on `device`"):
        make(unique_list, pin_memory_device="cuda")  # QA65: the generic "unexpected"
    with pytest.raises(TypeError, match=r"no `collate_fn` .*; no `pin_memory` .*pin_memory=True"):
        make(unique_list, collate_fn=None, pin_memory=True)
    with pytest.raises(TypeError, match=r"no `timeout` .*LoaderOptions\(batch_timeout_s="):
        make(unique_list, timeout=30)
    with pytest.raises(TypeError, match="unexpected keyword argument 'batchsize'"):
        make(unique_list, batchsize=8)
    # QA65: a list of pairs, or a map-style Dataset, was refused without the way in.
    pairs = [(unique_list.key(i), i) for i in range(len(unique_list))]
    with pytest.raises(TypeError, match=r"pairs goes in gpu_loader\.sources\.FileList\(pairs\)"):
        make(pairs)

    class MapStyle(torch.utils.data.Dataset[Any]):
        def __len__(self) -> int:
            return len(pairs)

        def __getitem__(self, i: int) -> Any:
            return pairs[i]

    with pytest.raises(TypeError, match=r"FileList\(dataset\.samples\) for a torchvision"):
        make(MapStyle())
    for name in ("shuffle", "drop_last"):  # "False" is a true string
        with pytest.raises(TypeError, match=f"`{name}` must be True or False, got 'False'"):
            make(unique_list, **{name: "False"})
    # Unlike DataLoader, shuffled unless asked not to (documented in the README).
    assert make(unique_list).shuffle is True
    assert list(make(unique_list).sampler) != list(range(len(unique_list)))
    loader = make(unique_list, shuffle=np.bool_(False), seed=3)
    assert loader.dataset is unique_list and len(loader.dataset) == len(unique_list)
    assert list(loader.sampler) == list(range(len(unique_list)))  # not shuffled
    assert loader.seed == 3 and loader.shuffle is False
    # Set after the build, the seed moved the crops but not the shuffle: refused.
    with pytest.raises(AttributeError, match="seed is fixed"):
        loader.seed = 5  # type: ignore[misc]
    with pytest.raises(AttributeError, match="shuffle is fixed"):
        loader.shuffle = True  # type: ignore[misc]
    # QA65: batch_size took effect at the next epoch, quietly; DataLoader refuses it.
    with pytest.raises(AttributeError, match="batch_size is fixed"):
        loader.batch_size = 4  # type: ignore[misc]
    with pytest.raises(AttributeError, match="drop_last is fixed"):
        loader.drop_last = True  # type: ignore[misc]
    assert loader.batch_size == 8 and loader.drop_last is False
    text = repr(loader)
    assert text.startswith(f"ImageLoader({unique_list!r}, batch_size=8,")
    assert "shuffle=False" in text and f"{len(loader)} batches" in text
    shuffled = make(unique_list, seed=3)
    assert sorted(shuffled.sampler) == list(range(len(unique_list)))
    assert list(shuffled.sampler) == shuffled.sampler.indices().tolist() != sorted(shuffled.sampler)


def test_a_batch_larger_than_memory_is_refused_up_front(unique_list: FileList) -> None:
    # Allocated by each batch's first sample, its error was recorded against every file.
    with pytest.raises(ValueError, match=r"one batch of 8 x 3 x 100000 x 100000 float32 needs"):
        make(unique_list, transform=TrainTransform(100_000))
    make(unique_list, transform=TrainTransform(2048), dtype="uint8").close()


def test_pin_memory_on_the_cpu_device_pins_only_where_cuda_is(
    unique_list: FileList, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def pinned(pin: bool | None) -> gl.ImageLoader:
        return make(unique_list, batch_size=4, options=gl.LoaderOptions(pin_memory=pin))

    with caplog.at_level("WARNING", logger="gpu_loader"):
        loader = pinned(True)  # no CUDA here: told, and the batches still come
    assert "pin_memory=True has no effect" in caplog.text
    images, _ = next(iter(loader))
    assert not images.is_pinned()
    loader.close()
    # Where torch sees a GPU, True pins the device="cpu" batches (as DataLoader's
    # pin_memory does) and None does not; pinning itself needs a real GPU to run.
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert pinned(True)._pin_batches() and not pinned(None)._pin_batches()


def test_cost_lookahead_is_validated_and_ignored_in_ordered_mode(unique_list: FileList) -> None:
    with pytest.raises(ValueError, match="cost_lookahead"):
        gl.LoaderOptions(cost_lookahead=-1)
    with pytest.raises(ValueError, match="at most"):
        make(unique_list, batch_size=4, options=gl.LoaderOptions(cost_lookahead=17))
    from gpu_loader._epoch import CpuEpoch

    loader = make(unique_list, options=gl.LoaderOptions(cost_lookahead=8))
    epoch = CpuEpoch(loader, None)
    try:
        assert list(epoch.start_order()) == list(range(len(unique_list)))
    finally:
        epoch.close()


def test_ordered_runs_take_fewer_calls_and_a_window_smaller_than_a_run_still_moves(
    unique_list: FileList,
) -> None:
    n = len(unique_list)
    calls = {}
    for per_task in (1, 8):
        loader = make(unique_list, options=gl.LoaderOptions(samples_per_task=per_task))
        assert sorted(labels_of(run_epoch(loader))) == list(range(n))
        calls[per_task] = {s.name: s.tasks_done for s in loader.stats().stages}
    assert calls[1]["decode"] == calls[1]["read"] == n
    # Runs end early only where the window is full, so most calls carry 8 samples.
    assert n / 8 <= calls[8]["decode"] < n / 2 and n / 8 <= calls[8]["read"] < n / 2
    # A window of 4 samples (batch 2, one batch ahead, no lateness) against runs of 8: a
    # run in the making goes out when the window fills, or no batch could ever complete.
    small = gl.LoaderOptions(samples_per_task=8, prefetch_batches=1, max_delay_batches=0)
    loader = make(unique_list, batch_size=2, options=small)
    assert sorted(labels_of(run_epoch(loader))) == list(range(n))


def test_straggler_mode_runs_as_many_samples_per_call_as_asked(unique_list: FileList) -> None:
    n = len(unique_list)
    calls = {}
    for per_task in (1, 4):
        options = gl.LoaderOptions(samples_per_task=per_task)
        loader = make(unique_list, batching="straggler", options=options)
        assert sorted(labels_of(run_epoch(loader))) == list(range(n))
        calls[per_task] = {s.name: s.tasks_done for s in loader.stats().stages}
    assert calls[1]["decode"] == calls[1]["read"] == n
    assert n / 4 <= calls[4]["decode"] < n / 2 and n / 4 <= calls[4]["read"] < n / 2


def decodes_take(monkeypatch: pytest.MonkeyPatch, seconds: Callable[[str], float]) -> None:
    """Every decode first waits ``seconds(key)``."""
    import gpu_loader._epoch as epoch_module

    real = epoch_module.load_into

    def decode(data: Any, *args: Any, key: str = "?", **kw: Any) -> Any:
        time.sleep(seconds(key))
        return real(data, *args, key=key, **kw)

    monkeypatch.setattr(epoch_module, "load_into", decode)


class ReadsWait(FileList):
    """A FileList whose reads of every tenth index wait ``slow_s`` first."""

    def __init__(self, photo_dir: Path, slow_s: float) -> None:
        super().__init__([(str(p), i) for i, p in enumerate(image_files(photo_dir))])
        self.slow_s = slow_s

    def read(self, i: int) -> bytes:
        if i % 10 == 0:
            time.sleep(self.slow_s)
        return super().read(i)


@pytest.mark.parametrize("slow_read_s", [0.0, 0.12])
def test_straggler_mode_runs_only_while_no_read_outlasts_decoding_a_run(
    photo_dir: Path, monkeypatch: pytest.MonkeyPatch, slow_read_s: float
) -> None:
    # Decodes of ~5 ms and runs of up to 4: runs once it has seen enough (here 16
    # samples, kept from one epoch to the next), unless reads of 120 ms make the slow
    # lane's single-sample moves worth their cost.
    from gpu_loader._run_sizer import RunSizer

    decodes_take(monkeypatch, lambda key: 0.005)
    source = ReadsWait(photo_dir, slow_read_s)
    n = len(source)
    options = gl.LoaderOptions(decode_threads=2, io_threads=2)
    loader = make(source, batching="straggler", options=options)
    assert loader._most_per_task() == 4
    loader._sizer = RunSizer(4, min_samples=16)
    calls = []
    for _ in range(2):
        assert sorted(labels_of(run_epoch(loader))) == list(range(n))
        calls.append({s.name: s.tasks_done for s in loader.stats().stages}["decode"])
    if slow_read_s:
        assert calls == [n, n]
    else:
        assert calls[0] < n and n / 4 <= calls[1] < n / 2


class EveryReadWaits(FileList):
    """A FileList whose every read first waits ``seconds``."""

    def __init__(self, items: list[tuple[str, int]], seconds: float) -> None:
        super().__init__(items)
        self.seconds = seconds

    def read(self, i: int) -> bytes:
        time.sleep(self.seconds)
        return super().read(i)


@pytest.mark.parametrize("read_wait_s", [0.0, 0.004])
def test_ordered_mode_grows_its_runs_while_samples_are_cheap(
    unique_list: FileList, monkeypatch: pytest.MonkeyPatch, read_wait_s: float
) -> None:
    # Cheap samples (here: any, with a whole second of CPU as the run's aim) go in runs
    # past the base of 8, up to the cap the window and the I/O threads allow, from the
    # second epoch on (the lengths are kept); reads that wait 4 ms each, with 25 ms
    # allowed for a run's reads in turn, keep the base. Every sample exactly once either
    # way. (With 10 ms allowed, a loaded CI machine's reads that do not wait averaged over
    # the 0.625 ms that 16 of them may take.)
    from gpu_loader import _run_sizer

    monkeypatch.setattr(_run_sizer, "RUN_CPU_S", 1.0)
    monkeypatch.setattr(_run_sizer, "RUN_READ_WALL_S", 0.025)
    items = [(unique_list.key(i % len(unique_list)), i) for i in range(4 * len(unique_list))]
    n = len(items)
    options = gl.LoaderOptions(decode_threads=2, io_threads=2)
    loader = make(EveryReadWaits(items, read_wait_s), batch_size=32, options=options)
    base, cap = loader._most_per_task(), loader._most_per_task(_run_sizer.MOST_LONG)
    assert (base, cap) == (8, 16)  # window 160 // (2 x 4 threads) = 20; 32 // 2 I/O = 16
    calls = []
    for _ in range(2):
        assert sorted(labels_of(run_epoch(loader))) == list(range(n))
        calls.append({s.name: s.tasks_done for s in loader.stats().stages})
    lengths = loader._length
    assert lengths is not None
    if read_wait_s:
        assert lengths.size() == base
        assert calls[1]["read"] >= n / base and calls[1]["decode"] >= n / base
    else:
        assert lengths.size() == cap
        # A run goes out short when the window is full; most are whole.
        assert n / cap <= calls[1]["decode"] < n / base
    loader.close()


@pytest.mark.parametrize("batching", ["ordered", "straggler"])
def test_a_runs_jpegs_are_decoded_in_one_call_with_the_same_pixels(
    bad_list: tuple[FileList, set[str]], monkeypatch: pytest.MonkeyPatch, batching: str
) -> None:
    # Each sample of a decode run is prepared (straggler mode: placed in its rows first),
    # then the run's JPEGs are decoded in one C call (one release of the GIL); PNGs and
    # bad files take their own way within the run. Every sample equals one sample per
    # call's bit for bit (ordered mode: the batches too), and every bad file is reported
    # with its key, none delivered.
    import gpu_loader._epoch as epoch_module

    source, bad_keys = bad_list
    real, calls = epoch_module.load_prepared, []

    def counted(jobs: Any) -> Any:
        calls.append(len(jobs))
        return real(jobs)

    monkeypatch.setattr(epoch_module, "load_prepared", counted)
    options = gl.LoaderOptions(io_threads=2, decode_threads=2)
    batches = {}
    for per_task in (8, 1):  # 8 by hand: straggler mode's sizer may choose 1 (timing)
        loader = make(
            source,
            batch_size=16,
            shuffle=False,
            on_error="skip",
            max_failures=None,
            batching=batching,
            options=dataclasses.replace(options, samples_per_task=per_task),
        )
        batches[per_task] = [run_epoch(loader) for _ in range(2)]
        assert {f.key for f in loader.failed_samples()} == bad_keys
        loader.close()
    assert calls and max(calls) > 1  # runs of JPEGs went in single calls
    good = [source.label(i) for i in range(len(source)) if source.key(i) not in bad_keys]
    for a, b in zip(batches[8], batches[1], strict=True):
        assert sorted(labels_of(a)) == sorted(good)  # each good sample once, no bad one
        if batching == "ordered":
            assert [y.tolist() for _, y in a] == [y.tolist() for _, y in b]
        by_label = {int(v): x[r] for x, y in b for r, v in enumerate(y)}
        assert all(torch.equal(x[r], by_label[int(v)]) for x, y in a for r, v in enumerate(y))


def test_a_runs_local_files_are_read_in_one_call(
    bad_list: tuple[FileList, set[str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Once reads are measured short (`RunLength`: on with batches of 32 on two I/O
    # threads), a read run's local files go in one native call (one release of the GIL);
    # a missing file among them fails alone, with its key. Ordered mode: straggler mode
    # reads the same way, but only while its run sizer has runs on, which timing decides.
    from gpu_loader.sources import _io

    if gl.ops.cpu_backend() != "native":
        pytest.skip("the native extension is not built")
    source, bad_keys = bad_list
    real, calls = _io.read_local_files, []

    def counted(keys: Any, paths: Any) -> Any:
        calls.append(len(keys))
        return real(keys, paths)

    monkeypatch.setattr(_io, "read_local_files", counted)
    # Whatever this machine's load: the call itself is under test, not when it is worth it.
    monkeypatch.setattr("gpu_loader._run_sizer.RUN_READ_WALL_S", 1.0)
    options = gl.LoaderOptions(io_threads=2, decode_threads=2)
    loader = make(
        source, batch_size=32, shuffle=False, on_error="skip", max_failures=None,
        options=options,
    )  # fmt: skip
    assert loader._run_length() is not None
    good = [source.label(i) for i in range(len(source)) if source.key(i) not in bad_keys]
    for _ in range(3):
        assert sorted(labels_of(run_epoch(loader))) == sorted(good)
        assert {f.key for f in loader.failed_samples(loader.epoch)} == bad_keys
    loader.close()
    assert calls and max(calls) > 1
    missing = next(f for f in loader.failed_samples() if f.key.endswith("missing.jpg"))
    assert missing.stage == "read" and "not found" in missing.error


def test_a_runs_tar_members_are_read_in_one_call(
    unique_list: FileList, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # As a folder's files: a run's members of local tar shards go in one native call,
    # every sample once, with the pixels of one read per call (ordered mode, as above).
    from gpu_loader.sources import TarShards, _io
    from tests.sources._data import shard_bytes

    if gl.ops.cpu_backend() != "native":
        pytest.skip("the native extension is not built")
    members = [
        (f"{i:04d}", "jpg", Path(unique_list.key(i)).read_bytes(), unique_list.label(i))
        for i in range(len(unique_list))
        if unique_list.key(i).endswith(".jpg")
    ]
    paths = []
    for s in range(2):
        paths.append(tmp_path / f"train-{s}.tar")
        paths[-1].write_bytes(shard_bytes(members[s::2]))
    real, calls = _io.read_local_ranges, []

    def counted(keys: Any, *rest: Any) -> Any:
        calls.append(len(keys))
        return real(keys, *rest)

    monkeypatch.setattr(_io, "read_local_ranges", counted)
    monkeypatch.setattr("gpu_loader._run_sizer.RUN_READ_WALL_S", 1.0)  # as above
    options = gl.LoaderOptions(io_threads=2, decode_threads=2)
    batches = {}
    for per_task in (None, 1):
        loader = make(
            TarShards([str(p) for p in paths]), batch_size=32, shuffle=False,
            options=dataclasses.replace(options, samples_per_task=per_task),
        )  # fmt: skip
        batches[per_task] = [run_epoch(loader) for _ in range(3)]
        loader.close()
    assert calls and max(calls) > 1
    labels = sorted(label for *_, label in members)
    for a, b in zip(batches[None], batches[1], strict=True):
        assert sorted(labels_of(a)) == labels
        by_label = {int(v): x[r] for x, y in b for r, v in enumerate(y)}
        assert all(torch.equal(x[r], by_label[int(v)]) for x, y in a for r, v in enumerate(y))


def test_a_runs_first_bad_file_is_the_one_raise_mode_names(photo_dir: Path, tmp_path: Path) -> None:
    # QA73: a file failing on its header was recorded before a JPEG failing in the run's
    # one decode call before it, so on_error="raise" named the later file (10 of 10).
    good = [str(p) for p in image_files(photo_dir) if p.suffix == ".jpg"]
    data = Path(good[0]).read_bytes()
    scan = data.index(b"\xff\xda")  # its header whole, garbage in the entropy data
    corrupt = tmp_path / "corrupt.jpg"
    corrupt.write_bytes(data[: scan + 14] + bytes(range(256)) * 8 + b"\xff\xd9")
    text = tmp_path / "text.jpg"
    text.write_bytes(b"not an image at all" * 10)
    items = [(k, i) for i, k in enumerate(good[:16])]
    items[4], items[6] = (str(corrupt), 4), (str(text), 6)
    options = gl.LoaderOptions(io_threads=1, decode_threads=1, samples_per_task=8)
    for _ in range(3):
        loader = make(FileList(items), batch_size=8, shuffle=False, options=options)
        with pytest.raises(gl.PipelineFailure, match=r"First: .*corrupt"):
            run_epoch(loader)
        loader.close()


def test_large_jpegs_are_decoded_one_by_one_within_a_run(
    unique_list: FileList, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A run's one decode call cannot stop midway: only small JPEGs wait for it, so a run
    # of large ones cannot hold close() for all of them (QA73: 0.3-0.8 s).
    import gpu_loader._epoch as epoch_module

    real, real_one, calls = epoch_module.load_prepared, epoch_module.decode_prepared, []

    def counted(jobs: Any) -> Any:
        calls.append(len(jobs))
        return real(jobs)

    def counted_one(job: Any) -> Any:
        calls.append(1)
        return real_one(job)

    monkeypatch.setattr(epoch_module, "load_prepared", counted)
    monkeypatch.setattr(epoch_module, "decode_prepared", counted_one)
    options = gl.LoaderOptions(samples_per_task=8)
    expected = run_epoch(make(unique_list, shuffle=False, options=options))
    assert max(calls) > 1
    calls.clear()
    monkeypatch.setattr(epoch_module, "AT_ONCE_MOST_PIXELS", 0)  # every JPEG is "large"
    got = run_epoch(make(unique_list, shuffle=False, options=options))
    assert calls and set(calls) == {1}
    assert all(torch.equal(x, y) for (x, _), (y, _) in zip(expected, got, strict=True))


def test_samples_per_task_keeps_its_run_size_and_straggler_mode_its_sizers(
    unique_list: FileList,
) -> None:
    set_by_hand = make(unique_list, options=gl.LoaderOptions(samples_per_task=4))
    assert set_by_hand._run_length() is None and set_by_hand._samples_per_task() == 4
    by_hand = make(unique_list, batching="straggler", options=gl.LoaderOptions(samples_per_task=4))
    assert by_hand._run_length() is None and by_hand._run_sizer() is None
    # Straggler mode's lengths are its sizer's, which follows them while runs are on.
    options = gl.LoaderOptions(io_threads=2, decode_threads=2)
    straggler = make(unique_list, batch_size=32, batching="straggler", options=options)
    sizer = straggler._run_sizer()
    assert sizer is not None and sizer.lengths is not None
    assert straggler._run_length() is sizer.lengths and (sizer.most, sizer.lengths.cap) == (8, 16)
    # A batch of 8 on one I/O thread leaves no room past the base: nothing to grow.
    small = make(unique_list, options=gl.LoaderOptions(io_threads=1, decode_threads=1))
    assert small._most_per_task() == small._most_per_task(64) and small._run_length() is None


def test_a_fresh_loaders_first_window_goes_in_runs_once_its_reads_are_judged_fast(
    unique_list: FileList, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Without the early verdict, the source filled the whole in-flight window one
    # sample per call before the run sizer had measured anything (at twice the CPU per
    # image, right when the training loop waits for its first batches).
    from gpu_loader import _run_sizer

    decodes_take(monkeypatch, lambda key: 0.005)
    items = [(unique_list.key(i % len(unique_list)), i) for i in range(4 * len(unique_list))]
    n = len(items)
    options = gl.LoaderOptions(decode_threads=2, io_threads=2)
    loader = make(FileList(items), batch_size=16, batching="straggler", options=options)
    most, window = loader._most_per_task(), loader._window()
    assert most == 8 and window >= 2 * _run_sizer.PROBE  # else this test shows nothing
    assert sorted(labels_of(run_epoch(loader))) == list(range(n))
    calls = {s.name: s.tasks_done for s in loader.stats().stages}
    assert loader._sizer is not None and loader._sizer.early == most
    # One call per sample while the probe's window (32 samples) is in flight, runs after.
    assert calls["read"] <= 2 * _run_sizer.PROBE + (n - _run_sizer.PROBE) // most
    assert calls["read"] < window  # the first window alone cost `window` calls before
    loader.close()


class FirstReadWaits(FileList):
    """A FileList whose read of index 0 waits for ``release``."""

    def __init__(self, items: list[tuple[str, int]]) -> None:
        super().__init__(items)
        self.release = threading.Event()

    def read(self, i: int) -> bytes:
        if i == 0:
            assert self.release.wait(30)
        return super().read(i)


def test_a_read_still_running_turns_runs_off_before_it_ends(unique_list: FileList) -> None:
    # The first reads to finish are the fast ones: the early verdict also counts the
    # probe's reads that are still running, so it does not wait for a slow read to end.
    source = FirstReadWaits([(unique_list.key(i), i) for i in range(len(unique_list))])
    options = gl.LoaderOptions(decode_threads=2, io_threads=2)
    loader = make(source, batch_size=4, batching="straggler", shuffle=False, options=options)
    got: list[int] = []
    consumer = threading.Thread(target=lambda: got.extend(labels_of(run_epoch(loader))))
    consumer.start()
    try:
        deadline = time.monotonic() + 20
        while (loader._sizer is None or loader._sizer.early is None) and (
            time.monotonic() < deadline
        ):
            time.sleep(0.005)
        assert not source.release.is_set()
        assert loader._sizer is not None and loader._sizer.early == 1
    finally:
        source.release.set()
        consumer.join(30)
    assert sorted(got) == list(range(len(unique_list)))
    loader.close()


@pytest.mark.parametrize("per_task", [4, None])
def test_a_slow_decode_in_a_run_holds_its_run_mates_no_longer_than_a_straggler(
    unique_list: FileList, monkeypatch: pytest.MonkeyPatch, per_task: int | None
) -> None:
    # A run's decoded samples reach the batcher only when the run ends: behind a slow
    # decode they held their batch for all of it (1.5 s here), where one sample per call
    # moves the slow one once it passes the per-sample straggler limit (~20 ms).
    slow_key = unique_list.key(2)  # position 2 (shuffle off): nominal batch 0
    slow = {"on": False}
    decodes_take(monkeypatch, lambda key: 1.5 if slow["on"] and key == slow_key else 0.005)
    options = gl.LoaderOptions(
        samples_per_task=per_task, io_threads=1, decode_threads=2, max_delay_batches=6
    )
    loader = make(unique_list, batch_size=4, batching="straggler", shuffle=False, options=options)
    run_epoch(loader)  # two epochs teach the thresholds (and the sizer) the 5 ms decodes
    run_epoch(loader)
    if per_task is None:
        assert loader._sizer is not None and loader._sizer.size() == 4
    slow["on"] = True
    began = time.perf_counter()
    batches = iter(loader)
    first = next(batches)
    waited = time.perf_counter() - began
    rest = list(batches)
    assert sorted(labels_of([first, *rest])) == list(range(len(unique_list)))
    assert waited < 0.75, waited


@pytest.mark.parametrize("lookahead", [0, 8])
def test_cost_aware_start_order_keeps_one_sample_per_call(
    unique_list: FileList, monkeypatch: pytest.MonkeyPatch, lookahead: int
) -> None:
    # Its start order puts a block's largest files next to each other: runs would decode
    # them on one thread, one after another. (5 ms decodes: the sizer would pick runs.)
    decodes_take(monkeypatch, lambda key: 0.005)
    n = len(unique_list)
    options = gl.LoaderOptions(cost_lookahead=lookahead, io_threads=1, decode_threads=2)
    loader = make(unique_list, batch_size=4, batching="straggler", options=options)
    for _ in range(3):  # the last one past the sizer's warm-up
        assert sorted(labels_of(run_epoch(loader))) == list(range(n))
    calls = {s.name: s.tasks_done for s in loader.stats().stages}["decode"]
    assert calls == n if lookahead else calls < n


def _with_holes(
    photo_dir: Path, tmp_path: Path, n: int, missing: set[int], corrupt: set[int]
) -> FileList:
    good = str(image_files(photo_dir)[0])
    (tmp_path / "bad.jpg").write_bytes(b"not an image")
    items = []
    for i in range(n):
        path = str(tmp_path / f"gone{i}.jpg") if i in missing else good
        items.append((str(tmp_path / "bad.jpg") if i in corrupt else path, i))
    return FileList(items)


def test_a_failure_rate_under_max_failures_never_stops_runs(
    photo_dir: Path, tmp_path: Path
) -> None:
    # 3 of 400 reads fail, under the default 1% at every point (1 of 151, 2 of 261, 3 of
    # 391). Samples run up to the window (160) ahead of the training loop: the rate counts
    # what each stage has finished, not what the training loop has been handed (2 of ~100).
    source = _with_holes(photo_dir, tmp_path, 400, missing={150, 260, 390}, corrupt=set())
    options = gl.LoaderOptions(samples_per_task=8, io_threads=1, decode_threads=1)
    loader = make(source, batch_size=32, shuffle=False, options=options)
    labels = []
    for _, y in loader:
        labels += y.tolist()
        time.sleep(0.02)  # a training step: the window fills ahead of it
    assert len(labels) == 397 and len(loader.failed_samples()) == 3


@pytest.mark.parametrize("per_task", [1, 4])
def test_an_int_max_failures_counts_every_stage_together(
    photo_dir: Path, tmp_path: Path, per_task: int
) -> None:
    # Counted per stage only, 2 unreadable and 1 undecodable file went through
    # max_failures=2 (each stage within it), and the GPU path, which splits bad files
    # between other stages, stopped where this one did not.
    options = gl.LoaderOptions(samples_per_task=per_task)
    source = _with_holes(photo_dir, tmp_path, 64, missing={30}, corrupt={12})
    loader = make(source, max_failures=2, shuffle=False, options=options)
    assert len(labels_of(run_epoch(loader))) == 62  # 1 read and 1 decode failure: within
    assert Counter(f.stage for f in loader.failed_samples()) == {"read": 1, "decode": 1}
    loader = make(
        _with_holes(photo_dir, tmp_path, 64, missing={5, 30}, corrupt={12}),
        max_failures=2,
        shuffle=False,
        options=options,
    )
    with pytest.raises(PipelineFailure, match=r"\(3 samples failed: read 2, decode 1\)") as info:
        run_epoch(loader)
    assert info.value.limit_reached
    assert len(info.value.exceptions) == 3
    assert Counter(f.stage for f in loader.failed_samples()) == {"read": 2, "decode": 1}


@pytest.mark.parametrize("batching", ["ordered", "straggler"])
def test_a_rate_max_failures_is_judged_over_the_epochs_samples(
    bad_list: tuple[FileList, set[str]], batching: str
) -> None:
    # 5 bad files of 35: 1 of 35 reads and 4 of 34 decodes fail, each stage under 13%,
    # the epoch (14.3%) over it, which the epoch's end judges.
    source, _ = bad_list
    delivered = 0
    loader = make(source, max_failures=0.13, batching=batching, shuffle=False)
    with pytest.raises(PipelineFailure, match=r"0.13 \(5 of 35 samples failed: read 1, decode 4\)"):
        for _, labels in loader:
            delivered += len(labels)
    # Judged once every sample is done with, which may be before any batch is delivered.
    assert delivered <= 30
    loader = make(source, max_failures=0.15, batching=batching, shuffle=False)
    assert len(labels_of(run_epoch(loader))) == 30


@pytest.mark.parametrize("batching", ["ordered", "straggler"])
def test_a_rate_within_max_failures_never_stops_a_loader_running_ahead(
    photo_dir: Path, batching: str
) -> None:
    # 25% of the files are missing, against max_failures=0.3. The rate was judged over
    # the samples delivered, but the loader decodes a window ahead of the training loop
    # and a failure counts at once: the epoch stopped after 48 samples, "66 of 114
    # samples failed" (QA56).
    good = [str(p) for p in image_files(photo_dir)]
    items = [
        (str(photo_dir / f"missing-{i}.jpg") if i % 4 == 3 else good[i % len(good)], 0)
        for i in range(1000)
    ]
    loader = make(
        FileList(items), batch_size=64, max_failures=0.3, batching=batching, shuffle=False
    )
    delivered = 0
    for _, labels in loader:
        delivered += len(labels)
        time.sleep(0.01)  # a training step: the window fills ahead of it
    assert delivered == 750 and len(loader.failed_samples()) == 250


def test_closing_ends_a_run_of_slow_reads_after_the_current_one(unique_list: FileList) -> None:
    started: list[float] = []

    class SlowReads(FileList):
        def read(self, index: int) -> bytes:
            started.append(time.perf_counter())
            time.sleep(0.05)
            return super().read(index)

    source = SlowReads([(unique_list.key(i), i) for i in range(len(unique_list))])
    options = gl.LoaderOptions(samples_per_task=8, io_threads=2)
    loader = make(source, batch_size=8, options=options)
    it = iter(loader)
    next(it)
    closing = time.perf_counter()
    loader.close()
    # Each I/O thread finishes the read it is in and starts no other of its run.
    assert sum(t > closing for t in started) <= 2


def test_bicubic_interpolation_reaches_every_sample(unique_list: FileList) -> None:
    from gpu_loader.ops import load_into

    sharp = EvalTransform(SIZE, interpolation="bicubic")
    plain = {
        int(y): x.clone()
        for xs, ys in make(unique_list, shuffle=False)
        for x, y in zip(xs, ys, strict=True)
    }
    differ = 0
    for images, labels in make(unique_list, transform=sharp, shuffle=False):
        for image, label in zip(images, labels.tolist(), strict=True):
            out = np.empty((3, SIZE, SIZE), np.float32)
            data = Path(unique_list.key(label)).read_bytes()
            load_into(data, sharp, np.random.default_rng(0), out, dtype="float32")
            np.testing.assert_array_equal(image.numpy(), out)
            differ += not torch.equal(image, plain[label])
    assert differ > len(unique_list) // 2


def test_a_failure_rate_counts_other_threads_runs_in_progress(
    unique_list: FileList, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A failure's rate was taken over finished runs plus its own run's samples, so with
    # several threads it read "102 of 100 calls failed" and could trip max_failures early.
    from gpu_loader.pipeline._errors import FailurePolicy

    seen: list[tuple[str, int, int]] = []
    record, check = FailurePolicy.record, FailurePolicy._check
    given = threading.local()  # the `calls` a failure came with, before any clamp

    def spy_record(self: FailurePolicy, failure: Any, calls: int) -> Any:
        given.calls = calls
        return record(self, failure, calls)

    def spy_check(self: FailurePolicy, calls: int, *, final: bool) -> Any:
        # Under the policy's lock: the failures as the limit counts them (read after
        # `record` returned, another thread's could already be in: flaky, seen in CI).
        if not final and calls > 0:  # 0: check_start, before the first sample
            seen.append((self._stage, len(self._records), given.calls))
        return check(self, calls, final=final)

    monkeypatch.setattr(FailurePolicy, "record", spy_record)
    monkeypatch.setattr(FailurePolicy, "_check", spy_check)

    def slow_failure(image: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        time.sleep(0.004)  # both decode threads are inside a run when they fail
        raise ValueError("refused")

    options = gl.LoaderOptions(samples_per_task=8, decode_threads=2)
    loader = make(unique_list, augment=slow_failure, max_failures=None, options=options)
    assert labels_of(run_epoch(loader)) == []
    assert len(seen) == len(unique_list) and {stage for stage, _, _ in seen} == {"decode"}
    # Two decode threads: one may number its call before the other's failure and record
    # after it, one behind (the policy then counts calls as failures). Counting finished
    # runs only was a whole run (8 samples) behind.
    assert all(failed <= calls + 1 for _, failed, calls in seen), seen
    assert max(calls for _, _, calls in seen) == len(unique_list)


def test_an_augment_failure_counts_as_augment_against_max_failures(photo_dir: Path) -> None:
    # The limit's message counted augment's failures as decode's, while failed_samples()
    # and the note said augment (QA56).
    def refuse(image: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        raise RuntimeError("augment says no")

    items = FileList([(str(p), 0) for p in image_files(photo_dir)[:16]])
    for per_task in (1, 4):
        options = gl.LoaderOptions(samples_per_task=per_task)
        loader = make(items, augment=refuse, max_failures=3, shuffle=False, options=options)
        with pytest.raises(PipelineFailure, match=r"samples failed: augment \d+\)"):
            run_epoch(loader)
        assert {f.stage for f in loader.failed_samples()} == {"augment"}


@pytest.mark.parametrize("per_task", [1, 4])
def test_the_limit_names_the_first_bad_file_in_epoch_order(
    photo_dir: Path, tmp_path: Path, per_task: int
) -> None:
    # The causes came stage by stage, reads first: a missing file at position 30 was
    # named before the corrupt one at position 0 (QA57).
    good = str(image_files(photo_dir)[0])
    items = []
    for i in range(40):
        path = good
        if i in (0, 35):
            (tmp_path / f"bad{i}.jpg").write_bytes(b"not an image")
            path = str(tmp_path / f"bad{i}.jpg")
        elif i == 30:
            path = str(tmp_path / "gone.jpg")
        items.append((path, i))
    options = gl.LoaderOptions(samples_per_task=per_task)
    loader = make(FileList(items), max_failures=2, shuffle=False, options=options)
    with pytest.raises(PipelineFailure) as info:
        run_epoch(loader)
    first = str(tmp_path / "bad0.jpg")
    assert f"First: {first} (decode: " in " ".join(getattr(info.value, "__notes__", []))
    assert f"sample: {first}" in " ".join(getattr(info.value.exceptions[0], "__notes__", []))
