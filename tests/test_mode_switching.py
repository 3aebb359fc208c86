"""Switching between a producer thread and inline batches: invisible to the loop."""

from __future__ import annotations

import itertools
import math
import threading
import warnings
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import pytest
from torch.utils.data import DataLoader

from dataloaderx import DataLoaderX, PrefetchIterator
from dataloaderx.contracts.backend import Backend, BatchStream, InlineMode
from dataloaderx.contracts.policy import Cycles, ModePolicy
from dataloaderx.engine import decision as mode_decision
from dataloaderx.engine.decision import ModeDecision
from dataloaderx.engine.producer import Hooks, start_producer
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

T = TypeVar("T")


class Scripted(Backend):
    """A backend with a producer thread and an inline mode, switched by ``policy``."""

    name = "test"

    def __init__(
        self,
        policy: ModePolicy,
        hooks: Hooks = Hooks(),  # noqa: B008 - an immutable value
        inline_prepare: Callable[[Any], Any] | None = None,
        depth: int = 2,
    ) -> None:
        self._policy = policy
        self._hooks = hooks
        self._inline_prepare = inline_prepare
        self.depth = depth
        self.max_depth: int | None = None
        self.max_bytes: int | None = None

    def inline_mode(self) -> InlineMode:
        return InlineMode(self._policy, self._inline_prepare)

    def open(self, source: Iterator[T]) -> BatchStream[T]:
        return start_producer(source, self, self._hooks)


def epoch(source: Iterator[Any], backend: Backend) -> PrefetchIterator[Any]:
    return PrefetchIterator(source, backend, None)


def counting(limit: int, made_in: list[str]) -> Iterator[int]:
    for value in range(limit):
        made_in.append(threading.current_thread().name)
        yield value


def test_every_item_once_in_order_across_switches() -> None:
    made_in: list[str] = []
    policy = SwitchingPolicy("PIPPIIPPPI")
    assert list(epoch(counting(200, made_in), Scripted(policy, depth=3))) == list(range(200))
    producers = {name for name in made_in if name.startswith("dataloaderx-test-")}
    assert len(producers) > 10  # a new producer thread after each switch to prefetch
    assert threading.current_thread().name in made_in  # and batches made inline


def test_hooks_run_in_the_right_thread() -> None:
    seen: list[tuple[str, str]] = []
    main = threading.current_thread().name

    def hook(name: str) -> Callable[[int], int]:
        def noted(item: int) -> int:
            seen.append((name, "main" if threading.current_thread().name == main else "producer"))
            return item

        return noted

    hooks = Hooks(
        on_start=lambda: hook("on_start")(0) and None,
        prepare=hook("prepare"),
        handout=hook("handout"),
    )
    backend = Scripted(SwitchingPolicy("PPIIP"), hooks, inline_prepare=hook("inline_prepare"))
    assert list(epoch(iter(range(30)), backend)) == list(range(30))
    places = {hook: {place for name, place in seen if name == hook} for hook, _ in seen}
    assert places == {
        "on_start": {"producer"},
        "prepare": {"producer"},
        "handout": {"main"},
        "inline_prepare": {"main"},
    }
    prefetched = sum(1 for name, _ in seen if name == "prepare")
    inline = sum(1 for name, _ in seen if name == "inline_prepare")
    assert prefetched + inline == 30  # each item prepared exactly once, one way or the other
    assert prefetched
    assert inline
    assert sum(1 for name, _ in seen if name == "handout") == prefetched


