"""Switching between a producer thread and inline batches: invisible to the loop."""

from __future__ import annotations

import threading
import warnings
from collections.abc import Iterator, Sequence
from typing import Any

import pytest
from torch.utils.data import DataLoader

from dataloaderx import DataLoaderX
from dataloaderx.backends import _adaptive
from dataloaderx.backends._adaptive import start_adaptive_stream
from dataloaderx.backends._mode_decision import Cycle, ModeChooser
from tests.helpers import (
    Counter,
    FailingDataset,
    RangeDataset,
    SwitchingPolicy,
    WarningDataset,
    assert_same,
    assert_same_events,
    run_events,
)

pytestmark = pytest.mark.timeout(60)


def counting(limit: int, made_in: list[str]) -> Iterator[int]:
    for value in range(limit):
        made_in.append(threading.current_thread().name)
        yield value


def test_every_item_once_in_order_across_switches() -> None:
    made_in: list[str] = []
    policy = SwitchingPolicy("PIPPIIPPPI")
    stream = start_adaptive_stream(counting(200, made_in), backend="test", depth=3, policy=policy)
    assert list(stream) == list(range(200))
    producers = {name for name in made_in if name.startswith("dataloaderx-test-")}
    assert len(producers) > 10  # a new producer thread after each switch to prefetch
    assert threading.current_thread().name in made_in  # and batches made inline
    stream.close()


def test_hooks_run_in_the_right_thread() -> None:
    seen: list[tuple[str, str]] = []
    main = threading.current_thread().name

    def where(hook: str) -> None:
        seen.append((hook, "main" if threading.current_thread().name == main else "producer"))

    def prepare(item: int) -> int:
        where("prepare")
        return item

    def inline_prepare(item: int) -> int:
        where("inline_prepare")
        return item

    def handout(item: int) -> int:
        where("handout")
        return item

    stream = start_adaptive_stream(
        iter(range(30)),
        backend="test",
        depth=2,
        prepare=prepare,
        on_start=lambda: where("on_start"),
        handout=handout,
        inline_prepare=inline_prepare,
        policy=SwitchingPolicy("PPIIP"),
    )
    assert list(stream) == list(range(30))
    assert {place for hook, place in seen if hook == "on_start"} == {"producer"}
    assert {place for hook, place in seen if hook == "prepare"} == {"producer"}
    assert {place for hook, place in seen if hook == "inline_prepare"} == {"main"}
    assert {place for hook, place in seen if hook == "handout"} == {"main"}
    made = sum(1 for hook, _ in seen if hook in ("prepare", "inline_prepare"))
    assert made == 30  # each item prepared exactly once, one way or the other
    assert sum(1 for hook, _ in seen if hook == "handout") == 30


def test_inline_prepare_defaults_to_prepare() -> None:
    stream = start_adaptive_stream(
        iter(range(12)),
        backend="test",
        depth=2,
        prepare=lambda item: item * 10,
        policy=SwitchingPolicy("IP"),
    )
    assert list(stream) == [10 * item for item in range(12)]


def test_inline_makes_no_batch_ahead() -> None:
    counter = Counter()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(_adaptive, "new_policy", lambda: SwitchingPolicy("PPPPIIIIII"))
        loader = DataLoaderX(RangeDataset(40), batch_size=1, collate_fn=counter)
    iterator = iter(loader)
    for _ in range(8):  # four prefetched, the buffer drained, then inline
        next(iterator)
    before = counter.count
    next(iterator)
    assert counter.count == before + 1  # made on demand, as DataLoader does
    iterator.close()


