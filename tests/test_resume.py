"""``state_dict()`` / ``load_state_dict()``: a resumed run sees exactly the uninterrupted one."""

from __future__ import annotations

import io
import time
from collections import deque
from collections.abc import Iterator
from itertools import islice
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import BatchSampler, DistributedSampler, IterableDataset, SequentialSampler

from dataloaderx import (
    Backend,
    BatchStream,
    DataLoaderX,
    ResumeStateError,
    available_backends,
    register_backend,
)
from tests.helpers import RangeDataset
from tests.reliability_support import takes_depth
from tests.test_registry import clean_registry  # noqa: F401 - a fixture

EPOCHS = 2


class CountingDataset(RangeDataset):
    """A ``RangeDataset`` that records which indices were read."""

    def __init__(self, size: int) -> None:
        super().__init__(size)
        self.read: list[int] = []

    def __getitem__(self, index: int) -> torch.Tensor:
        self.read.append(index)
        return super().__getitem__(index)


def make_loader(size: int, **kwargs: Any) -> DataLoaderX[torch.Tensor]:
    generator = torch.Generator()
    generator.manual_seed(kwargs.pop("seed", 0))
    dataset = kwargs.pop("dataset", None) or RangeDataset(size)
    return DataLoaderX(dataset, generator=generator, **kwargs)


def firsts(batches: Any) -> list[list[int]]:
    return [batch[:, 0].tolist() for batch in batches]


def uninterrupted(size: int, **kwargs: Any) -> list[list[list[int]]]:
    loader = make_loader(size, **kwargs)
    return [firsts(loader) for _ in range(EPOCHS)]


def resumed(size: int, save_epoch: int, save_at: int | None, **kwargs: Any) -> list[Any]:
    """Run up to epoch ``save_epoch``, consume ``save_at`` of its batches (``None``: all of
    them and the ``StopIteration``), save; resume in a new loader through a ``torch.save``
    round trip and finish. Return every epoch as the two loaders together saw it."""
    loader = make_loader(size, **kwargs)
    epochs = [firsts(loader) for _ in range(save_epoch)]
    with iter(loader) as iterator:
        if save_at is None:
            epochs.append(firsts(iterator))
        else:
            epochs.append(firsts([next(iterator) for _ in range(save_at)]))
        state = loader.state_dict()
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    fresh = make_loader(size, **kwargs)
    fresh.load_state_dict(torch.load(buffer, weights_only=True))
    if save_at is not None:
        epochs[-1].extend(firsts(fresh))
    epochs.extend(firsts(fresh) for _ in range(EPOCHS - len(epochs)))
    return epochs


@settings(max_examples=100)
@given(
    size=st.integers(1, 23),
    batch_size=st.integers(1, 5),
    shuffle=st.booleans(),
    drop_last=st.booleans(),
    backend=st.sampled_from(available_backends()),
    workers=st.sampled_from([0, 0, 2]),
    persistent=st.booleans(),
    save_epoch=st.integers(0, EPOCHS - 1),
    save_fraction=st.sampled_from([0.0, 1.0, None, 0.5, 0.99]),
)
def test_resumed_run_equals_uninterrupted_run(
    size: int,
    batch_size: int,
    shuffle: bool,
    drop_last: bool,
    backend: str,
    workers: int,
    persistent: bool,
    save_epoch: int,
    save_fraction: float | None,
) -> None:
    kwargs: dict[str, Any] = {
        "batch_size": batch_size,
        "shuffle": shuffle,
        "drop_last": drop_last,
        "backend": backend,
        "num_workers": workers,
        "persistent_workers": persistent and workers > 0,
    }
    expected = uninterrupted(size, **kwargs)
    per_epoch = len(expected[0])
    # 0.0: before the first batch; 1.0: after the last batch (before StopIteration);
    # None: between this epoch and the next; fractions: inside the epoch.
    save_at = None if save_fraction is None else round(save_fraction * per_epoch)
    assert resumed(size, save_epoch, save_at, **kwargs) == expected


@pytest.mark.parametrize("workers", [0, 2])
def test_between_epochs_and_persistent_workers(backend: str, workers: int) -> None:
    kwargs: dict[str, Any] = {
        "batch_size": 3,
        "shuffle": True,
        "backend": backend,
        "num_workers": workers,
        "persistent_workers": workers > 0,
    }
    expected = uninterrupted(17, **kwargs)
    loader = make_loader(17, **kwargs)
    assert firsts(loader) == expected[0]
    fresh = make_loader(17, **kwargs)
    fresh.load_state_dict(loader.state_dict())
    assert firsts(fresh) == expected[1]


