"""The feed: inline reads and producer reads under one lock; closing never overlaps a read."""

from __future__ import annotations

import gc
import math
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from dataloaderx.backends.sync import SyncBackend
from dataloaderx.backends.thread import ThreadBackend
from dataloaderx.contracts.policy import INLINE, Verdict
from dataloaderx.engine.phases import DRIFT_WINDOW
from dataloaderx.epoch import iterator as epoch_iterator
from dataloaderx.epoch.feed import Feed, Stop
from dataloaderx.epoch.iterator import PrefetchIterator
from dataloaderx.epoch.run import TAIL, Run
from tests.helpers import wait_for

pytestmark = pytest.mark.timeout(60)

#: The item that blocks.
BLOCKED_AT = 20


class Gate(Iterator[int]):
    """``0, 1, ...``; making item ``at`` signals ``entered``, runs ``on_enter`` and then
    waits for ``go`` (at most ``hold`` seconds)."""

    def __init__(self, size: int, at: int, hold: float = 10.0) -> None:
        self._items = iter(range(size))
        self._at = at
        self._hold = hold
        self.entered = threading.Event()
        self.go = threading.Event()
        self.on_enter: Callable[[], None] | None = None

    def __next__(self) -> int:
        index = next(self._items)
        if index == self._at:
            self.entered.set()
            if self.on_enter is not None:
                self.on_enter()
            self.go.wait(timeout=self._hold)
        return index


class Releases:
    """A ``release`` that notes which thread called it, each time."""

    def __init__(self) -> None:
        self.threads: list[int] = []

    def __call__(self) -> None:
        self.threads.append(threading.get_ident())


def inline_epoch(gate: Gate, releases: Releases) -> PrefetchIterator[int]:
    iterator = PrefetchIterator(gate, SyncBackend(), releases)
    assert [next(iterator) for _ in range(BLOCKED_AT)] == list(range(BLOCKED_AT))
    return iterator


