"""`ImageLoader(sampler=...)`: the order of a sampler of the user's, as DataLoader takes one."""

from __future__ import annotations

import itertools
import json
from collections import Counter
from typing import Any

import pytest
import torch
from torch.utils.data import DistributedSampler, RandomSampler

import gpu_loader as gl
from gpu_loader.ops import TrainTransform
from gpu_loader.sources import FileList

SIZE = 16


def make(source: Any, **kw: Any) -> gl.ImageLoader:
    kw.setdefault("batch_size", 4)
    kw.setdefault("transform", TrainTransform(SIZE))
    return gl.ImageLoader(source, **kw)


def labels(loader: gl.ImageLoader) -> list[int]:
    return [int(v) for _, y in loader for v in y]


def test_batches_follow_the_samplers_order_repeats_included(unique_list: FileList) -> None:
    order = [5, 3, 3, 7, 0, 41, 3, 12, 9]
    loader = make(unique_list, sampler=order)
    assert len(loader) == 3 and loader.shuffle is False
    images: list[torch.Tensor] = []
    got = []
    for x, y in loader:
        images += list(x)
        got += y.tolist()
    assert got == order  # the fixture's labels are the indices
    # Each repeat of a sample has its own crop and flip (its stream is its place).
    threes = [images[i] for i, label in enumerate(got) if label == 3]
    assert len(threes) == 3
    assert not torch.equal(threes[0], threes[1]) and not torch.equal(threes[1], threes[2])


@pytest.mark.parametrize("batching", ["ordered", "straggler"])
def test_a_distributed_sampler_gives_each_rank_its_share_each_epoch(
    unique_list: FileList, batching: str
) -> None:
    def sampler(rank: int) -> DistributedSampler[int]:
        return DistributedSampler(unique_list, num_replicas=2, rank=rank, shuffle=True, seed=7)

    loaders = [make(unique_list, sampler=sampler(r), batching=batching) for r in (0, 1)]
    epochs = []
    for epoch in range(2):
        both = []
        for rank, loader in enumerate(loaders):
            loader.set_epoch(epoch)
            expected = sampler(rank)
            expected.set_epoch(epoch)  # what the loader calls on its own sampler
            got = labels(loader)
            if batching == "ordered":
                assert got == list(expected)
            else:  # the same samples, in the order they finished
                assert Counter(got) == Counter(expected)
            both += got
        assert sorted(both) == list(range(len(unique_list)))  # 48 samples, 24 per rank
        epochs.append(both)
    assert epochs[0] != epochs[1]


def test_a_state_taken_between_epochs_is_shared_by_the_ranks_of_a_distributed_sampler(
    unique_list: FileList,
) -> None:
    # Rank 0's state, saved between epochs and loaded on every rank (the usual pattern),
    # was refused on rank 1 as "another order", blaming samplers that draw afresh (QA).
    def sampler(rank: int) -> DistributedSampler[int]:
        return DistributedSampler(unique_list, num_replicas=2, rank=rank, shuffle=True, seed=7)

    first = make(unique_list, sampler=sampler(0))
    labels(first)
    ended = first.state_dict()
    it = iter(first)
    next(it)
    mid = first.state_dict()  # rank 0's progress through epoch 1
    first.close()
    other = make(unique_list, sampler=sampler(1))
    other.load_state_dict(ended)
    expected = sampler(1)
    expected.set_epoch(1)
    assert labels(other) == list(expected)  # epoch 1, rank 1's share
    with pytest.raises(ValueError, match="records rank 0's progress through epoch 1"):
        make(unique_list, sampler=sampler(1)).load_state_dict(mid)


class EpochDraws:
    """Draws with replacement whose order is a function of the epoch (set_epoch)."""

    def __init__(self, n: int, count: int) -> None:
        self.n, self.count, self.epoch = n, count, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return self.count

    def __iter__(self) -> Any:
        generator = torch.Generator().manual_seed(1000 + self.epoch)
        return iter(torch.randint(self.n, (self.count,), generator=generator).tolist())