def test_skipped_indices_are_not_read(backend: str) -> None:
    dataset = CountingDataset(40)
    loader = make_loader(40, dataset=dataset, batch_size=4, shuffle=True, backend=backend)
    with iter(loader) as iterator:
        head = firsts(next(iterator) for _ in range(6))
        state = loader.state_dict()
    fresh_dataset = CountingDataset(40)
    fresh = make_loader(40, dataset=fresh_dataset, batch_size=4, shuffle=True, backend=backend)
    fresh.load_state_dict(state)
    iterator = iter(fresh)
    assert len(iterator) == 4
    assert len(fresh) == 10
    tail = firsts(iterator)
    assert sorted(index for batch in head + tail for index in batch) == list(range(40))
    assert sorted(fresh_dataset.read) == sorted(index for batch in tail for index in batch)


def test_prefetched_batches_are_not_counted(backend: str) -> None:
    dataset = CountingDataset(64)
    options = {"depth": 8} if takes_depth(backend) else None
    loader = make_loader(
        64, dataset=dataset, batch_size=2, backend=backend, backend_options=options
    )
    with iter(loader) as iterator:
        next(iterator)
        next(iterator)
        deadline = time.monotonic() + 5
        while options and len(dataset.read) <= 4 and time.monotonic() < deadline:
            time.sleep(0.01)  # let the producer run ahead
        assert not options or len(dataset.read) > 4
        assert loader.state_dict()["consumed"] == 2


def test_batch_sampler_and_state_survives_a_second_save() -> None:
    sampler = BatchSampler(SequentialSampler(range(20)), batch_size=3, drop_last=False)
    loader = DataLoaderX(RangeDataset(20), batch_sampler=sampler)
    with iter(loader) as iterator:
        next(iterator)
        state = loader.state_dict()
    fresh = DataLoaderX(RangeDataset(20), batch_sampler=sampler)
    fresh.load_state_dict(state)
    assert fresh.state_dict() == state  # loaded, not yet iterated: the same position
    assert firsts(fresh)[0] == [3, 4, 5]


def test_generator_none_resumes_the_epoch_without_touching_the_global_rng() -> None:
    torch.manual_seed(5)
    loader = DataLoaderX(RangeDataset(30), batch_size=4, shuffle=True)
    with iter(loader) as iterator:
        head = firsts([next(iterator) for _ in range(3)])
        state = loader.state_dict()
        tail = firsts(iterator)
    fresh = DataLoaderX(RangeDataset(30), batch_size=4, shuffle=True)
    fresh.load_state_dict(state)
    torch.manual_seed(7)
    before = torch.get_rng_state()
    assert firsts(fresh) == tail
    assert torch.equal(torch.get_rng_state(), before)
    assert head  # the saved part was consumed


# -- errors ------------------------------------------------------------------------


def saved_state(**kwargs: Any) -> dict[str, Any]:
    loader = make_loader(20, batch_size=4, **kwargs)
    with iter(loader) as iterator:
        next(iterator)
        return loader.state_dict()


@pytest.mark.parametrize(
    ("changed", "named"),
    [
        ({"batch_size": 5}, "batch_size (state: 4, this loader: 5)"),
        ({"drop_last": True}, "drop_last (state: False, this loader: True)"),
        ({"shuffle": True}, "sampler (state: 'torch.utils.data.sampler.SequentialSampler'"),
    ],
)
def test_a_state_from_other_arguments_is_refused(changed: dict[str, Any], named: str) -> None:
    state = saved_state()
    kwargs = {"batch_size": 4, **changed}
    with pytest.raises(ResumeStateError, match="saved by a loader with other arguments") as err:
        make_loader(20, **kwargs).load_state_dict(state)
    assert named in str(err.value)


def test_a_state_for_another_dataset_length_is_refused() -> None:
    state = saved_state()
    with pytest.raises(ResumeStateError, match=r"dataset_length \(state: 20, this loader: 21\)"):
        make_loader(21, batch_size=4).load_state_dict(state)


def test_a_newer_version_is_refused_with_the_version_named() -> None:
    state = {**saved_state(), "version": 7}
    with pytest.raises(ResumeStateError, match="format version 7, newer than version 1"):
        make_loader(20, batch_size=4).load_state_dict(state)


@pytest.mark.parametrize(
    ("broken", "message"),
    [
        ({"consumed": -1}, "'consumed' must be an int >= 0, got -1"),
        ({"consumed": 99}, "'consumed' must be at most the 5 batches of an epoch"),
        ({"epoch": "one"}, "'epoch' must be an int >= 0, got 'one'"),
        ({"rng": {"loader": [1, 2]}}, "'rng.loader' must be a uint8 tensor"),
        ({"rng": {}}, r"holds generator states for \[\]"),
        ({"version": None}, "'version' must be an int >= 1"),
        ({"format": "something"}, "not a DataLoaderX state: its 'format' is 'something'"),
        ({"new_iterator": 1}, "'new_iterator' must be a bool"),
    ],
)
def test_a_corrupt_state_is_refused(broken: dict[str, Any], message: str) -> None:
    state = {**saved_state(), **broken}
    with pytest.raises(ResumeStateError, match=message):
        make_loader(20, batch_size=4).load_state_dict(state)


