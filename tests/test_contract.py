"""The guarantees every backend keeps, run against each one in ``available_backends()``."""

from __future__ import annotations

import gc
import threading
import warnings
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from dataloaderx import DataLoaderX, PrefetchIterator, available_backends, get_backend
from dataloaderx.engine import decision as mode_decision
from dataloaderx.options import backend_option_names
from tests.helpers import (
    Counter,
    FailingDataset,
    FailingSampler,
    RangeDataset,
    ShortLenIterable,
    StructDataset,
    SwitchingPolicy,
    WarningDataset,
    always_prefetching,
    assert_closed_source,
    assert_same,
    assert_same_events,
    child_pids,
    failing_collate,
    run_events,
    running_producer,
    user_warnings,
    wait_for,
    wait_until_clean,
    wait_until_made_ahead,
    waits_in_a_condition,
)

pytestmark = pytest.mark.timeout(60)

#: The prefetching backends run the suite a second time with ``depth="auto"``.
AUTO_DEPTH = [
    {"name": name, "depth": "auto"}
    for name in available_backends()
    if "max_depth" in (backend_option_names(get_backend(name)) or [])
]
#: ``thread`` with a policy that switches between prefetching and inline mid-epoch.
SWITCHING = "thread-switching"


@pytest.fixture(
    params=[*available_backends(), *AUTO_DEPTH, SWITCHING],
    ids=lambda spec: spec if isinstance(spec, str) else f"{spec['name']}-depth-auto",
)
def backend(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Any:
    """Every backend that can run here by name, each prefetching one with depth='auto',
    and ``thread`` forced to switch modes every few batches."""
    if request.param == SWITCHING:
        monkeypatch.setattr(mode_decision, "new_policy", SwitchingPolicy)
        return "thread"
    return request.param


def both(dataset: Any, backend: str, **kwargs: Any) -> tuple[DataLoader[Any], DataLoaderX[Any]]:
    """A plain DataLoader and a DataLoaderX with the same arguments (and seeds)."""
    seeded = "generator" in kwargs
    reference_kwargs = dict(kwargs)
    if seeded:
        reference_kwargs["generator"] = torch.Generator().manual_seed(kwargs["generator"])
        kwargs = {**kwargs, "generator": torch.Generator().manual_seed(kwargs["generator"])}
    return DataLoader(dataset, **reference_kwargs), DataLoaderX(dataset, backend=backend, **kwargs)


# 1. Same batches, same order -----------------------------------------------------------


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize(
    ("shuffle", "drop_last", "batch_size"),
    [(False, False, 4), (True, False, 4), (True, True, 3), (False, True, 5), (False, False, None)],
)
def test_same_batches_as_dataloader(
    backend: str, num_workers: int, shuffle: bool, drop_last: bool, batch_size: int | None
) -> None:
    options: dict[str, Any] = {"batch_size": batch_size, "num_workers": num_workers}
    if batch_size is not None:
        options["drop_last"] = drop_last
    if shuffle:
        options.update(shuffle=True, generator=1234)
    reference, loader = both(StructDataset(23), backend, **options)
    expected = list(reference)
    actual = list(loader)
    assert len(actual) == len(expected) == len(loader) == len(reference)
    assert_same(actual, expected)


def test_empty_dataset_yields_nothing(backend: str) -> None:
    loader = DataLoaderX(RangeDataset(0), batch_size=4, backend=backend)
    iterator = iter(loader)
    assert len(iterator) == 0
    assert list(iterator) == []
    with pytest.raises(StopIteration):
        next(iterator)


def test_loader_keeps_dataloader_surface(backend: str) -> None:
    dataset = RangeDataset(10)
    loader = DataLoaderX(dataset, batch_size=3, backend=backend)
    reference = DataLoader(dataset, batch_size=3)
    assert isinstance(loader, DataLoader)
    assert loader.dataset is dataset
    assert len(loader) == len(reference) == 4
    assert type(loader.sampler) is type(reference.sampler)
    assert type(loader.batch_sampler) is type(reference.batch_sampler)
    iterator = iter(loader)
    assert isinstance(iterator, PrefetchIterator)
    assert iter(iterator) is iterator
    assert len(iterator) == len(iter(reference)) == 4
    iterator.close()


def test_iterable_dataset_batches_match(backend: str) -> None:
    reference, loader = both(ShortLenIterable(11, 11), backend, batch_size=4)
    assert_same(list(loader), list(reference))


# 2. Multi-epoch ------------------------------------------------------------------------


def test_set_epoch_reshuffles_like_dataloader(backend: str) -> None:
    dataset = RangeDataset(40)
    ours = DistributedSampler(dataset, num_replicas=2, rank=1, shuffle=True, seed=7)
    theirs = DistributedSampler(dataset, num_replicas=2, rank=1, shuffle=True, seed=7)
    loader = DataLoaderX(dataset, batch_size=4, sampler=ours, backend=backend)
    reference = DataLoader(dataset, batch_size=4, sampler=theirs)
    epochs = []
    for epoch in range(3):
        ours.set_epoch(epoch)
        theirs.set_epoch(epoch)
        batches = list(loader)
        assert_same(batches, list(reference))
        epochs.append(torch.cat(batches)[:, 0].tolist())
    assert epochs[0] != epochs[1] != epochs[2]


@pytest.mark.parametrize("shuffle", [False, True])
def test_persistent_workers_across_full_epochs(backend: str, shuffle: bool) -> None:
    options: dict[str, Any] = {"shuffle": True, "generator": 99} if shuffle else {}
    reference, loader = both(
        RangeDataset(30),
        backend,
        batch_size=4,
        num_workers=2,
        persistent_workers=True,
        **options,
    )
    for _ in range(6):
        assert_same(list(loader), list(reference))
    workers = loader._iterator._workers  # type: ignore[union-attr]
    assert all(worker.is_alive() for worker in workers)


def test_persistent_workers_survive_epochs_left_early(backend: str) -> None:
    # Without shuffling, every epoch matches DataLoader exactly, broken ones included.
    reference, loader = both(
        RangeDataset(30), backend, batch_size=4, num_workers=2, persistent_workers=True
    )
    for epoch in range(6):
        expected_iter, actual_iter = iter(reference), iter(loader)
        count = 2 if epoch % 2 == 0 else len(loader)
        for _ in range(count):
            assert_same(next(actual_iter), next(expected_iter))
    workers = loader._iterator._workers  # type: ignore[union-attr]
    assert all(worker.is_alive() for worker in workers)


def test_persistent_shuffled_epochs_after_early_exit_are_complete(backend: str) -> None:
    # A producer that ran ahead may have advanced a shuffling sampler's generator
    # further than DataLoader would (see docs/design.md), so compare contents only.
    loader = DataLoaderX(
        RangeDataset(30),
        batch_size=4,
        num_workers=2,
        persistent_workers=True,
        shuffle=True,
        generator=torch.Generator().manual_seed(3),
        backend=backend,
    )
    for _ in range(6):
        iterator = iter(loader)
        next(iterator)
        full = torch.cat(list(loader))[:, 0].tolist()
        assert sorted(full) == list(range(30))


@pytest.mark.parametrize("exhaust", [False, True])
def test_next_epochs_order_as_dataloader_whether_or_not_the_loop_asks_past_the_end(
    backend: Any, exhaust: bool
) -> None:
    """A loop that stops by length (as Lightning does) never reads the sampler past the
    last batch; a ``for`` loop does. Either way the next epoch's shuffle must match."""

    def epochs(loader: DataLoader[Any]) -> list[list[Any]]:
        seen: list[list[Any]] = []
        for _ in range(3):
            iterator = iter(loader)
            seen.append([next(iterator).tolist() for _ in range(len(loader))])
            if exhaust:
                assert next(iterator, None) is None
            del iterator
        return seen

    def build(cls: Any, **extra: Any) -> DataLoader[Any]:
        generator = torch.Generator().manual_seed(11)
        return cls(RangeDataset(24), batch_size=3, shuffle=True, generator=generator, **extra)

    expected = epochs(build(DataLoader))
    assert epochs(build(DataLoaderX, backend=backend)) == expected


# 3. Early exit stops everything --------------------------------------------------------


def _exit_early(loader: DataLoaderX[Any], how: str) -> None:
    if how == "break":
        for index, _ in enumerate(loader):
            if index == 2:
                break
    elif how == "close":
        iterator = iter(loader)
        next(iterator)
        iterator.close()
        assert_closed_source(iterator.source)
        iterator.close()  # a second close is harmless
        with pytest.raises(StopIteration):
            next(iterator)
    elif how == "with":
        with iter(loader) as iterator:
            next(iterator)
        assert_closed_source(iterator.source)
    elif how == "del":
        iterator = iter(loader)
        next(iterator)
        del iterator
    else:  # pragma: no cover
        raise AssertionError(how)


#: How long the threads and workers of an epoch left early may take to end on a slow,
#: loaded machine: a deadline for a leak, not a speed bound.
CLEAN_WITHIN = 30.0


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("how", ["break", "close", "with", "del"])
def test_early_exit_stops_thread_and_workers(backend: str, num_workers: int, how: str) -> None:
    threads = set(threading.enumerate())
    children = child_pids()
    loader = DataLoaderX(RangeDataset(200), batch_size=2, num_workers=num_workers, backend=backend)
    _exit_early(loader, how)
    left_threads, left_children = wait_until_clean(threads, children, within=CLEAN_WITHIN)
    assert left_threads == []
    assert left_children == set()


def test_twenty_epochs_of_early_breaks_leak_nothing(backend: str) -> None:
    threads = set(threading.enumerate())
    children = child_pids()
    loader = DataLoaderX(RangeDataset(100), batch_size=2, num_workers=2, backend=backend)
    for _ in range(20):
        for index, _batch in enumerate(loader):
            if index == 2:
                break
        left_threads, left_children = wait_until_clean(threads, children, within=CLEAN_WITHIN)
        assert left_threads == []
        assert left_children == set()


def test_construction_starts_no_thread(backend: str) -> None:
    threads = set(threading.enumerate())
    loader = DataLoaderX(RangeDataset(10), num_workers=2, backend=backend)
    assert set(threading.enumerate()) == threads
    before = child_pids()
    DataLoaderX(RangeDataset(10), num_workers=2, persistent_workers=True, backend=backend)
    assert child_pids() == before
    assert loader._iterator is None


# 4. Errors -----------------------------------------------------------------------------


@pytest.mark.parametrize("num_workers", [0, 2])
def test_dataset_errors_match_dataloader_and_iteration_continues(
    backend: str, num_workers: int
) -> None:
    # 50 of the 60 batches fail: each failing next() raises, the rest are yielded.
    dataset = FailingDataset(120, frozenset(range(0, 100)))
    reference, loader = both(dataset, backend, batch_size=2, num_workers=num_workers)
    expected = run_events(iter(reference))
    actual = run_events(iter(loader))
    assert sum(kind == "error" for kind, _, _ in expected) == 50
    assert_same_events(actual, expected)
    # The loader starts a new epoch afterwards.
    assert_same_events(run_events(iter(loader)), expected)


def test_sampler_error_matches_dataloader(backend: str) -> None:
    dataset = RangeDataset(20)
    reference = DataLoader(dataset, batch_size=3, sampler=FailingSampler(20, 7))
    loader = DataLoaderX(dataset, batch_size=3, sampler=FailingSampler(20, 7), backend=backend)
    expected = run_events(iter(reference))
    assert any(kind == "error" for kind, _, _ in expected)
    assert_same_events(run_events(iter(loader)), expected)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_collate_error_matches_dataloader(backend: str, num_workers: int) -> None:
    dataset = FailingDataset(12, frozenset())
    options = {"batch_size": 3, "num_workers": num_workers, "collate_fn": failing_collate(6)}
    expected = run_events(iter(DataLoader(dataset, **options)))
    actual = run_events(iter(DataLoaderX(dataset, backend=backend, **options)))
    assert [kind for kind, _, _ in expected] == ["batch", "batch", "error", "batch"]
    assert_same_events(actual, expected)


@pytest.mark.parametrize("error_type", [KeyboardInterrupt, SystemExit])
def test_interrupt_in_producer_reaches_consumer(
    backend: str, error_type: type[BaseException]
) -> None:
    loader = DataLoaderX(
        FailingDataset(20, frozenset({5}), error_type), batch_size=1, backend=backend
    )
    iterator = iter(loader)
    delivered = [int(next(iterator)) for _ in range(5)]
    assert delivered == [0, 1, 2, 3, 4]
    with pytest.raises(error_type, match="bad index 5"):
        next(iterator)
    iterator.close()
    # The loader starts a new epoch afterwards, which fails at the same place.
    again = iter(loader)
    assert [int(next(again)) for _ in range(5)] == [0, 1, 2, 3, 4]
    with pytest.raises(error_type, match="bad index 5"):
        next(again)
    again.close()


# 5. Bounded memory ---------------------------------------------------------------------


@pytest.mark.parametrize("depth", [1, 3])
def test_never_more_than_depth_batches_ahead(backend: str, depth: int) -> None:
    counter = Counter()
    options = {} if backend == "sync" else always_prefetching(backend, depth=depth)
    loader = DataLoaderX(
        RangeDataset(100),
        batch_size=1,
        collate_fn=counter,
        backend=backend,
        backend_options=options,
    )
    limit = 0 if backend == "sync" else depth + 1  # queued batches plus one in hand
    consumed = 0

    def ahead() -> int:
        made = counter.count - consumed
        assert made <= limit  # on every sample
        return made

    def waits_for_room(iterator: Any) -> bool:
        producer = running_producer(iterator)
        parked = producer is None or waits_in_a_condition(producer)
        return ahead() <= limit and parked

    with iter(loader) as iterator:
        for consumed in range(1, 6):
            next(iterator)
            # The producer runs ahead up to the bound ...
            assert wait_for(lambda: ahead() == limit), (counter.count, consumed, limit)
            # ... and stops there: it waits for room, and made no batch more meanwhile.
            assert wait_for(lambda: waits_for_room(iterator))
            assert ahead() == limit


# 6. pin_memory -------------------------------------------------------------------------


@pytest.mark.parametrize("num_workers", [0, 2])
def test_pin_memory_behaves_like_dataloader(backend: str, num_workers: int) -> None:
    dataset = RangeDataset(9)
    options = {"batch_size": 4, "num_workers": num_workers, "pin_memory": True}
    with warnings.catch_warnings(record=True) as expected_warnings:
        warnings.simplefilter("always")
        expected = list(DataLoader(dataset, **options))
    loader = DataLoaderX(dataset, backend=backend, **options)
    with warnings.catch_warnings(record=True) as actual_warnings:
        warnings.simplefilter("always")
        actual = list(loader)
    assert_same(actual, expected)
    assert user_warnings(actual_warnings) == user_warnings(expected_warnings)
    assert loader.pin_memory
    if torch.cuda.is_available() and not loader.prefetch_backend.pins_host_memory():
        assert all(batch.is_pinned() or batch.device.type != "cpu" for batch in actual)


# 8. Generic ----------------------------------------------------------------------------


def test_loader_is_generic(backend: str) -> None:
    alias = DataLoaderX[torch.Tensor]
    loader = alias(RangeDataset(4), batch_size=2, backend=backend)
    assert isinstance(loader, DataLoaderX)
    assert len(list(loader)) == 2


# 9. Warnings ---------------------------------------------------------------------------


def _warnings_per_call(iterator: Any, calls: int) -> list[list[str]]:
    """The warnings each of ``calls`` ``next()`` calls raised, in order."""
    raised = []
    for _ in range(calls):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            next(iterator)
        raised.append([f"{w.category.__name__}: {w.message}" for w in caught])
    return raised


@pytest.mark.parametrize("num_workers", [0, 2])
def test_iterable_length_warning_is_raised_at_handout(backend: str, num_workers: int) -> None:
    dataset = ShortLenIterable(6, 3)  # the warning names it: the same one for both loaders
    reference, loader = both(dataset, backend, batch_size=1, num_workers=num_workers)
    assert len(loader) == len(reference) == 3
    expected_iter = iter(reference)
    expected = _warnings_per_call(expected_iter, 4)
    del expected_iter
    assert expected[:3] == [[], [], []]
    assert len(expected[3]) == 1
    assert "Length of IterableDataset" in expected[3][0]
    iterator = iter(loader)
    early = _warnings_per_call(iterator, 3)
    with warnings.catch_warnings(record=True) as meanwhile:
        warnings.simplefilter("always")
        wait_until_made_ahead(iterator, 1)  # batch 4, which warns, is made meanwhile
    assert meanwhile == []
    assert early + _warnings_per_call(iterator, 1) == expected
    iterator.close()


def test_dataset_warnings_reach_the_consumer(backend: str) -> None:
    loader = DataLoaderX(WarningDataset(6), batch_size=1, backend=backend)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        values = [int(batch) for batch in loader]
    assert values == list(range(6))
    assert [str(w.message) for w in caught] == ["odd item 1", "odd item 3", "odd item 5"]
    assert all(w.category is UserWarning for w in caught)


def test_warnings_from_a_producer_are_not_shown_in_other_threads(backend: str) -> None:
    loader = DataLoaderX(WarningDataset(4), batch_size=1, backend=backend)
    iterator = iter(loader)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        next(iterator)  # item 0; the producer makes item 1 (which warns) meanwhile
        wait_until_made_ahead(iterator, 1)
        seen_before_handout = [str(w.message) for w in caught]
        next(iterator)
        seen_after_handout = [str(w.message) for w in caught]
    iterator.close()
    assert seen_before_handout == []
    assert seen_after_handout == ["odd item 1"]


# 10. Delegation to PyTorch's iterator --------------------------------------------------


def test_iterator_delegates_pytorch_internals(backend: str) -> None:
    dataset = RangeDataset(20)
    reference_iter = iter(DataLoader(dataset, batch_size=2, num_workers=2))
    iterator = iter(DataLoaderX(dataset, batch_size=2, num_workers=2, backend=backend))
    assert len(iterator._workers) == len(reference_iter._workers) == 2
    assert callable(iterator._shutdown_workers)
    assert iterator._dataset is dataset
    for _ in range(3):
        next(iterator)
        next(reference_iter)
    assert iterator._num_yielded == reference_iter._num_yielded == 3
    with pytest.raises(AttributeError):
        _ = iterator.no_such_attribute
    iterator.close()
    del reference_iter
    gc.collect()


class StuckFrom(Dataset[torch.Tensor]):
    """Items from ``stuck_from`` on wait for ``go`` (a minute at most: longer than the test
    may take); counts the items begun, which one thread at a time reads."""

    def __init__(self, size: int, stuck_from: int) -> None:
        self.size = size
        self.stuck_from = stuck_from
        self.go = threading.Event()
        self.stuck_ended = threading.Event()
        self.begun = 0

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> torch.Tensor:
        self.begun += 1
        if index >= self.stuck_from:
            self.go.wait(timeout=60)
            self.stuck_ended.set()
        return torch.tensor(index)


def test_leaving_during_a_batch_that_never_ends_stops_the_producer_after_it(
    backend: str,
) -> None:
    threads = set(threading.enumerate())
    children = child_pids()
    dataset = StuckFrom(50, stuck_from=2)
    loader = DataLoaderX(dataset, batch_size=1, backend=backend)
    for index, _ in enumerate(loader):
        if index == 1:
            break
    # Leaving did not wait for the batch under way (if any), which only ``go`` ends ...
    assert not dataset.stuck_ended.is_set()
    begun = dataset.begun
    dataset.go.set()
    left_threads, left_children = wait_until_clean(threads, children, within=CLEAN_WITHIN)
    assert left_threads == []
    assert left_children == set()
    # ... and the producer began no batch after it.
    assert dataset.begun == begun