@pytest.mark.parametrize("batching", ["ordered", "straggler"])
@pytest.mark.parametrize("epoch", [0, 2])
def test_resume_mid_epoch_delivers_what_the_epoch_had_left(
    unique_list: FileList, batching: str, epoch: int
) -> None:
    def make_one() -> gl.ImageLoader:
        loader = make(unique_list, sampler=EpochDraws(len(unique_list), 40), batching=batching)
        loader.set_epoch(epoch)
        return loader

    full = labels(make_one())
    loader = make_one()
    it = iter(loader)
    before = [int(v) for _ in range(3) for v in next(it)[1]]
    state = json.loads(json.dumps(loader.state_dict()))
    loader.close()
    resumed = make(unique_list, sampler=EpochDraws(len(unique_list), 40), batching=batching)
    resumed.load_state_dict(state)
    rest = labels(resumed)
    assert Counter(before + rest) == Counter(full) and len(full) == 40
    if batching == "ordered":
        assert before + rest == full


def test_a_sampler_that_draws_afresh_each_pass_resumes_its_first_epoch_only(
    unique_list: FileList,
) -> None:
    # RandomSampler draws from its generator on every pass: seeded, its order for epoch e
    # is its e-th draw, which a new process does not repeat. Refused, not wrong.
    def make_one() -> gl.ImageLoader:
        generator = torch.Generator().manual_seed(3)
        return make(unique_list, sampler=RandomSampler(unique_list, generator=generator))

    for epoch, works in ((0, True), (2, False)):
        loader = make_one()
        for _ in range(epoch):
            labels(loader)
        it = iter(loader)
        next(it)
        state = json.loads(json.dumps(loader.state_dict()))
        loader.close()
        if works:
            make_one().load_state_dict(state)
            continue
        with pytest.raises(ValueError, match="draws afresh on each pass"):
            make_one().load_state_dict(state)


def test_set_epoch_on_the_samplers_own_object_is_taken(unique_list: FileList) -> None:
    # DataLoader's habit: train_sampler.set_epoch(epoch), then iterate the loader.
    def sampler() -> DistributedSampler[int]:
        return DistributedSampler(unique_list, num_replicas=2, rank=1, seed=9)

    def expected(epoch: int) -> list[int]:
        reference = sampler()
        reference.set_epoch(epoch)
        return list(reference)

    ours = sampler()
    ours.set_epoch(5)  # a run restarted at epoch 5, before the loader is built
    loader = make(unique_list, sampler=ours)
    assert loader.epoch == 5 and ours.epoch == 5
    for epoch in (5, 6, 9):
        ours.set_epoch(epoch)
        assert labels(loader) == expected(epoch) and loader.epoch == epoch
    assert labels(loader) == expected(10)  # without a call the next pass moves on
    loader.set_epoch(2)  # and the loader's own set_epoch still reaches it
    assert labels(loader) == expected(2) and ours.epoch == 2


def test_a_samplers_rank_keys_the_random_streams(unique_list: FileList) -> None:
    # Ranks that were not detected (rank given to the sampler alone) drew the same crops.
    class SameOnEveryRank:
        def __init__(self, rank: int) -> None:
            self.rank, self.num_replicas = rank, 2

        def __iter__(self) -> Any:
            return iter(range(8))

    crops = []
    for rank in (0, 1):
        loader = make(unique_list, sampler=SameOnEveryRank(rank))
        assert (loader.sampler.rank, loader.sampler.world_size) == (rank, 2)
        crops.append(torch.cat([x for x, _ in loader]))
    differ = sum(not torch.equal(a, b) for a, b in zip(crops[0], crops[1], strict=True))
    assert differ >= 6


