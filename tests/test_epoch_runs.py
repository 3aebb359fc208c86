"""Inline batches: PyTorch's iterator and a count, and the runs an epoch reports in bulk."""

from __future__ import annotations

import gc
import math
import traceback
import weakref
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from dataloaderx import DataLoaderX, PrefetchIterator, prefetch
from dataloaderx.backends.sync import SyncBackend
from dataloaderx.backends.thread import ThreadBackend
from dataloaderx.engine import decision as mode_decision
from dataloaderx.epoch import state as epoch_state
from tests.helpers import (
    FailingDataset,
    RangeDataset,
    SwitchingPolicy,
    assert_same,
    assert_same_events,
    run_events,
)

pytestmark = pytest.mark.timeout(60)

#: Backends that make batches inline here: ``sync`` always, ``thread`` as the scripted
#: always-inline policy below says (the measured decision would pick inline too, for a tiny
#: dataset and an empty loop, but not on every run of a loaded machine).
INLINE_BACKENDS = ["sync", "thread"]


@pytest.fixture(autouse=True)
def always_inline(monkeypatch: pytest.MonkeyPatch) -> None:
    """Adaptive loaders of these tests make every batch inline, in runs of up to 63 batches
    reported at once (one batch in 64 is measured, and reported, on its own)."""
    monkeypatch.setattr(mode_decision, "new_policy", lambda: SwitchingPolicy("I", probe_every=64))


def inline_loader(backend: str, dataset: Dataset[Any], **kwargs: Any) -> DataLoaderX[Any]:
    """A loader of ``backend`` that made one epoch inline already: the next is its second."""
    loader = DataLoaderX(dataset, backend=backend, **kwargs)
    run_events(iter(loader))
    stats = loader.stats
    assert stats is not None
    assert stats.mode is None or stats.mode.startswith("inline"), stats.mode
    return loader


def in_a_run(iterator: PrefetchIterator[Any]) -> bool:
    """Whether a run of batches is under way, its cycles not yet reported."""
    run = iterator._epoch.run
    return 0 < run.made < run.length