def read_while_another_thread_closes(
    gate: Gate, iterator: PrefetchIterator[int], releases: Releases, closer_wait: float
) -> dict[str, object]:
    """Read the blocked item while a thread closes ``iterator``; the gate opens once the
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


def test_a_long_read_under_a_close_from_another_thread_releases_as_it_ends() -> None:
    gate = Gate(100, BLOCKED_AT)
    releases = Releases()
    iterator = inline_epoch(gate, releases)
    seen = read_while_another_thread_closes(gate, iterator, releases, closer_wait=10)
    # close() waited for the read within its budget, then returned, releasing nothing ...
    assert seen == {"closer running": False, "released": []}
    # ... and the loop's thread released the source as it left its read.
    assert releases.threads == [threading.get_ident()]
    with pytest.raises(StopIteration):
        next(iterator)
    assert len(releases.threads) == 1


def test_a_close_from_another_thread_waits_for_a_short_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A budget that the read (0.1 s, or however late this machine lets it end) stays short of.
    monkeypatch.setattr(epoch_iterator, "JOIN_TIMEOUT_SECONDS", 60.0)
    gate = Gate(100, BLOCKED_AT)
    releases = Releases()
    iterator = inline_epoch(gate, releases)
    seen = read_while_another_thread_closes(gate, iterator, releases, closer_wait=0.1)
    assert seen == {"closer running": True, "released": []}  # it waited for the read
    assert releases.threads == [threading.get_ident()]  # released once the read was over
    with pytest.raises(StopIteration):
        next(iterator)
    assert len(releases.threads) == 1


def test_a_close_from_another_thread_between_batches_releases_at_once() -> None:
    gate = Gate(100, -1)
    releases = Releases()
    iterator = inline_epoch(gate, releases)
    closer = threading.Thread(target=iterator.close, name="closer")
    closer.start()
    closer.join(timeout=10)
    assert releases.threads == [closer.ident]
    with pytest.raises(StopIteration):
        next(iterator)
    assert len(releases.threads) == 1


def test_close_inside_the_read_in_the_same_thread_does_not_release_under_it() -> None:
    gate = Gate(100, BLOCKED_AT)
    gate.go.set()
    releases = Releases()
    iterator = inline_epoch(gate, releases)
    seen: dict[str, object] = {}

    def close_inside() -> None:  # a signal handler in the loop's thread
        iterator.close()
        seen["released"] = list(releases.threads)

    gate.on_enter = close_inside
    assert next(iterator) == BLOCKED_AT  # the read under way completes
    assert seen["released"] == []
    with pytest.raises(StopIteration):
        next(iterator)
    assert releases.threads == [threading.get_ident()]


def test_a_close_in_the_loops_thread_between_batches_releases_at_once() -> None:
    gate = Gate(100, -1)
    releases = Releases()
    iterator = inline_epoch(gate, releases)
    iterator.close()
    assert releases.threads == [threading.get_ident()]
    with pytest.raises(StopIteration):
        next(iterator)
    assert iterator._num_yielded == BLOCKED_AT
    assert len(releases.threads) == 1


def test_an_iterator_left_unread_is_released_when_collected() -> None:
    gate = Gate(100, -1)
    releases = Releases()
    iterator = inline_epoch(gate, releases)
    assert releases.threads == []
    del iterator
    gc.collect()
    assert len(releases.threads) == 1


def producer_reading(
    at: int, reads: int, got: list[int]
) -> tuple[Gate, Releases, Feed[int], threading.Thread]:
    """A feed whose producer thread makes ``reads`` reads into ``got``, and is now inside
    its read of item ``at``, held there by the gate."""
    gate = Gate(100, at)
    releases = Releases()
    feed: Feed[int] = Feed(gate, releases)
    feed.resume(None)

    def read() -> None:
        got.extend(next(feed) for _ in range(reads))

    reader = threading.Thread(target=read, name="producer")
    reader.start()
    assert gate.entered.wait(10)
    return gate, releases, feed, reader


def test_a_producers_read_and_the_release_never_overlap() -> None:
    got: list[int] = []
    gate, releases, feed, reader = producer_reading(3, 4, got)
    closer = threading.Thread(target=lambda: feed.close(timeout=10))
    closer.start()
    closer.join(timeout=0.2)
    assert closer.is_alive()  # waiting for the read
    assert releases.threads == []
    gate.go.set()
    closer.join(timeout=10)
    reader.join(timeout=10)
    assert got == [0, 1, 2, 3]
    assert len(releases.threads) == 1
    with pytest.raises(StopIteration):
        next(feed)
    assert feed.why_stopped() is Stop.CLOSED


def test_a_close_that_gives_up_waiting_leaves_the_release_to_the_producer() -> None:
    gate, releases, feed, reader = producer_reading(2, 3, [])
    assert not feed.close(timeout=0.05)  # gave up: the read goes on
    assert releases.threads == []
    gate.go.set()
    reader.join(timeout=10)
    assert releases.threads == [reader.ident]  # released by the producer, leaving its read


def test_a_prefetching_epoch_closed_from_another_thread_ends_the_loops_wait() -> None:
    gate = Gate(100, 1, hold=60)  # item 1 is held until the close returned
    iterator = PrefetchIterator(gate, ThreadBackend(adaptive=False), None)
    assert next(iterator) == 0

    def close() -> None:
        # While the producer makes item 1 and the loop waits for it.
        assert gate.entered.wait(timeout=60)
        stream: Any = iterator._epoch.stream
        assert wait_for(lambda: stream._buffer._loop_waits)
        iterator.close()  # gives up waiting for the read after its budget
        gate.go.set()

    closer = threading.Thread(target=close, name="closer")
    closer.start()
    try:
        assert list(iterator) == []  # the end, not an error: the producer was stopped
    finally:
        gate.go.set()
        closer.join(timeout=60)
    assert not closer.is_alive()


def test_after_a_close_the_loop_ends_while_a_producers_read_still_hangs() -> None:
    # A producer stuck in a read (a worker that hangs) holds the feed's lock; the loop's
    # next call after a close must not wait for it.
    gate = Gate(100, 1, hold=60)
    releases = Releases()
    iterator = PrefetchIterator(gate, ThreadBackend(adaptive=False), releases)
    assert next(iterator) == 0
    assert gate.entered.wait(timeout=60)  # the producer is inside item 1's read, held
    try:
        closer = threading.Thread(target=iterator.close, name="closer")
        closer.start()
        closer.join(timeout=60)
        assert not closer.is_alive()  # it gave up waiting for the read after its budget
        with pytest.raises(StopIteration):
            next(iterator)  # the end, though the read goes on
        assert not gate.go.is_set()
        assert releases.threads == []  # nothing released during the read
    finally:
        gate.go.set()
    # The producer leaves its read, then releases the source.
    assert wait_for(lambda: len(releases.threads) == 1)


def test_producer_reads_stop_where_the_epoch_says() -> None:
    feed: Feed[int] = Feed(iter(range(10)), None)
    feed.resume(3)
    assert [next(feed) for _ in range(3)] == [0, 1, 2]
    with pytest.raises(StopIteration):
        next(feed)
    assert feed.why_stopped() is Stop.BOUND
    feed.resume(None)
    assert next(feed) == 3
    feed.pause()
    with pytest.raises(StopIteration):
        next(feed)
    assert feed.why_stopped() is Stop.PAUSED
    feed.resume(None)
    assert list(feed) == list(range(4, 10))
    assert feed.why_stopped() is Stop.END
    assert len(feed.made) == 11  # every read is timed, the one that ended too
    assert all(made.start <= made.end for made in feed.made)
    feed.close(timeout=1)
    with pytest.raises(StopIteration):
        next(feed)
    assert feed.why_stopped() is Stop.CLOSED


def run_of(length: int, first: float | None, ends: list[float], made: int) -> Run:
    """A run of ``length`` batches, begun at ``first``, ``made`` of them handed out, the
    last of those in hand at ``ends`` (as the epoch notes them: the last TAIL + 1)."""
    run = Run()
    run.start(Verdict(INLINE, length, math.inf, measure=False), first, length)
    run.left -= made
    run.ends.extend(ends)
    return run


def test_a_run_reports_the_times_of_its_last_batches_in_order() -> None:
    ends = [10.0 * index for index in range(1, TAIL + 3)]  # the run's batches but its last
    run = run_of(TAIL + 3, 5.0, ends[1:], made=len(ends))
    cycles = run.cycles()
    assert cycles.number == TAIL + 2
    assert list(cycles.seconds) == [10.0] * TAIL  # the latest of them, no more
    assert run_of(5, 1.0, [2.0, 4.0], made=2).cycles().seconds == [1.0, 2.0]  # from the start
    unknown = run_of(5, None, [2.0, 4.0], made=2).cycles()
    assert (unknown.number, list(unknown.seconds)) == (1, [2.0])  # the first ends no cycle


def test_a_run_counts_the_batches_handed_out_across_runs() -> None:
    run = run_of(10, 0.0, [], made=4)
    assert (run.handed, run.made) == (4, 4)
    run.start(Verdict(INLINE, 7, math.inf, measure=False), 1.0, 7)
    run.left -= 3
    assert (run.handed, run.made) == (7, 3)


def test_a_run_carries_what_the_drift_window_reads() -> None:
    assert TAIL >= DRIFT_WINDOW
