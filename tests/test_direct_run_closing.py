"""A direct run takes batches without the source's lock: closing still never overlaps one."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator

import pytest

from dataloaderx import iterator as iterator_module
from dataloaderx._direct import TIMED_TAIL, DirectRun
from dataloaderx._source import GuardedSource
from dataloaderx.backends.sync import SyncBackend
from dataloaderx.iterator import PrefetchIterator
from tests.helpers import FailingDataset, assert_same_events, run_events
from tests.test_direct_runs import inline_loader

pytestmark = pytest.mark.timeout(60)

#: The item that blocks, well inside the first direct run.
BLOCKED_AT = 20


class Gate(Iterator[int]):
    """``0, 1, ...``; making item ``at`` signals ``entered``, runs ``on_enter`` and then
    waits for ``go`` (at most 10 seconds)."""

    def __init__(self, size: int, at: int) -> None:
        self._items = iter(range(size))
        self._at = at
        self.entered = threading.Event()
        self.go = threading.Event()
        self.on_enter: Callable[[], None] | None = None

    def __next__(self) -> int:
        index = next(self._items)
        if index == self._at:
            self.entered.set()
            if self.on_enter is not None:
                self.on_enter()
            self.go.wait(timeout=10)
        return index


class Releases:
    """A ``release`` that notes which thread called it, each time."""

    def __init__(self) -> None:
        self.threads: list[int] = []

    def __call__(self) -> None:
        self.threads.append(threading.get_ident())


def in_a_run(gate: Gate, releases: Releases) -> PrefetchIterator[int]:
    iterator = PrefetchIterator(gate, SyncBackend(), releases)
    assert [next(iterator) for _ in range(BLOCKED_AT)] == list(range(BLOCKED_AT))
    assert iterator._run.left > 0  # the blocked item is taken in a direct run
    return iterator


def take_while_another_thread_closes(
    gate: Gate, iterator: PrefetchIterator[int], releases: Releases, closer_wait: float
) -> dict[str, object]:
    """Take the blocked item while a thread closes ``iterator``; the gate opens once the
    closer ended or ``closer_wait`` seconds passed. Returns what was seen just before."""

    def close() -> None:
        gate.entered.wait(timeout=10)
        iterator.close()

    closer = threading.Thread(target=close, name="closer")
    closer.start()
    seen: dict[str, object] = {}

    def open_the_gate() -> None:
        gate.entered.wait(timeout=10)
        closer.join(timeout=closer_wait)
        seen["closer running"] = closer.is_alive()
        seen["released"] = list(releases.threads)
        gate.go.set()

    opener = threading.Thread(target=open_the_gate, name="opener")
    opener.start()
    assert next(iterator) == BLOCKED_AT  # the batch being made is handed out
    opener.join(timeout=10)
    closer.join(timeout=10)
    return seen


def test_close_from_another_thread_waits_for_the_batch_being_taken() -> None:
    gate = Gate(100, BLOCKED_AT)
    releases = Releases()
    iterator = in_a_run(gate, releases)
    seen = take_while_another_thread_closes(gate, iterator, releases, closer_wait=0.3)
    assert seen == {"closer running": True, "released": []}  # close() was still waiting
    assert len(releases.threads) == 1
    with pytest.raises(StopIteration):
        next(iterator)
    assert len(releases.threads) == 1


def test_a_close_that_gives_up_waiting_leaves_the_release_to_the_taker(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(iterator_module, "JOIN_TIMEOUT_SECONDS", 0.05)
    gate = Gate(100, BLOCKED_AT)
    releases = Releases()
    iterator = in_a_run(gate, releases)
    seen = take_while_another_thread_closes(gate, iterator, releases, closer_wait=10)
    assert seen == {"closer running": False, "released": []}  # it returned, released nothing
    assert releases.threads == [threading.get_ident()]  # released by the taker, once
    with pytest.raises(StopIteration):
        next(iterator)
    assert len(releases.threads) == 1


def test_close_inside_the_take_in_the_same_thread_releases_after_it() -> None:
    gate = Gate(100, BLOCKED_AT)
    gate.go.set()
    releases = Releases()
    iterator = in_a_run(gate, releases)
    seen: dict[str, object] = {}

    def close_inside() -> None:  # a signal handler or finaliser in the loop's thread
        iterator.close()
        seen["released"] = list(releases.threads)

    gate.on_enter = close_inside
    assert next(iterator) == BLOCKED_AT
    assert seen == {"released": []}
    assert releases.threads == [threading.get_ident()]
    with pytest.raises(StopIteration):
        next(iterator)
    assert len(releases.threads) == 1


def test_a_close_between_batches_of_a_run_stops_it_before_the_next_take() -> None:
    gate = Gate(100, -1)
    releases = Releases()
    iterator = in_a_run(gate, releases)
    closer = threading.Thread(target=iterator.close)
    closer.start()
    closer.join(timeout=10)
    assert len(releases.threads) == 1
    with pytest.raises(StopIteration):
        next(iterator)
    assert iterator._num_yielded == BLOCKED_AT


def test_a_run_takes_from_the_iterator_itself_where_the_gil_is_on() -> None:
    loader = inline_loader("sync", FailingDataset(60, frozenset()), batch_size=1)
    iterator = iter(loader)
    for _ in range(5):
        next(iterator)
    assert iterator._run.left > 0
    assert getattr(iterator._run.take, "__self__", None) is iterator._inner
    iterator.close()


@pytest.mark.parametrize("num_workers", [0, 2])
def test_without_the_gil_a_run_takes_through_the_lock_and_matches_dataloader(
    monkeypatch: pytest.MonkeyPatch, num_workers: int
) -> None:
    from torch.utils.data import DataLoader

    from dataloaderx import _source

    monkeypatch.setattr(_source, "_gil_enabled", lambda: False)
    failing = frozenset({7, 33, 34})
    loader = inline_loader(
        "sync", FailingDataset(80, failing), batch_size=1, num_workers=num_workers
    )
    iterator = iter(loader)
    for _ in range(3):
        next(iterator)
    assert iterator._run.left > 0
    assert iterator._run.take == iterator._source.__next__
    iterator.close()
    expected = run_events(iter(DataLoader(FailingDataset(80, failing), num_workers=num_workers)))
    assert_same_events(run_events(iter(loader)), expected)


def test_the_run_reports_the_times_of_its_last_batches_in_order() -> None:
    run = DirectRun()
    run.limit = run.left = TIMED_TAIL + 3
    for index in range(TIMED_TAIL + 2):  # as the iterator notes its batches
        left = run.left - 1
        run.seconds += 1.0
        if left < TIMED_TAIL:
            run.ends[left] = 10.0 * index
        run.left = left
    assert run.taken() == TIMED_TAIL + 2
    assert run.seconds == TIMED_TAIL + 2
    # Those among the run's last TIMED_TAIL (one of which is still to come), in order.
    assert run.latest_ends() == [10.0 * index for index in range(3, TIMED_TAIL + 2)]
    run.forget_ends()
    assert run.ends == [0.0] * TIMED_TAIL
    short = DirectRun()
    short.limit = short.left = 5
    short.ends[4], short.ends[3] = 1.0, 2.0
    short.left = 3
    assert short.latest_ends() == [1.0, 2.0]


def test_a_closed_source_offers_no_run() -> None:
    source = GuardedSource(iter(range(5)), None)
    assert source.direct(DirectRun()) is not None
    source.close(timeout=1)
    assert source.direct(DirectRun()) is None


def test_a_run_notes_the_times_an_adaptive_policy_needs() -> None:
    from dataloaderx.backends._mode_decision import STEADY_TAIL

    assert TIMED_TAIL > STEADY_TAIL  # one time more than cycles: each ends one
