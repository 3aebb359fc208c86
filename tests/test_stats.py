"""Stall statistics: ``loader.stats``, the ``stats`` option, and their classification."""

from __future__ import annotations

import copy
import sys
import threading
import time
from typing import Any

import pytest
import torch
from torch.utils.data import Dataset

from dataloaderx import DataLoaderX, get_backend
from dataloaderx.bench.runner import buffer_advice
from dataloaderx.engine import decision as mode_decision
from dataloaderx.engine.depth import BufferUsage, fixed_usage
from dataloaderx.engine.stream import Stream, as_stream
from dataloaderx.epoch.slot import ProducerSlot
from dataloaderx.epoch.stats import LoaderStats
from tests.helpers import (
    RangeDataset,
    SlowDataset,
    SwitchingPolicy,
    always_prefetching,
    wait_until_run_ahead,
)

pytestmark = pytest.mark.timeout(60)

#: Long enough to dominate scheduling noise on a loaded 2-core machine.
SLOW = 0.05


def consume(loader: DataLoaderX[Any], step_seconds: float = 0.0) -> int:
    count = 0
    for _ in loader:
        if step_seconds:
            time.sleep(step_seconds)
        count += 1
    return count


def test_input_bound_run_is_classified_input_bound(backend: str) -> None:
    loader = DataLoaderX(SlowDataset(8, SLOW), batch_size=1, backend=backend)
    assert consume(loader) == 8
    stats = loader.stats
    assert stats is not None
    assert stats.bound == "input-bound"
    assert stats.summary().startswith("input-bound: training waited ")
    assert "try " in stats.summary()


class FakeClock:
    """A ``perf_counter`` that moves 1 µs per reading (so that every span is positive) and
    otherwise only when the test says: the library's times, free of scheduling noise."""

    TICK = 1e-6

    def __init__(self) -> None:
        self._now = 1000.0
        self._lock = threading.Lock()

    def __call__(self) -> float:
        with self._lock:
            self._now += self.TICK
            return self._now

    def advance(self, seconds: float) -> None:
        with self._lock:
            self._now += seconds


@pytest.fixture
def fake_clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    """``time.perf_counter``, and every name a ``dataloaderx`` module bound it to, as a fake."""
    clock = FakeClock()
    real = time.perf_counter
    for name, module in list(sys.modules.items()):
        if name == "dataloaderx" or name.startswith("dataloaderx."):
            for attribute, value in list(vars(module).items()):
                if value is real:
                    monkeypatch.setattr(module, attribute, clock)
    monkeypatch.setattr(time, "perf_counter", clock)
    return clock


def test_compute_bound_run_is_classified_compute_bound(backend: str, fake_clock: FakeClock) -> None:
    # Each step takes SLOW seconds of the fake clock and nothing else moves it but a tick per
    # reading: the loop waits a few microseconds in all, however the threads were scheduled.
    loader = DataLoaderX(RangeDataset(10), batch_size=1, backend=backend)
    count = 0
    for _ in loader:
        fake_clock.advance(SLOW)
        count += 1
    assert count == 10
    stats = loader.stats
    assert stats is not None
    assert stats.elapsed_seconds >= 10 * SLOW
    assert stats.bound == "compute-bound"
    assert stats.summary().startswith("compute-bound: data was ready ")


def test_counts_every_batch_and_next_call(backend: str) -> None:
    loader = DataLoaderX(RangeDataset(10), batch_size=3, backend=backend)
    assert loader.stats is None  # no epoch yet
    assert consume(loader) == 4
    stats = loader.stats
    assert stats is not None
    assert stats.batches == 4
    assert sum(stats.occupancy) == 5  # four batches and the call that ended the epoch
    assert stats.backend == backend
    assert 0 < stats.wait_seconds <= stats.elapsed_seconds
    assert stats.produce_seconds > 0