class CallCounter:
    """Counts calls of a method, patched on its class."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, cls: type, name: str) -> None:
        self.calls = 0
        original = getattr(cls, name)

        def counted(obj: Any, *args: Any) -> Any:
            self.calls += 1
            return original(obj, *args)

        monkeypatch.setattr(cls, name, counted)


@pytest.mark.parametrize(
    ("backend", "backend_class"), [("sync", SyncBackend), ("thread", ThreadBackend)]
)
def test_inline_batches_open_no_producer_and_match_dataloader(
    monkeypatch: pytest.MonkeyPatch, backend: str, backend_class: type
) -> None:
    loader = inline_loader(backend, RangeDataset(600), batch_size=1)
    opened = CallCounter(monkeypatch, backend_class, "open")
    assert_same(list(loader), list(DataLoader(RangeDataset(600), batch_size=1)))
    assert opened.calls == 0  # every batch made inline: no stream, no thread
    assert loader.stats is not None
    assert loader.stats.batches == 600


@pytest.mark.parametrize("backend", INLINE_BACKENDS)
@pytest.mark.parametrize("num_workers", [0, 2])
def test_state_dict_between_two_batches_of_a_run_counts_every_batch(
    backend: str, num_workers: int
) -> None:
    loader = inline_loader(
        backend, RangeDataset(300), batch_size=2, shuffle=True, num_workers=num_workers
    )
    iterator = iter(loader)
    seen = [next(iterator) for _ in range(37)]
    while not in_a_run(iterator):  # until a run is under way, not yet reported
        seen.append(next(iterator))
    state = loader.state_dict()
    assert state["consumed"] == len(seen)
    rest = list(iterator)
    resumed = DataLoaderX(
        RangeDataset(300), batch_size=2, shuffle=True, num_workers=num_workers, backend=backend
    )
    resumed.load_state_dict(state)
    assert_same(list(resumed), rest)
    assert len(seen) + len(rest) == 150


@pytest.mark.parametrize("backend", INLINE_BACKENDS)
def test_stats_count_the_batches_of_a_run_under_way_and_when_it_ends(backend: str) -> None:
    loader = inline_loader(backend, RangeDataset(200), batch_size=1)
    iterator = iter(loader)
    handed_out = 0
    while handed_out < 21 or not in_a_run(iterator):  # a run under way, not reported
        next(iterator)
        handed_out += 1
    middle = loader.stats
    assert middle is not None
    assert middle.batches == handed_out
    assert middle.occupancy[0] == handed_out
    assert 0 < middle.wait_seconds <= middle.elapsed_seconds
    list(iterator)
    done = loader.stats
    assert done is not None
    assert done.batches == 200
    assert sum(done.occupancy) == 201  # and the call that ended the epoch
    assert 0 < done.produce_seconds <= done.wait_seconds <= done.elapsed_seconds
    assert done.producer_blocked_seconds is None  # no producer thread made a batch
    if backend == "thread":
        assert done.mode is not None
        assert done.mode.endswith("0 of 200 batches prefetched")


@pytest.mark.parametrize("backend", INLINE_BACKENDS)
def test_a_traced_epoch_times_every_batch(backend: str) -> None:
    loader = inline_loader(
        backend, RangeDataset(100), batch_size=1, backend_options={"stats": "trace"}
    )
    list(loader)
    done = loader.stats
    assert done is not None
    kinds = [kind for kind, _, _ in done.trace]
    assert kinds.count("wait") == 101
    assert kinds.count("produce") == 101
    assert done.batches == 100


@pytest.mark.parametrize("backend", INLINE_BACKENDS)
@pytest.mark.parametrize("num_workers", [0, 2])
def test_errors_in_a_run_reach_the_loop_as_from_dataloader(backend: str, num_workers: int) -> None:
    failing = frozenset({3, 40, 41, 97})
    loader = inline_loader(
        backend, FailingDataset(120, failing), batch_size=1, num_workers=num_workers
    )
    expected = run_events(iter(DataLoader(FailingDataset(120, failing), num_workers=num_workers)))
    assert_same_events(run_events(iter(loader)), expected)
    assert loader.stats is not None
    assert loader.stats.batches == 120 - len(failing)


def test_a_failed_batch_keeps_its_traceback_and_counts_as_consumed() -> None:
    loader = inline_loader("sync", FailingDataset(50, frozenset({30})), batch_size=1)
    iterator = iter(loader)
    for _ in range(30):
        next(iterator)
    assert in_a_run(iterator)  # batch 30 is made in a run
    with pytest.raises(ValueError, match="bad index 30") as raised:
        next(iterator)
    frames = [frame.name for frame in traceback.extract_tb(raised.value.__traceback__)]
    assert "__getitem__" in frames  # where the dataset raised it
    assert loader.state_dict()["consumed"] == 31
    assert int(next(iterator)) == 31  # the loop may go on, as with DataLoader


class InterruptedAt(Dataset[torch.Tensor]):
    """Raises ``KeyboardInterrupt`` at index ``at``, once."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.at: int | None = None

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> torch.Tensor:
        if index == self.at:
            self.at = None
            raise KeyboardInterrupt(f"interrupted at {index}")
        return torch.tensor(index)


@pytest.mark.parametrize("backend", INLINE_BACKENDS)
def test_ctrl_c_in_a_run_reaches_the_loop_and_the_loader_goes_on_like_dataloader(
    backend: str,
) -> None:
    dataset = InterruptedAt(80)
    loader = inline_loader(backend, dataset, batch_size=1)
    iterator = iter(loader)
    got = [int(next(iterator)) for _ in range(25)]
    dataset.at = 25
    with pytest.raises(KeyboardInterrupt, match="interrupted at 25"):
        next(iterator)
    got.extend(int(batch) for batch in iterator)
    assert got == [*range(25), *range(26, 80)]