def test_inline_makes_no_batch_ahead() -> None:
    counter = Counter()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(mode_decision, "new_policy", lambda: SwitchingPolicy("PPPPIIIIII"))
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
        patch.setattr(mode_decision, "new_policy", lambda: SwitchingPolicy(pattern))
        loader = DataLoaderX(dataset, batch_size=2, num_workers=num_workers)
    expected = run_events(iter(DataLoader(dataset, batch_size=2, num_workers=num_workers)))
    assert_same_events(run_events(iter(loader)), expected)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(mode_decision, "new_policy", lambda: SwitchingPolicy(pattern))
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
        patch.setattr(mode_decision, "new_policy", lambda: SwitchingPolicy("PPPIII"))
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
        patch.setattr(mode_decision, "new_policy", lambda: SwitchingPolicy("PIPPI"))
        loader = DataLoaderX(RangeDataset(30), batch_size=4, num_workers=2, persistent_workers=True)
    reference = DataLoader(RangeDataset(30), batch_size=4)
    for epoch_number in range(4):
        if epoch_number % 2:
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


def test_decides_with_stats_off(monkeypatch: pytest.MonkeyPatch) -> None:
    # The measured decision, but a prefetch decision can only come from its probe, which it
    # takes at once, for good: one compared with inline cycles never pays (a tie margin of
    # 100%), so it is not settled and confirmed (a second decision) within these batches.
    monkeypatch.setattr(mode_decision, "TIE_MARGIN", 1.0)
    loader = DataLoaderX(RangeDataset(60), batch_size=1, backend_options={"stats": False})
    list(loader)
    decided: Any = loader.prefetch_backend._policy  # type: ignore[attr-defined]
    assert decided.decisions == 1


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


def test_auto_on_a_cpu_transforms_batches_made_either_way() -> None:
    def double(batch: Any) -> Any:
        return batch * 2

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(mode_decision, "new_policy", lambda: SwitchingPolicy("PIIPPI"))
        loader = DataLoaderX(
            RangeDataset(24), backend="auto", backend_options={"transform": double}
        )
    if loader.prefetch_backend.describe()["resolved"] != "thread":
        pytest.skip("auto runs as cuda here")
    expected = [batch * 2 for batch in DataLoader(RangeDataset(24))]
    assert_same(list(loader), expected)
    assert loader.stats is not None
    assert loader.stats.mode is not None
    assert not loader.stats.mode.endswith(" 0 of 24 batches prefetched")
    assert not loader.stats.mode.endswith(" 24 of 24 batches prefetched")


@pytest.mark.parametrize("num_workers", [0, 2])
def test_the_policy_learns_whether_worker_processes_may_make_the_batches(
    num_workers: int,
) -> None:
    policy = SwitchingPolicy("PI")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(mode_decision, "new_policy", lambda: policy)
        loader = DataLoaderX(RangeDataset(12), batch_size=4, num_workers=num_workers)
    assert_same(list(loader), list(DataLoader(RangeDataset(12), batch_size=4)))
    assert_same(list(loader), list(DataLoader(RangeDataset(12), batch_size=4)))
    assert policy.helper_processes == [num_workers > 0] * 2  # once per epoch


def reported(policy: SwitchingPolicy, mode: str) -> int:
    return sum(cycles.number for cycles in policy.observed if cycles.mode == mode)


def test_runs_of_one_mode_tell_the_policy_of_every_cycle_in_bulk() -> None:
    # Runs of inline batches between prefetched ones; inside the longest runs neither
    # mode is measured, so the epoch reports those cycles at once.
    made_in: list[str] = []
    made: dict[str, int] = {"prefetch": 0, "inline": 0}

    def noting(mode: str) -> Callable[[int], int]:
        def noted(item: int) -> int:
            made[mode] += 1
            return item

        return noted

    policy = SwitchingPolicy("PPIIIIIIIIIIIIII", probe_every=16)
    backend = Scripted(policy, Hooks(prepare=noting("prefetch")), noting("inline"))
    assert list(epoch(counting(300, made_in), backend)) == list(range(300))
    # Every inline batch's cycle is reported, once (the epoch's first batch is
    # prefetched). Prefetched batches too, but those a producer had made ahead when the
    # policy asked for inline batches: those belong to neither mode.
    assert reported(policy, "inline") == made["inline"]
    drained = made["prefetch"] - 1 - reported(policy, "prefetch")
    modes = [cycles.mode for cycles in policy.observed]
    switches = sum(1 for before, after in itertools.pairwise(modes) if before != after)
    assert 0 <= drained <= 3 * switches  # at most depth + 1 per switch
    assert sum(policy.bulk) > 150
    assert max(policy.bulk) > 1
    # Made where the policy said: inline runs in this thread, the rest by producers.
    main = threading.current_thread().name
    inline = [index for index, name in enumerate(made_in) if name == main]
    assert {index % 16 for index in inline} >= set(range(3, 16))