def test_early_break_keeps_the_figures_so_far(backend: str) -> None:
    loader = DataLoaderX(RangeDataset(50), batch_size=2, backend=backend)
    with iter(loader) as iterator:
        for _ in range(3):
            next(iterator)
        assert loader.stats is not None
        assert loader.stats.batches == 3
    second = iter(loader)
    next(second)
    second.close()
    assert loader.stats is not None
    assert loader.stats.batches == 1  # the latest epoch


def test_producer_blocked_time_only_for_threaded_backends(backend: str) -> None:
    options = always_prefetching(backend)
    loader = DataLoaderX(RangeDataset(20), batch_size=1, backend=backend, backend_options=options)
    consume(loader, step_seconds=0.002)
    stats = loader.stats
    assert stats is not None
    if backend == "sync":
        assert stats.producer_blocked_seconds is None
    else:
        assert stats.producer_blocked_seconds is not None
        assert stats.producer_blocked_seconds > 0


def test_threaded_backends_report_buffered_batches(backend: str) -> None:
    options = always_prefetching(backend)
    loader = DataLoaderX(RangeDataset(12), batch_size=1, backend=backend, backend_options=options)
    iterator = iter(loader)
    for _ in iterator:
        wait_until_run_ahead(iterator)  # the producer, if any, runs ahead during the step
    stats = loader.stats
    assert stats is not None
    if backend == "sync":
        assert stats.occupancy == (13,)
    else:
        assert stats.mean_occupancy > 0


def test_stats_false_turns_recording_off(backend: str) -> None:
    loader = DataLoaderX(
        RangeDataset(6), batch_size=2, backend=backend, backend_options={"stats": False}
    )
    assert consume(loader) == 3
    assert loader.stats is None


def test_stats_trace_records_a_timeline(backend: str) -> None:
    options = {"stats": "trace"}
    loader = DataLoaderX(RangeDataset(6), batch_size=2, backend=backend, backend_options=options)
    consume(loader)
    stats = loader.stats
    assert stats is not None
    kinds = [kind for kind, _, _ in stats.trace]
    assert kinds.count("wait") == 4
    assert kinds.count("produce") == 4  # three batches and the end of the epoch
    assert all(end >= start for _, start, end in stats.trace)


def test_stats_option_accepted_in_backend_mapping() -> None:
    loader = DataLoaderX(RangeDataset(4), backend={"name": "thread", "depth": 3, "stats": False})
    assert loader.prefetch_backend.depth == 3  # type: ignore[attr-defined]
    consume(loader)
    assert loader.stats is None


@pytest.mark.parametrize("value", ["yes", 1, None])
def test_bad_stats_value_is_rejected(value: object) -> None:
    with pytest.raises(TypeError, match=r"option 'stats' must be True, False or 'trace', got "):
        DataLoaderX(RangeDataset(4), backend="sync", backend_options={"stats": value})


def test_unknown_option_error_lists_stats(backend: str) -> None:
    with pytest.raises(TypeError, match=r"unknown option 'stat'; valid options: .*'stats'"):
        DataLoaderX(RangeDataset(4), backend=backend, backend_options={"stat": True})


def test_stats_with_worker_processes() -> None:
    loader = DataLoaderX(RangeDataset(12), batch_size=2, num_workers=2, backend="thread")
    assert consume(loader) == 6
    assert loader.stats is not None
    assert loader.stats.batches == 6
    assert loader.stats.num_workers == 2


def make_stats(**overrides: Any) -> LoaderStats:
    fields: dict[str, Any] = {
        "backend": "thread",
        "depth": 2,
        "num_workers": 0,
        "batches": 10,
        "elapsed_seconds": 10.0,
        "wait_seconds": 4.1,
        "produce_seconds": 9.0,
        "producer_blocked_seconds": 0.1,
        "occupancy": (10, 1),
    }
    fields.update(overrides)
    return LoaderStats(**fields)