@pytest.mark.parametrize("pattern", ["PIIPPI", "PIIIIIIIIIIIP"])
@pytest.mark.parametrize("num_workers", [0, 2])
def test_errors_and_warnings_match_dataloader_across_switches(
    num_workers: int, pattern: str
) -> None:
    dataset = FailingDataset(30, frozenset({2, 3, 9, 17}))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(_adaptive, "new_policy", lambda: SwitchingPolicy(pattern))
        loader = DataLoaderX(dataset, batch_size=2, num_workers=num_workers)
    expected = run_events(iter(DataLoader(dataset, batch_size=2, num_workers=num_workers)))
    assert_same_events(run_events(iter(loader)), expected)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(_adaptive, "new_policy", lambda: SwitchingPolicy(pattern))
        warning_loader = DataLoaderX(WarningDataset(20), batch_size=1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        batches = list(warning_loader)
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        assert_same(batches, list(DataLoader(WarningDataset(20), batch_size=1)))
    assert [str(w.message) for w in caught] == [f"odd item {i}" for i in range(1, 20, 2)]


@pytest.mark.parametrize("stop_after", [1, 2, 3, 4, 5, 6])
def test_break_or_close_at_any_point_of_a_switch(stop_after: int) -> None:
    # Pattern "PPPI...": batches 4 and on are a drain, then inline; stop anywhere in it.
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(_adaptive, "new_policy", lambda: SwitchingPolicy("PPPIII"))
        loader = DataLoaderX(RangeDataset(40), batch_size=1, num_workers=2)
    for _ in range(2):
        for index, _batch in enumerate(loader):
            if index + 1 == stop_after:
                break
    iterator = iter(loader)
    for _ in range(stop_after):
        next(iterator)
    iterator.close()
    iterator.close()
    with pytest.raises(StopIteration):
        next(iterator)


def test_persistent_workers_and_epochs_with_switches() -> None:
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(_adaptive, "new_policy", lambda: SwitchingPolicy("PIPPI"))
        loader = DataLoaderX(RangeDataset(30), batch_size=4, num_workers=2, persistent_workers=True)
    reference = DataLoader(RangeDataset(30), batch_size=4)
    for epoch in range(4):
        if epoch % 2:
            for index, _batch in enumerate(loader):
                if index == 2:
                    break
        else:
            assert_same(list(loader), list(reference))


def test_stats_report_the_mode_and_why() -> None:
    loader = DataLoaderX(RangeDataset(40), batch_size=1)
    list(loader)
    stats = loader.stats
    assert stats is not None
    assert stats.mode is not None
    mode, _, rest = stats.mode.partition(" (")
    assert mode in ("prefetch", "inline")
    assert "prefetch" in rest
    assert rest.endswith(" of 40 batches prefetched")
    fixed = DataLoaderX(RangeDataset(4), backend_options={"adaptive": False})
    list(fixed)
    assert fixed.stats is not None
    assert fixed.stats.mode is None


def test_decides_with_stats_off() -> None:
    loader = DataLoaderX(RangeDataset(60), batch_size=1, backend_options={"stats": False})
    list(loader)
    chooser: Any = loader.prefetch_backend._policy  # type: ignore[attr-defined]
    assert chooser.decisions == 1


def test_auto_on_a_cpu_adapts_and_can_be_fixed() -> None:
    adaptive = DataLoaderX(RangeDataset(8), backend="auto")
    fixed = DataLoaderX(RangeDataset(8), backend="auto", backend_options={"adaptive": False})
    if adaptive.prefetch_backend.describe()["resolved"] != "thread":
        pytest.skip("auto runs as cuda here, which does not adapt")
    assert_same(list(adaptive), list(DataLoader(RangeDataset(8))))
    assert adaptive.stats is not None
    assert adaptive.stats.mode is not None
    assert_same(list(fixed), list(DataLoader(RangeDataset(8))))
    assert fixed.stats is not None
    assert fixed.stats.mode is None


@pytest.mark.parametrize("num_workers", [0, 2])
def test_the_policy_learns_whether_worker_processes_may_make_the_batches(
    num_workers: int,
) -> None:
    policy = SwitchingPolicy("PI")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(_adaptive, "new_policy", lambda: policy)
        loader = DataLoaderX(RangeDataset(12), batch_size=4, num_workers=num_workers)
    assert_same(list(loader), list(DataLoader(RangeDataset(12), batch_size=4)))
    # Once per stream opened (a single-process epoch opens a second one at its end).
    assert policy.helper_processes
    assert set(policy.helper_processes) == {num_workers > 0}


def test_steady_inline_runs_tell_the_policy_of_every_cycle_in_bulk() -> None:
    # Runs of inline batches between prefetched ones; inside the longest runs neither
    # mode is probed, so the stream hands those cycles over in bulk.
    made_in: list[str] = []
    policy = SwitchingPolicy("PPIIIIIIIIIIIIII", probe_every=16)
    stream = start_adaptive_stream(counting(300, made_in), backend="test", depth=2, policy=policy)
    assert list(stream) == list(range(300))
    assert policy.cycles == 300  # each batch once: one by one or in bulk
    assert sum(policy.bulk) > 150
    assert max(policy.bulk) > 1
    # Made where the policy said: inline runs in this thread, the rest by producers.
    main = threading.current_thread().name
    inline = [index for index, name in enumerate(made_in) if name == main]
    assert {index % 16 for index in inline} >= set(range(3, 16))


def test_an_epoch_that_ends_in_a_steady_run_hands_over_its_last_cycles() -> None:
    policy = SwitchingPolicy("PIII" + "I" * 60, probe_every=64)
    stream = start_adaptive_stream(iter(range(40)), backend="test", depth=2, policy=policy)
    assert list(stream) == list(range(40))
    assert policy.cycles == 40
    assert policy.bulk[-1] < 40  # a partial run, handed over at the end


class FailsAt:
    """``range(limit)`` whose item ``failing`` raises instead, and then goes on."""

    def __init__(self, limit: int, failing: int) -> None:
        self._next = 0
        self._limit = limit
        self._failing = failing

    def __iter__(self) -> FailsAt:
        return self

    def __next__(self) -> int:
        value = self._next
        if value >= self._limit:
            raise StopIteration
        self._next += 1
        if value == self._failing:
            raise ValueError(f"batch {value}")
        return value


def test_a_failed_batch_in_a_steady_run_ends_no_cycle() -> None:
    policy = SwitchingPolicy("PI" + "I" * 60, probe_every=64)
    stream = start_adaptive_stream(FailsAt(30, 12), backend="test", depth=2, policy=policy)
    got: list[object] = []
    while True:
        try:
            got.append(next(stream))
        except StopIteration:
            break
        except ValueError as error:
            got.append(str(error))
    assert got == [*range(12), "batch 12", *range(13, 30)]
    # Every outcome ends a cycle the policy hears of, but the failure and the batch
    # after it (whose cycle would include the loop's handling of the error).
    assert policy.cycles == 30 - 2


def test_closing_in_a_steady_run_stops_it_and_tells_the_policy_nothing_more() -> None:
    policy = SwitchingPolicy("PI" + "I" * 60, probe_every=64)
    stream = start_adaptive_stream(iter(range(100)), backend="test", depth=2, policy=policy)
    for _ in range(20):
        next(stream)
    stream.close()
    observed = policy.cycles
    with pytest.raises(StopIteration):
        next(stream)
    stream.close()
    assert policy.cycles == observed


class CountingChooser(ModeChooser):
    """The measured decision, counting the cycles it is told of either way."""

    def __init__(self) -> None:
        super().__init__()
        self.cycles = 0
        self.in_bulk = 0

    def observe(self, cycle: Cycle) -> None:
        self.cycles += 1
        super().observe(cycle)

    def observe_steady(self, count: int, latest: Sequence[float]) -> None:
        self.cycles += count
        self.in_bulk += count
        super().observe_steady(count, latest)


def test_the_measured_decision_hears_of_every_batch_of_an_inline_loader() -> None:
    chooser = CountingChooser()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(_adaptive, "new_policy", lambda: chooser)
        loader = DataLoaderX(RangeDataset(500), batch_size=1)
    for epoch in range(3):
        assert_same(list(loader), list(DataLoader(RangeDataset(500), batch_size=1)))
        if chooser.wanted == "prefetch":
            pytest.skip("prefetching paid on this machine: there is no inline run to check")
        assert chooser.cycles == 500 * (epoch + 1)
    assert chooser.in_bulk > 1000
    assert loader.stats is not None
    assert loader.stats.mode is not None
    assert loader.stats.mode.endswith(" of 500 batches prefetched")