def test_an_epoch_that_ends_in_a_run_reports_its_last_cycles() -> None:
    policy = SwitchingPolicy("IIII" + "I" * 60, probe_every=64)
    assert list(epoch(iter(range(40)), Scripted(policy))) == list(range(40))
    assert policy.cycles == 40 - 1  # each batch's cycle, but the epoch's first batch's
    assert policy.bulk[-1] < 40  # a partial run, reported at the end


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


def test_a_failed_batch_in_a_run_ends_no_cycle() -> None:
    policy = SwitchingPolicy("II" + "I" * 60, probe_every=64)
    stream = epoch(FailsAt(30, 12), Scripted(policy))
    got: list[object] = []
    while True:
        try:
            got.append(next(stream))
        except StopIteration:
            break
        except ValueError as error:
            got.append(str(error))
    assert got == [*range(12), "batch 12", *range(13, 30)]
    # Every outcome ends a cycle the policy hears of, but the epoch's first batch, the
    # failure and the batch after it (whose cycle would include the handling of the error).
    assert policy.cycles == 30 - 3


def test_closing_in_a_run_stops_it_and_tells_the_policy_nothing_more() -> None:
    policy = SwitchingPolicy("PI" + "I" * 60, probe_every=64)
    stream = epoch(iter(range(100)), Scripted(policy))
    for _ in range(20):
        next(stream)
    stream.close()
    observed = policy.cycles
    with pytest.raises(StopIteration):
        next(stream)
    stream.close()
    assert policy.cycles == observed


class CountingDecision(ModeDecision):
    """The measured decision, counting the cycles it is told of, one by one or in runs."""

    def __init__(self) -> None:
        super().__init__()
        self.cycles = 0
        self.in_bulk = 0

    def observe(self, cycles: Cycles) -> Any:
        self.cycles += cycles.number
        if cycles.number > 1:
            self.in_bulk += cycles.number
        return super().observe(cycles)


def test_the_measured_decision_hears_of_every_batch_of_an_inline_loader(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The measured decision, with its verdict fixed whatever the timings: prefetching never
    # wins clearly (its cycle must be at most 0 times the inline bound) or by any margin
    # (100%), and no cycle drifts (by more than an infinite factor).
    monkeypatch.setattr(mode_decision, "CLEAR_WIN", 0.0)
    monkeypatch.setattr(mode_decision, "TIE_MARGIN", 1.0)
    monkeypatch.setattr(mode_decision, "DRIFT_FACTOR", math.inf)
    counting_decision = CountingDecision()
    monkeypatch.setattr(mode_decision, "new_policy", lambda: counting_decision)
    loader = DataLoaderX(RangeDataset(500), batch_size=1)
    first = 0
    for epoch_number in range(3):
        assert_same(list(loader), list(DataLoader(RangeDataset(500), batch_size=1)))
        assert counting_decision.mode == "inline"
        assert counting_decision.decisions == 1
        if not epoch_number:
            # But the batches a producer had made ahead when inline was decided.
            first = counting_decision.cycles
            assert 499 - 3 <= first <= 499
        assert counting_decision.cycles == first + 499 * epoch_number
    assert counting_decision.in_bulk > 900
    assert loader.stats is not None
    assert loader.stats.mode is not None
    assert loader.stats.mode.endswith(" of 500 batches prefetched")