def test_summary_wording() -> None:
    assert make_stats().summary() == (
        "input-bound: training waited 41% of the time for data; "
        "try num_workers>=2 or make batches cheaper"
    )
    assert make_stats(wait_seconds=0.1).summary() == "compute-bound: data was ready 99% of the time"
    assert "backend='thread'" in make_stats(backend="sync", producer_blocked_seconds=None).summary()
    bursty = make_stats(produce_seconds=3.0, producer_blocked_seconds=2.0, depth=4)
    assert bursty.summary().endswith("try depth>=8")
    assert "num_workers>=8" in make_stats(num_workers=4).summary()
    assert make_stats(batches=0).bound == "no data"


def test_advice_never_names_the_backend_that_runs() -> None:
    no_producer = make_stats(producer_blocked_seconds=None).summary()
    assert "backend=" not in no_producer
    assert no_producer.endswith("try num_workers>=2 or make batches cheaper")
    inline = make_stats(
        producer_blocked_seconds=None,
        mode="inline (prefetching did not pay: ...); 0 of 10 batches prefetched",
    ).summary()
    assert "backend=" not in inline
    assert "made inline as prefetching did not pay" in inline
    assert inline.endswith("try num_workers>=2 or make batches cheaper")


def test_summary_of_an_epoch_made_inline_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(mode_decision, "new_policy", lambda: SwitchingPolicy("I"))
    loader = DataLoaderX(SlowDataset(12, 0.002), batch_size=2, backend="thread")
    assert len(list(loader)) == 6
    stats = loader.stats
    assert stats is not None
    assert stats.mode is not None
    assert stats.mode.startswith("inline (scripted)")
    assert stats.bound == "input-bound"
    assert "made inline" in stats.summary()
    assert "backend=" not in stats.summary()


class _Items(Dataset[torch.Tensor]):
    def __len__(self) -> int:
        return 3

    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.tensor(index)


def test_stats_do_not_change_batches(backend: str) -> None:
    on = list(DataLoaderX(_Items(), backend=backend))
    off = list(DataLoaderX(_Items(), backend=backend, backend_options={"stats": False}))
    assert [int(t) for t in on] == [int(t) for t in off] == [0, 1, 2]


def test_prefetch_records_stats_like_the_loader(backend: str) -> None:
    from torch.utils.data import DataLoader

    from dataloaderx import prefetch

    batches = prefetch(DataLoader(SlowDataset(6, SLOW), batch_size=1), backend=backend)
    assert batches.stats is None  # no epoch yet
    assert sum(1 for _ in batches) == 6
    stats = batches.stats
    assert stats is not None
    assert stats.batches == 6
    assert stats.backend == backend
    assert stats.bound == "input-bound"
    quiet = prefetch(range(4), backend=backend, backend_options={"stats": False})
    assert list(quiet) == [0, 1, 2, 3]
    assert quiet.stats is None


@pytest.mark.parametrize("backend", ["thread", "background"])
def test_buffer_usage_is_reported_for_fixed_and_auto_depth(backend: str) -> None:
    dataset = [torch.zeros(4) for _ in range(30)]  # 16 bytes a batch
    fixed = DataLoaderX(dataset, batch_size=None, backend=backend, backend_options={"depth": 3})
    assert consume(fixed) == 30
    stats = fixed.stats
    assert stats is not None
    assert (stats.depth, stats.depth_min, stats.depth_median, stats.depth_max) == (3, 3, 3, 3)
    assert stats.peak_bytes is not None
    assert 16 <= stats.peak_bytes <= 3 * 16
    auto = DataLoaderX(dataset, batch_size=None, backend=backend, backend_options={"depth": "auto"})
    assert consume(auto) == 30
    stats = auto.stats
    assert stats is not None
    assert stats.depth is None  # no single depth
    assert stats.depth_min is not None
    assert stats.depth_max is not None
    assert 2 <= stats.depth_min <= (stats.depth_median or 0) <= stats.depth_max <= 16


