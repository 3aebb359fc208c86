"""The epoch's source: PyTorch's iterator, read by one thread at a time, released once.

Every read holds :attr:`Feed.lock`: the loop's thread's inline reads, and a producer's
reads through ``next()``. :meth:`Feed.close` takes it too before it releases the iterator
(``docs/design.md``, *Shutdown protocol*, says who releases it when). A producer's reads
stop where the epoch says: between two batches (:meth:`Feed.pause`), and after the
epoch's last batch, which ``RandomSampler`` would follow by drawing the next epoch's order.
"""

from __future__ import annotations

import enum
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from threading import get_ident
from time import perf_counter, thread_time
from typing import Any, Generic, NamedTuple, TypeVar

from torch.utils.data.dataloader import _DatasetKind, _SingleProcessDataLoaderIter

from dataloaderx.engine.stream import POLL_SECONDS

T = TypeVar("T")


class Stop(enum.Enum):
    """Why the producer's latest read raised ``StopIteration``: the iterator ended, the
    loop makes the next batches itself, the epoch's last batch was read, or it closed."""

    END = "end"
    PAUSED = "paused"
    BOUND = "bound"
    CLOSED = "closed"


class Made(NamedTuple):
    """One read by a producer: when it ran, its CPU time (0.0 unless measured), and in
    which thread."""

    start: float
    end: float
    cpu: float
    thread: int


class Snapshots(NamedTuple):
    """The source's state, ``take()`` right after each batch is made (or fails), queued
    until that batch is handed out."""

    take: Callable[[], Any]
    queue: deque[Any]


def read_ahead_limit(iterator: Iterator[Any]) -> int | None:
    """How many batches may be read before the loop asks past them (``None``: no limit):
    only a single-process map-style ``DataLoader`` iterator reads its sampler on demand."""
    if not isinstance(iterator, _SingleProcessDataLoaderIter):
        return None
    if iterator._dataset_kind != _DatasetKind.Map:
        return None
    return max(0, len(iterator) - iterator._num_yielded)


class Feed(Generic[T]):
    """See the module docstring; made in the loop's thread."""

    def __init__(
        self,
        iterator: Iterator[T],
        release: Callable[[], None] | None,
        *,
        snapshot: Callable[[], Any] | None = None,
    ) -> None:
        self.iterator = iterator
        self.lock = threading.Lock()
        #: A latch, held from the first close on: ``locked()`` is the cheapest thread-safe
        #: test of a flag, which the loop's thread makes before every inline read.
        self.closing = threading.Lock()
        self._release = release
        #: The producer thread inside a read, if any (a finaliser run in it must not wait).
        self._holder: int | None = None
        #: Producer reads left before it stops, and why it stops then (under the lock).
        self._left: int | None = None
        self._at_zero = Stop.BOUND
        self.stopped: Stop | None = None
        self.made: deque[Made] = deque()
        #: Whether producer reads take their thread's CPU time.
        self.measure = threading.Event()
        self.snapshots = None if snapshot is None else Snapshots(snapshot, deque())

    def resume(self, left: int | None) -> None:
        """Let a producer read ``left`` more batches (``None``: to the end)."""
        if not self._acquire():
            return  # closing: no read starts any more
        try:
            self._left = left
            self._at_zero = Stop.BOUND
            self.stopped = Stop.BOUND if left == 0 else None
        finally:
            self.lock.release()

    def why_stopped(self) -> Stop | None:
        """Why the producer's latest read raised ``StopIteration`` (``None``: it did not)."""
        if not self._acquire():
            return Stop.CLOSED
        try:
            return self.stopped
        finally:
            self.lock.release()

    def pause(self) -> None:
        """Stop the producer before its next read."""
        if not self._acquire():
            return  # closing: the producer stops anyway
        try:
            self._left = 0
            self._at_zero = Stop.PAUSED
        finally:
            self.lock.release()

    def __iter__(self) -> Feed[T]:
        return self

    def __next__(self) -> T:
        with self.lock:
            self._holder = get_ident()
            try:
                return self._read()
            finally:
                self._holder = None
                if self.closing.locked():
                    self.release_locked()  # a close() that could not wait left it here

    def _read(self) -> T:
        left = self._left
        if self.closing.locked() or left == 0:
            self.stopped = Stop.CLOSED if self.closing.locked() else self._at_zero
            raise StopIteration
        if left is not None:
            self._left = left - 1
        measure = self.measure.is_set()
        cpu = thread_time() if measure else 0.0
        start = perf_counter()
        made = False  # a batch, or its error: each goes to the loop with a snapshot
        try:
            item = next(self.iterator)
            made = True
        except StopIteration:
            self.stopped = Stop.END
            raise
        except Exception:
            made = True
            raise
        finally:
            end = perf_counter()
            self.made.append(Made(start, end, thread_time() - cpu if measure else 0.0, get_ident()))
            if made and self.snapshots is not None:
                self.snapshots.queue.append(self.snapshots.take())
        return item

    def close(self, timeout: float | None) -> bool:
        """Stop every read and release the iterator; say whether it was released here.

        Waits up to ``timeout`` seconds (``None``: as long as it takes, in short
        interruptible steps) for the read under way, inline or a producer's; if it does not
        end in time, or if this runs inside a producer's read (a finaliser in the producer
        thread), the reading thread releases the iterator as it leaves the read.
        """
        self.request_close()
        if self._holder == get_ident():
            return False
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self.lock.acquire(timeout=POLL_SECONDS):
            if deadline is not None and time.monotonic() >= deadline:
                return False
        try:
            self.release_locked()
        finally:
            self.lock.release()
        return True

    def wait_to_read(self) -> None:
        """Take :attr:`lock` for a read in the loop's thread; raise ``StopIteration`` instead
        once the feed is closing (a close holds the lock)."""
        if not self._acquire():
            raise StopIteration

    def _acquire(self) -> bool:
        """Take :attr:`lock` in short steps; ``False``, without it, once the feed is closing:
        a read under way holds it for as long as the read takes (a worker that hangs, say)."""
        while not self.lock.acquire(timeout=POLL_SECONDS):
            if self.closing.locked():
                return False
        return True

    def request_close(self) -> None:
        """Stop every read from now on (the iterator is released later)."""
        self.closing.acquire(blocking=False)

    @property
    def released(self) -> bool:
        """Whether the iterator was released (or had nothing to release) on closing."""
        return self.closing.locked() and self._release is None

    def release_locked(self) -> None:
        """Release the iterator, unless that happened already; the caller holds :attr:`lock`."""
        release, self._release = self._release, None
        if release is not None:
            release()


class Skipping(Generic[T]):
    """``source`` with its first ``skip`` outcomes (batches or their errors) dropped unseen."""

    def __init__(self, source: Iterator[T], skip: int) -> None:
        self._source = source
        self._skip = skip

    def __iter__(self) -> Skipping[T]:
        return self

    def __next__(self) -> T:
        while self._skip:
            self._skip -= 1
            try:
                next(self._source)
            except StopIteration:
                self._skip = 0
                raise
            except Exception:  # noqa: BLE001 - a batch the loop already saw fail
                continue
        return next(self._source)
