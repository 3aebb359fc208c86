"""``dataloaderx.prefetch()``: any backend over any iterable of batches."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sized
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader

from dataloaderx import (
    DataLoaderX,
    Prefetched,
    PrefetchIterator,
    SizedPrefetched,
    UnknownBackendError,
    prefetch,
)
from tests.helpers import (
    FailingDataset,
    RangeDataset,
    assert_closed_source,
    assert_same_events,
    run_events,
    wait_for,
)


class Batches:
    """A generator of ``count`` tensors that records whether its ``finally`` ran."""

    def __init__(self, count: int, fail_at: int | None = None) -> None:
        self.count = count
        self.fail_at = fail_at
        self.finished = threading.Event()

    def __call__(self) -> Iterator[torch.Tensor]:
        try:
            for index in range(self.count):
                if index == self.fail_at:
                    raise ValueError(f"batch {index} is broken")
                yield torch.full((2,), index)
        finally:
            self.finished.set()


def test_generator_gives_the_same_batches_then_ends(backend: str) -> None:
    batches = prefetch(Batches(5)(), backend=backend)
    expected = run_events(Batches(5)())
    assert_same_events(run_events(iter(batches)), expected)


def test_generator_error_is_reraised_unchanged(backend: str) -> None:
    expected = run_events(Batches(5, fail_at=3)())
    assert expected[-1] == ("error", ValueError, "batch 3 is broken")
    got = run_events(iter(prefetch(Batches(5, fail_at=3)(), backend=backend)))
    assert_same_events(got, expected)


def test_one_shot_source_cannot_start_a_second_epoch(backend: str) -> None:
    batches = prefetch(Batches(2)(), backend=backend)
    assert len(list(batches)) == 2
    with pytest.raises(RuntimeError, match=r"one-shot iterator \(generator\).*prefetch\(\) again"):
        iter(batches)


def test_generator_has_no_len(backend: str) -> None:
    batches = prefetch(Batches(2)(), backend=backend)
    assert type(batches) is Prefetched
    assert not isinstance(batches, Sized)


@pytest.mark.parametrize("how", ["break", "close", "with"])
def test_leaving_early_closes_the_generator(backend: str, how: str) -> None:
    source = Batches(1000)
    batches = prefetch(source(), backend=backend)
    if how == "with":
        with batches:
            for _ in batches:
                break
    else:
        iterator = iter(batches)
        next(iterator)
        if how == "close":
            iterator.close()
        else:
            del iterator
    assert source.finished.wait(5.0), "the generator's finally block did not run"


@pytest.mark.parametrize("num_workers", [0, 2])
def test_dataloader_source_is_reiterable_with_its_len(backend: str, num_workers: int) -> None:
    loader = DataLoader(RangeDataset(10), batch_size=3, shuffle=False, num_workers=num_workers)
    batches = prefetch(loader, backend=backend)
    assert isinstance(batches, SizedPrefetched)
    assert len(batches) == len(loader) == 4
    expected = run_events(iter(loader))
    for _ in range(2):
        iterator = iter(batches)
        assert isinstance(iterator, PrefetchIterator)
        assert len(iterator) == 4
        assert_same_events(run_events(iterator), expected)


def test_dataset_errors_match_the_source(backend: str) -> None:
    loader = DataLoader(FailingDataset(8, frozenset({2, 5})), batch_size=2)
    expected = run_events(iter(loader))
    assert [kind for kind, _, _ in expected].count("error") == 2
    assert_same_events(run_events(iter(prefetch(loader, backend=backend))), expected)


def test_new_epoch_stops_the_previous_one(backend: str) -> None:
    loader = DataLoader(RangeDataset(12), batch_size=2, num_workers=2, persistent_workers=True)
    batches = prefetch(loader, backend=backend)
    expected = run_events(iter(loader))
    first = iter(batches)
    next(first)
    assert_same_events(run_events(iter(batches)), expected)
    with pytest.raises(StopIteration):
        next(first)
    batches.close()


def test_early_exit_releases_dataloader_workers(backend: str) -> None:
    loader = DataLoader(RangeDataset(100), batch_size=2, num_workers=2)
    iterator = iter(prefetch(loader, backend=backend))
    next(iterator)
    workers = iterator._inner._workers  # type: ignore[attr-defined]
    assert any(worker.is_alive() for worker in workers)
    iterator.close()
    assert_closed_source(iterator.source)
    # A read under way when close() gave up waiting releases the source as it ends.
    assert wait_for(lambda: iterator.source.released)
    assert wait_for(lambda: not any(worker.is_alive() for worker in workers))


def test_wrapping_a_dataloaderx_works(backend: str) -> None:
    loader = DataLoaderX(RangeDataset(7), batch_size=2, backend="sync")
    expected = run_events(iter(DataLoader(RangeDataset(7), batch_size=2)))
    assert_same_events(run_events(iter(prefetch(loader, backend=backend))), expected)


def test_attributes_come_from_the_source() -> None:
    loader = DataLoader(RangeDataset(4), batch_size=2)
    batches = prefetch(loader, backend="thread", backend_options={"depth": 3})
    assert batches.dataset is loader.dataset
    assert batches.batch_size == 2
    assert batches.iterable is loader
    assert batches.prefetch_backend.describe() == {
        "depth": 3,
        "max_depth": None,
        "max_bytes": None,
        "adaptive": True,
    }
    with pytest.raises(AttributeError, match="no_such_attribute"):
        _ = batches.no_such_attribute


def test_construction_starts_nothing() -> None:
    before = set(threading.enumerate())
    source = Batches(3)
    prefetch(source(), backend="thread")
    assert set(threading.enumerate()) == before
    assert not source.finished.is_set()


@pytest.mark.parametrize(
    ("arguments", "error", "message"),
    [
        ({"iterable": 3}, TypeError, r"prefetch\(\) needs an iterable of batches.*got 3 \(int\)"),
        ({"backend": "thred"}, UnknownBackendError, r"unknown backend 'thred'.*'thread'"),
        ({"backend_options": {"dpth": 2}}, TypeError, r"unknown option 'dpth'.*'depth'"),
        ({"backend_options": {"depth": 0}}, ValueError, r"'depth' must be an int >= 1, got 0"),
    ],
)
def test_bad_arguments_are_rejected_by_name(
    arguments: dict[str, Any], error: type[Exception], message: str
) -> None:
    kwargs: dict[str, Any] = {"iterable": [1, 2], "backend": "thread", **arguments}
    iterable = kwargs.pop("iterable")
    with pytest.raises(error, match=message):
        prefetch(iterable, **kwargs)


def test_environment_variable_picks_the_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DATALOADERX_BACKEND", "sync")
    assert prefetch([1, 2]).prefetch_backend.name == "sync"