def test_a_resume_with_another_order_is_refused(unique_list: FileList) -> None:
    loader = make(unique_list, sampler=list(range(20)))
    it = iter(loader)
    next(it)
    state = loader.state_dict()
    loader.close()
    with pytest.raises(ValueError, match="another order for epoch 0"):
        make(unique_list, sampler=list(range(20, 40))).load_state_dict(state)
    # Another dataset is said as such: it got the advice about samplers that draw afresh.
    fewer = FileList([(unique_list.key(i), i) for i in range(len(unique_list) - 1)])
    with pytest.raises(ValueError, match="from a dataset of a different size"):
        make(fewer, sampler=list(range(19))).load_state_dict(state)
    with pytest.raises(ValueError, match="saved by a loader with `sampler=`"):
        make(unique_list).load_state_dict(state)
    plain = make(unique_list)
    plain_state = plain.state_dict()
    with pytest.raises(ValueError, match="saved by a loader without `sampler=`"):
        make(unique_list, sampler=list(range(48))).load_state_dict(plain_state)


def test_an_unseeded_sampler_is_taken_once_per_epoch(unique_list: FileList) -> None:
    loader = make(unique_list, sampler=RandomSampler(unique_list), batching="ordered")
    taken = list(loader.sampler)  # the order the epoch will run, taken from the sampler
    assert labels(loader) == taken
    assert sorted(taken) == list(range(len(unique_list)))