def test_sync_reports_no_buffer_usage() -> None:
    loader = DataLoaderX(RangeDataset(4), batch_size=2, backend="sync")
    consume(loader)
    assert loader.stats is not None
    assert loader.stats.depth_min is None
    assert loader.stats.peak_bytes is None


def test_buffer_advice_names_depth_and_max_bytes_when_they_matter() -> None:
    assert buffer_advice(make_stats()) == ""  # no usage reported
    steady = make_stats(depth_min=2, depth_median=2, depth_max=2, peak_bytes=1000)
    assert buffer_advice(steady) == ""
    unmoved = make_stats(depth=None, depth_min=2, depth_median=2, depth_max=2, peak_bytes=10)
    assert buffer_advice(unmoved) == ""  # depth='auto' stayed at the default
    auto = make_stats(depth=None, depth_min=2, depth_median=6, depth_max=9, peak_bytes=10**9)
    assert buffer_advice(auto) == (
        "depth='auto' used 2 to 9 batches (median 6); depth=9 fixes the buffer at its "
        "largest; the buffer held up to 954 MiB; max_bytes='954MiB' caps it there"
    )
    bursty = make_stats(
        produce_seconds=3.0, producer_blocked_seconds=2.0, depth=4, depth_min=4,
        depth_median=4, depth_max=4, peak_bytes=10,
    )  # fmt: skip
    assert "try depth='auto' (or depth>=8)" in buffer_advice(bursty)


@pytest.mark.parametrize(
    ("backend", "options"), [("thread", {"adaptive": False}), ("background", {})]
)
def test_buffer_usage_outlives_the_epoch_and_copies_without_the_stream(
    backend: str, options: dict[str, Any]
) -> None:
    loader = DataLoaderX(
        [torch.zeros(4)] * 10,
        batch_size=None,
        backend=backend,
        backend_options={"depth": 3, **options},
    )
    iterator = iter(loader)
    next(iterator)
    clone = copy.deepcopy(loader)  # mid-epoch: the stream (threads, locks) stays behind
    assert clone.stats is not None
    assert clone.stats.depth_max == 3
    iterator.close()
    stats = loader.stats
    assert stats is not None
    assert stats.depth_max == 3
    assert stats.peak_bytes is not None
    assert stats.peak_bytes >= 16


class UsageOnly(Stream[int]):
    """A stopped producer's stream: only its buffer usage and whether it handed out a batch."""

    def __init__(self, depth: int, handed: bool) -> None:
        self._usage = fixed_usage(depth, 0)  # batches without tensors: no bytes
        self._handed = handed

    def __next__(self) -> int:
        raise StopIteration

    def close(self) -> None:
        """Nothing runs."""

    def usage(self) -> BufferUsage:
        return self._usage

    def handed_out(self) -> bool:
        return self._handed


def test_the_usage_kept_is_the_latest_producers_that_handed_out_a_batch() -> None:
    slot = ProducerSlot()
    for depth, handed in [(2, True), (5, True), (7, False)]:
        slot.hold(UsageOnly(depth, handed))
        slot.stop()
    assert slot.usage == fixed_usage(5, 0)  # not the first's; not the one that made none


def test_the_first_producers_usage_is_kept_when_none_handed_out_a_batch() -> None:
    slot = ProducerSlot()
    for depth in (3, 4):
        slot.hold(UsageOnly(depth, handed=False))
        slot.stop()
    assert slot.usage == fixed_usage(3, 0)


@pytest.mark.parametrize("backend", ["thread", "background"])
def test_a_producers_stream_knows_whether_it_handed_out_a_batch(backend: str) -> None:
    stream = as_stream(get_backend(backend)().open(iter([1, 2])))
    try:
        assert not stream.handed_out()
        assert next(stream) == 1
        assert stream.handed_out()
    finally:
        stream.close()
