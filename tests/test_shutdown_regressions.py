"""Shutdown corner cases found by the reliability tests: the producer never outlives close()."""

from __future__ import annotations

import gc
import os
import threading
import time
from typing import Any

import pytest
import torch
from torch.utils.data import Dataset

from dataloaderx import DataLoaderX
from dataloaderx.epoch import iterator as epoch_iterator
from tests.helpers import (
    FailingDataset,
    RangeDataset,
    SlowDataset,
    child_pids,
    wait_for,
    wait_until_clean,
)
from tests.reliability_support import takes_depth

pytestmark = pytest.mark.timeout(60)


class CollectingDataset(Dataset[torch.Tensor]):
    """From index 2 on, waits for ``go`` and then runs the garbage collector, noting in which
    thread; ``collected`` is set once a collection there has ended."""

    def __init__(self, size: int, go: threading.Event) -> None:
        self.size = size
        self.go = go
        self.collected = threading.Event()
        self.collector: threading.Thread | None = None

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> torch.Tensor:
        if index >= 2 and self.go.wait(timeout=60.0):
            self.collector = threading.current_thread()
            gc.collect()
            self.collected.set()
        return torch.tensor(index)


def test_iterator_collected_in_its_producer_thread_stops(
    backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    if not takes_depth(backend):
        pytest.skip(f"{backend} runs no producer thread")
    threads = set(threading.enumerate())
    children = child_pids()
    finalised_in: list[threading.Thread] = []

    def shut_down(*args: Any) -> None:
        finalised_in.append(threading.current_thread())
        real_shut_down(*args)

    real_shut_down = epoch_iterator._shut_down
    monkeypatch.setattr(epoch_iterator, "_shut_down", shut_down)  # what iter() finalises with
    go = threading.Event()
    dataset = CollectingDataset(50, go)
    loader = DataLoaderX(
        dataset, batch_size=1, backend=backend, backend_options=_depth_one(backend)
    )
    iterator = iter(loader)
    assert int(next(iterator)) == 0
    iterator.cycle = iterator  # only the garbage collector can free it now
    gc.disable()  # ... and only the producer's, not one this thread's allocations start
    try:
        del iterator
        go.set()  # the producer, making batch 2 with its buffer full, runs the collector
        assert dataset.collected.wait(timeout=60.0)
    finally:
        gc.enable()
    assert dataset.collector is not None
    assert dataset.collector is not threading.current_thread()
    assert finalised_in == [dataset.collector]  # the finaliser ran in the producer thread
    left_threads, left_children = wait_until_clean(threads, children, within=30.0)
    assert left_threads == []
    assert left_children == set()


def _depth_one(backend: str) -> dict[str, int]:
    return {"depth": 1} if takes_depth(backend) else {}


@pytest.mark.parametrize("size", [0, 1, 2])
def test_short_epochs_with_a_full_buffer_leave_no_thread(backend: str, size: int) -> None:
    # The producer's end marker must get through even when its buffer of 1 is full.
    threads = set(threading.enumerate())
    children = child_pids()
    loader = DataLoaderX(RangeDataset(size), backend=backend, backend_options=_depth_one(backend))
    for _ in range(3):
        assert len(list(loader)) == size
    left_threads, left_children = wait_until_clean(threads, children, within=30.0)
    assert left_threads == []
    assert left_children == set()


def test_closing_in_a_forked_child_leaves_the_parents_workers_alone(backend: str) -> None:
    # A forked process (a DataLoader worker, for example) inherits the parent's iterators;
    # the garbage collector may finalise one there. That must not stop the parent's epoch.
    loader = DataLoaderX(RangeDataset(12), batch_size=2, num_workers=2, backend=backend)
    iterator = iter(loader)
    first = next(iterator)
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 0
        try:
            iterator.close()
        except BaseException:  # noqa: BLE001 - reported through the exit status
            code = 1
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    rest = list(iterator)
    assert [int(batch[0, 0]) for batch in [first, *rest]] == [0, 2, 4, 6, 8, 10]


def test_a_close_from_another_thread_shuts_the_workers_down_before_it_returns(
    backend: str,
) -> None:
    loader = DataLoaderX(SlowDataset(1000, 0.01), batch_size=2, num_workers=2, backend=backend)
    iterator = iter(loader)
    next(iterator)
    workers = list(iterator._workers)
    closer = threading.Thread(target=iterator.close, name="closer")
    closer.start()
    closer.join(timeout=30)
    assert not closer.is_alive()
    # Released, and the workers with it, before the loop calls again: unless the producer's
    # read under way outlasted close()'s budget, and releases them itself as it ends.
    source = iterator.source
    reading = source.lock.locked()  # first: a read that ended has released by then
    assert source.closing.locked()
    if not reading:
        assert source.released
        assert not any(worker.is_alive() for worker in workers)
    assert wait_for(lambda: not any(worker.is_alive() for worker in workers))
    with pytest.raises(StopIteration):
        next(iterator)


def test_a_close_from_another_thread_never_races_the_loops_reads(backend: str) -> None:
    got: list[int] = []
    failures: list[BaseException] = []
    started = threading.Event()
    epoch: list[Any] = []

    def loop() -> None:
        loader = DataLoaderX(SlowDataset(1000, 0.002), num_workers=2, backend=backend)
        iterator = iter(loader)
        epoch.extend([iterator, list(iterator._workers)])
        started.set()
        try:
            got.extend(int(batch) for batch in iterator)
        except BaseException as exc:  # noqa: BLE001 - reported below
            failures.append(exc)

    reader = threading.Thread(target=loop, name="training loop")
    reader.start()
    assert started.wait(timeout=30)
    deadline = time.monotonic() + 30
    while len(got) < 20 and time.monotonic() < deadline:
        time.sleep(0.01)
    epoch[0].close()
    reader.join(timeout=30)
    assert not reader.is_alive()
    assert failures == []
    assert got == list(range(len(got)))  # the epoch ended after the batches it handed out
    assert 20 <= len(got) < 1000
    # (Released by close(), or by a producer whose read outlasted close()'s budget.)
    assert wait_for(lambda: not any(worker.is_alive() for worker in epoch[1]))


def test_an_epoch_left_at_an_error_shuts_its_workers_down_at_once(backend: str) -> None:
    # DataLoader keeps such an epoch, workers and all, until the garbage collector finds the
    # reference cycle of the error (PyTorch issue 149837); here it ends as after a break.
    children = child_pids()
    loader = DataLoaderX(
        FailingDataset(8, frozenset({2})), batch_size=1, num_workers=2, backend=backend
    )
    gc.disable()
    try:
        with pytest.raises(ValueError, match="bad index 2"):
            for _batch in loader:
                pass
        assert child_pids() - children == set()  # no collection ran: shut down on leaving
    finally:
        gc.enable()