@pytest.mark.parametrize("backend", INLINE_BACKENDS)
def test_closing_in_a_run_ends_the_epoch_and_keeps_the_counts(backend: str) -> None:
    loader = inline_loader(backend, RangeDataset(100), batch_size=1)
    iterator = iter(loader)
    for _ in range(10):
        next(iterator)
    assert in_a_run(iterator)
    iterator.close()
    assert loader.state_dict()["consumed"] == 10
    assert loader.stats is not None
    assert loader.stats.batches == 10
    if backend == "thread":
        assert loader.stats.mode is not None
        assert loader.stats.mode.endswith("0 of 10 batches prefetched")
    with pytest.raises(StopIteration):
        next(iterator)


@pytest.mark.parametrize("backend", INLINE_BACKENDS)
@pytest.mark.parametrize(
    ("num_workers", "persistent", "failing"),
    [
        (0, False, frozenset({5, 39})),
        # Without failures: PyTorch's own re-raise of a worker's error keeps a cycle.
        (2, False, frozenset()),
        (2, True, frozenset()),
    ],
)
def test_the_iterator_is_freed_without_the_garbage_collector(
    backend: str, num_workers: int, persistent: bool, failing: frozenset[int]
) -> None:
    # An error or end of epoch that the source raises again must not be kept in a
    # reference cycle, or the worker processes would wait for the garbage collector.
    loader = inline_loader(
        backend,
        FailingDataset(40, failing),
        batch_size=1,
        num_workers=num_workers,
        persistent_workers=persistent,
    )
    gc.collect()
    gc.disable()
    try:
        iterator = iter(loader)
        assert len(run_events(iterator)) == 40
        freed = weakref.ref(iterator)
        del iterator
        assert freed() is None
        inner = weakref.ref(loader._iterator) if persistent else None
        del loader
        assert inner is None or inner() is None
    finally:
        gc.enable()


@pytest.mark.parametrize("steady_budget", [math.inf, 0.0])
def test_runs_report_every_cycle_to_the_policy(
    monkeypatch: pytest.MonkeyPatch, steady_budget: float
) -> None:
    # With a budget of no time at all, every run is reported after its first batch.
    policies: list[SwitchingPolicy] = []

    def new_policy() -> SwitchingPolicy:
        policies.append(SwitchingPolicy("I" * 32, probe_every=64, steady_budget=steady_budget))
        return policies[-1]

    monkeypatch.setattr(mode_decision, "new_policy", new_policy)
    failing = frozenset({20, 70, 71})
    loader = DataLoaderX(FailingDataset(320, failing), batch_size=1)
    expected = run_events(iter(DataLoader(FailingDataset(320, failing), batch_size=1)))
    for _ in range(2):
        assert_same_events(run_events(iter(loader)), expected)
    (policy,) = policies
    # Every batch ends a cycle, but the epoch's first, the failures and the batch after each.
    assert policy.cycles == 2 * (320 - 1 - 3 - 2)
    if steady_budget:
        assert max(policy.bulk) > 16  # long runs, reported at once
        assert policy.overruns == 0
    else:
        assert max(policy.bulk) == 1
        assert policy.overruns > 100


def test_prefetch_of_any_iterable_makes_sync_batches_inline(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    opened = CallCounter(monkeypatch, SyncBackend, "open")
    source = [torch.tensor(value) for value in range(500)]
    assert_same(list(prefetch(source, backend="sync")), source)
    assert opened.calls == 0


@pytest.mark.parametrize("backend", ["sync", "background"])
def test_an_epoch_longer_than_an_endless_run_counts_on(
    monkeypatch: pytest.MonkeyPatch, backend: str
) -> None:
    monkeypatch.setattr(epoch_state, "ENDLESS", 5)  # a run of a policy-less epoch
    loader = DataLoaderX(RangeDataset(23), batch_size=1, backend=backend)
    iterator = iter(loader)
    assert_same(list(iterator), list(DataLoader(RangeDataset(23), batch_size=1)))
    assert iterator._num_yielded == 23
    assert len(iterator._epoch.run.ends) <= 6  # the tail of one run, not the epoch's
    assert loader.stats is not None
    assert loader.stats.batches == 23