def test_a_state_that_is_not_a_mapping_is_refused() -> None:
    with pytest.raises(ResumeStateError, match=r"expects the mapping .* got list"):
        make_loader(20, batch_size=4).load_state_dict([1, 2])  # type: ignore[arg-type]


def test_in_order_false_with_workers_cannot_save() -> None:
    loader = DataLoaderX(RangeDataset(8), batch_size=2, num_workers=2, in_order=False)
    with pytest.raises(ValueError, match="state_dict\\(\\) needs in_order=True"):
        loader.state_dict()


# -- IterableDataset ------------------------------------------------------------------


class Stream(IterableDataset[torch.Tensor]):
    """Yields ``0..size-1``; counts the items it made."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.made = 0

    def __iter__(self) -> Iterator[torch.Tensor]:
        for index in range(self.size):
            self.made += 1
            yield torch.tensor([index, index])


class StatefulStream(Stream):
    """A ``Stream`` that saves and restores its position."""

    def __init__(self, size: int) -> None:
        super().__init__(size)
        self.position = 0
        self.start = 0

    def __iter__(self) -> Iterator[torch.Tensor]:
        start, self.start = self.start, 0
        for index in range(start, self.size):
            self.made += 1
            self.position = index + 1
            yield torch.tensor([index, index])

    def state_dict(self) -> dict[str, int]:
        return {"position": self.position}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.start = state["position"]


def test_a_stateful_iterable_dataset_resumes_from_its_own_state(backend: str) -> None:
    loader = DataLoaderX(StatefulStream(30), batch_size=4, backend=backend)
    with iter(loader) as iterator:
        head = firsts([next(iterator) for _ in range(3)])
        state = loader.state_dict()
    assert state["dataset_state"] == {"position": 12}  # not where the producer got to
    dataset = StatefulStream(30)
    fresh = DataLoaderX(dataset, batch_size=4, backend=backend)
    fresh.load_state_dict(state)
    tail = firsts(fresh)
    assert [i for batch in head + tail for i in batch] == list(range(30))
    assert dataset.made == 30 - 12


@pytest.mark.parametrize("workers", [0, 2])
def test_an_iterable_dataset_without_state_is_skipped_with_a_warning(workers: int) -> None:
    loader = DataLoaderX(Stream(30), batch_size=4, num_workers=workers)
    with iter(loader) as iterator:
        head = firsts([next(iterator) for _ in range(3)])
        state = loader.state_dict()
    fresh = DataLoaderX(Stream(30), batch_size=4, num_workers=workers)
    fresh.load_state_dict(state)
    with pytest.warns(UserWarning, match="makes the 3 batches already consumed again"):
        iterator = iter(fresh)
    tail = firsts(iterator)
    assert head + tail == firsts(DataLoaderX(Stream(30), batch_size=4, num_workers=workers))


def test_distributed_sampler_set_epoch_keeps_working(backend: str) -> None:
    def loader() -> tuple[DataLoaderX[torch.Tensor], DistributedSampler[Any]]:
        sampler = DistributedSampler(RangeDataset(30), num_replicas=2, rank=1, seed=3)
        made = DataLoaderX(RangeDataset(30), batch_size=2, sampler=sampler, backend=backend)
        return made, sampler

    reference, sampler = loader()
    expected = []
    for epoch in range(3):
        sampler.set_epoch(epoch)
        expected.append(firsts(reference))
    first, sampler = loader()
    sampler.set_epoch(0)
    assert firsts(first) == expected[0]
    sampler.set_epoch(1)
    with iter(first) as iterator:
        head = firsts([next(iterator) for _ in range(3)])
        state = first.state_dict()
    second, sampler = loader()
    second.load_state_dict(state)
    sampler.set_epoch(1)
    assert head + firsts(second) == expected[1]
    sampler.set_epoch(2)
    assert firsts(second) == expected[2]


class ReadAhead(Backend):
    """A third-party backend: reads three batches ahead of the loop, in its own way."""

    def open(self, source: Iterator[Any]) -> BatchStream[Any]:
        def stream() -> Iterator[Any]:
            ahead: deque[Any] = deque(islice(source, 3))
            while ahead:
                yield ahead.popleft()
                ahead.extend(islice(source, 1))

        return stream()


@pytest.mark.usefixtures("clean_registry")
def test_a_third_party_backend_is_tracked_without_code_of_its_own() -> None:
    register_backend("readahead")(ReadAhead)
    dataset = CountingDataset(40)
    loader = make_loader(40, dataset=dataset, batch_size=4, shuffle=True, backend="readahead")
    expected = firsts(make_loader(40, batch_size=4, shuffle=True))
    with iter(loader) as iterator:
        head = firsts([next(iterator) for _ in range(4)])
        assert len(dataset.read) == 6 * 4  # two batches made beyond those the loop saw
        state = loader.state_dict()
    assert state["consumed"] == 4
    fresh = make_loader(40, batch_size=4, shuffle=True, backend="readahead")
    fresh.load_state_dict(state)
    assert head + firsts(fresh) == expected
