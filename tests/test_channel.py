"""The producer/consumer hand-off of ``Channel`` under varied timing: nothing lost or stuck."""

from __future__ import annotations

import itertools
import random
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from dataloaderx.backends.thread import ThreadBackend
from dataloaderx.engine.channel import Channel
from dataloaderx.engine.producer import start_producer
from dataloaderx.engine.stream import END, ERROR, ITEM, Envelope

pytestmark = pytest.mark.timeout(60)


def run_pair(depth: int, count: int, seed: int) -> list[int]:
    """Pass ``count`` items through a channel with random pauses on both sides."""
    channel = Channel(depth)
    stop = threading.Event()
    producer_rng = random.Random(seed)
    consumer_rng = random.Random(seed + 1)

    def produce() -> None:
        for index in range(count):
            if producer_rng.random() < 0.05:
                time.sleep(producer_rng.choice((0.0001, 0.001, 0.003)))
            envelope: Envelope = (ITEM, index, None)
            if not channel.put(envelope, stop):
                return
        channel.put((END, None, None), stop)

    thread = threading.Thread(target=produce)
    thread.start()
    received = []
    try:
        while True:
            kind, payload, _ = channel.get(thread.is_alive)
            if kind == END:
                break
            received.append(payload)
            if consumer_rng.random() < 0.05:
                time.sleep(consumer_rng.choice((0.0001, 0.001, 0.003)))
    finally:
        stop.set()
        channel.clear()
        thread.join(5)
    return received


@pytest.mark.parametrize("depth", [1, 2, 3, 8])
def test_every_item_arrives_once_in_order(depth: int) -> None:
    for seed in range(3):
        assert run_pair(depth, 3000, seed) == list(range(3000))


@pytest.mark.parametrize("depth", [2, 8])
def test_an_item_put_while_the_loop_waits_wakes_it(
    depth: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The loop, asleep on the empty buffer, gets each item as soon as it is put, even when
    the producer then takes "forever" over the next one: the wake-up, not the (here 60 s)
    poll, delivers it."""
    monkeypatch.setattr("dataloaderx.engine.channel.POLL_SECONDS", 60.0)
    channel = Channel(depth)
    stop = threading.Event()
    loop_waiting = threading.Event()
    release = threading.Event()

    def produce() -> None:
        channel.put((ITEM, 0, None), stop)
        loop_waiting.wait(30)
        time.sleep(0.05)  # let the loop fall asleep on the empty buffer
        channel.put((ITEM, 1, None), stop)
        release.wait(30)  # a batch that takes "forever"
        channel.put((END, None, None), stop)

    thread = threading.Thread(target=produce)
    thread.start()
    try:
        assert channel.get(thread.is_alive)[1] == 0
        loop_waiting.set()
        assert channel.get(thread.is_alive)[1] == 1
        assert not release.is_set()
        assert thread.is_alive()  # delivered before the stuck batch ended
    finally:
        release.set()
        thread.join(5)
    assert channel.get(thread.is_alive)[0] == END


@contextmanager
def waiting_put(
    channel: Channel, item: int, stop: threading.Event, size: int = 0
) -> Iterator[threading.Thread]:
    """A producer thread putting ``item`` (``size`` bytes), which must wait for room; stopped
    and joined on exit."""
    thread = threading.Thread(target=channel.put, args=((ITEM, item, None), stop, size))
    thread.start()
    try:
        yield thread
    finally:
        stop.set()
        channel.clear()
        thread.join(5)


def test_a_producer_waiting_on_a_full_buffer_is_woken_by_the_first_take(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The buffer refills one batch at a time, not from half empty: a depth of 8 keeps 8
    batches ready whenever the producer is ahead. Without a wake-up the producer would sleep
    through the (here 60 s) poll and the join below would time out."""
    monkeypatch.setattr("dataloaderx.engine.channel.POLL_SECONDS", 60.0)
    channel = Channel(8)
    stop = threading.Event()
    for index in range(8):
        assert channel.put((ITEM, index, None), stop)
    with waiting_put(channel, 8, stop) as thread:
        assert channel.get(thread.is_alive)[1] == 0
        thread.join(20)
        assert not thread.is_alive()
        assert len(channel) == 8


def test_a_producer_waiting_for_bytes_is_woken_once_its_batch_fits(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("dataloaderx.engine.channel.POLL_SECONDS", 60.0)
    channel = Channel(8, max_bytes=4)
    stop = threading.Event()
    for index, size in enumerate((1, 1, 2)):
        assert channel.put((ITEM, index, None), stop, size)
    with waiting_put(channel, 3, stop, size=2) as thread:
        assert channel.get(thread.is_alive)[1] == 0  # 3 bytes held: 2 more do not fit
        assert thread.is_alive()
        assert len(channel) == 2
        assert channel.get(thread.is_alive)[1] == 1  # 2 held: they fit
        thread.join(20)
        assert not thread.is_alive()
        assert [channel.get(thread.is_alive)[1] for _ in range(2)] == [2, 3]


def test_producer_stops_when_full_and_stop_is_set() -> None:
    channel = Channel(1)
    stop = threading.Event()
    assert channel.put((ITEM, 0, None), stop)
    results = []
    thread = threading.Thread(target=lambda: results.append(channel.put((ITEM, 1, None), stop)))
    thread.start()
    stop.set()
    thread.join(5)
    assert results == [False]
    assert len(channel) == 1


def test_consumer_learns_of_a_dead_producer() -> None:
    channel = Channel(2)
    with pytest.raises(RuntimeError, match="producer thread ended without delivering"):
        channel.get(lambda: False)


def test_interrupt_while_waiting_is_not_chained_to_an_index_error() -> None:
    def interrupted() -> bool:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt) as info:
        Channel(2).get(interrupted)
    assert info.value.__context__ is None


def test_a_channel_knows_whether_it_handed_out_a_batch() -> None:
    channel = Channel(4)
    stop = threading.Event()
    for envelope in [(ERROR, ValueError("bad"), None), (ITEM, 1, None)]:
        assert channel.put(envelope, stop)
    assert not channel.handed_out()
    assert channel.get(lambda: True)[0] == ERROR  # an error is no batch
    assert not channel.handed_out()
    assert channel.get(lambda: True)[0] == ITEM
    assert channel.handed_out()


def test_a_close_from_another_thread_never_looks_like_a_dead_producer() -> None:
    # The buffer is closed before the stop flag is set: a loop waiting in another thread
    # gets the end even when the closer stalls between the two, while the flag ends the
    # producer (the stall is stretched here until the producer ended, plus a few polls).
    def slow() -> Iterator[int]:
        for index in itertools.count():
            time.sleep(0.2)
            yield index

    stream = start_producer(slow(), ThreadBackend(adaptive=False, depth=2))
    channel = stream._buffer
    clear = channel.clear

    def stalled_clear() -> None:
        stream.thread.join(timeout=1.0)
        time.sleep(0.2)
        clear()

    channel.clear = stalled_clear  # type: ignore[method-assign]
    closer = threading.Timer(0.05, stream.close)
    closer.start()
    try:
        got = list(stream)  # the end, not "the producer thread ended without delivering"
    finally:
        closer.join(timeout=10)
        stream.close()
    assert got in ([], [0])