def test_set_epoch_reaches_the_sampler(unique_list: FileList) -> None:
    class Recording:
        def __init__(self) -> None:
            self.epochs: list[int] = []

        def set_epoch(self, epoch: int) -> None:
            self.epochs.append(epoch)

        def __iter__(self) -> Any:
            return iter([self.epochs[-1], 10 + self.epochs[-1]])

    recording = Recording()
    loader = make(unique_list, sampler=recording, batch_size=2)
    assert labels(loader) == [0, 10]
    loader.set_epoch(5)
    assert labels(loader) == [5, 15]
    assert labels(loader) == [6, 16]  # the next pass moves on by itself
    assert recording.epochs == [0, 5, 6]


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"shuffle": True}, ValueError, "leave `shuffle` unset"),
        ({"rank": 0, "world_size": 2}, ValueError, "`sampler` shards for itself"),
        ({"sample_weights": [1.0] * 48}, ValueError, "give one"),
    ],
)
def test_arguments_the_sampler_replaces_are_refused(
    unique_list: FileList, kwargs: dict[str, Any], error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        make(unique_list, sampler=[1, 2, 3], **kwargs)


@pytest.mark.parametrize(
    ("sampler", "error", "message"),
    [
        ([1, 2, 48], ValueError, "gave index 48 for epoch 0; the source has 48 samples"),
        ([1, -1], ValueError, "gave index -1"),
        ([1.0, 2.0], TypeError, "must yield integer dataset indices"),
        ([], ValueError, "gave no indices for epoch 0"),
        ([True, False], TypeError, "a bool \\(True\\) is not an index"),
        ([torch.tensor([3])], TypeError, "an array of shape \\(1,\\) is not an index"),
        (iter([1, 2]), TypeError, "one-shot iterator \\(list_iterator\\)"),
        ((i for i in range(3)), TypeError, "one-shot iterator \\(generator\\)"),
        (itertools.cycle(range(3)), TypeError, "one-shot iterator"),
        (5, TypeError, "`sampler` must be an iterable of dataset indices"),
        ("0123", TypeError, "`sampler` must be an iterable of dataset indices"),
    ],
)
def test_a_bad_sampler_is_refused_when_the_loader_is_built(
    unique_list: FileList, sampler: Any, error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        make(unique_list, sampler=sampler)


def test_an_endless_sampler_is_refused_without_reading_it_all(unique_list: FileList) -> None:
    class Endless:  # training by iterations: no epochs
        def __iter__(self) -> Any:
            return itertools.cycle(range(10))

    with pytest.raises(ValueError, match="than 768 \\(16 x the source's 48 samples"):
        make(unique_list, sampler=Endless())

    class LongerThanItsLen(Endless):
        def __len__(self) -> int:
            return 10

    with pytest.raises(ValueError, match="more indices for epoch 0 than its len\\(\\) of 10"):
        make(unique_list, sampler=LongerThanItsLen())


def test_a_sampler_whose_length_changes_is_refused_at_that_epoch(unique_list: FileList) -> None:
    class Growing:
        epoch = 0

        def set_epoch(self, epoch: int) -> None:
            self.epoch = epoch

        def __iter__(self) -> Any:
            return iter(range(4 + self.epoch))

    loader = make(unique_list, sampler=Growing())
    assert labels(loader) == [0, 1, 2, 3]
    with pytest.raises(ValueError, match="gave 5 indices for epoch 1 but 4 for epoch 0"):
        labels(loader)


def test_the_gpu_path_runs_the_samplers_order_too(unique_list: FileList) -> None:
    from gpu_loader.cuda import standin_ports

    options = gl.LoaderOptions(
        decode_on="gpu", gpu_ports=standin_ports(), arena_bytes=16 << 20, monitor_gpu=False
    )
    order = [9, 9, 2, 30, 4, 4, 4]
    assert labels(make(unique_list, sampler=order, options=options)) == order


def ds_of(source: FileList, seed: int = 9) -> DistributedSampler[int]:
    return DistributedSampler(source, num_replicas=2, rank=0, seed=seed)


def order_of(source: FileList, epoch: int, seed: int = 9) -> list[int]:
    reference = ds_of(source, seed)
    reference.set_epoch(epoch)
    return list(reference)


def test_the_same_epoch_set_again_on_the_sampler_runs_it_again(unique_list: FileList) -> None:
    ours = ds_of(unique_list)
    loader = make(unique_list, sampler=ours)
    for epoch in (0, 0, 3, 3):
        ours.set_epoch(epoch)
        assert labels(loader) == order_of(unique_list, epoch), epoch


@pytest.mark.parametrize("batching", ["ordered", "straggler"])
def test_a_resume_after_an_epoch_ended_follows_the_samplers_set_epoch(
    unique_list: FileList, batching: str
) -> None:
    ours = ds_of(unique_list)
    loader = make(unique_list, sampler=ours, batching=batching)
    for epoch in (0, 1):
        ours.set_epoch(epoch)
        labels(loader)
    state = json.loads(json.dumps(loader.state_dict()))  # after epoch 1 ended
    again = ds_of(unique_list)
    resumed = make(unique_list, sampler=again, batching=batching)
    resumed.load_state_dict(state)
    got = []
    for epoch in (1, 2, 3):  # the loop picks up at the saved epoch: nothing is left of it
        again.set_epoch(epoch)
        got.append(sorted(labels(resumed)))
    assert got == [[], sorted(order_of(unique_list, 2)), sorted(order_of(unique_list, 3))]


def test_a_refused_state_leaves_the_sampler_and_its_next_epoch_alone(
    unique_list: FileList,
) -> None:
    ours = ds_of(unique_list)
    loader = make(unique_list, sampler=ours)
    ours.set_epoch(1)
    it = iter(loader)
    next(it)
    state = json.loads(json.dumps(loader.state_dict()))
    loader.close()
    other = ds_of(unique_list, seed=8)
    fresh = make(unique_list, sampler=other)
    with pytest.raises(ValueError, match="another order for epoch 1"):
        fresh.load_state_dict(state)
    assert other.epoch == 0  # put back
    other.set_epoch(1)
    assert labels(fresh) == order_of(unique_list, 1, seed=8)


def test_a_sampler_keeping_its_epoch_privately_is_followed(unique_list: FileList) -> None:
    class Private:
        def __init__(self) -> None:
            self._e = 0

        def set_epoch(self, epoch: int) -> None:
            self._e = epoch

        def __iter__(self) -> Any:
            return iter([self._e, self._e + 20])

    ours = Private()
    loader = make(unique_list, sampler=ours, batch_size=2)
    for epoch in (3, 4, 4):
        ours.set_epoch(epoch)
        assert labels(loader) == [epoch, epoch + 20]
    assert labels(loader) == [5, 25]  # without a call the next pass moves on


def test_an_index_past_int64_is_named_as_out_of_range(unique_list: FileList) -> None:
    with pytest.raises(ValueError, match=r"an index of 2\*\*63 or more for epoch 0"):
        make(unique_list, sampler=[1, 2**64])
