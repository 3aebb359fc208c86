"""The iterator ``iter(DataLoaderX(...))`` returns: one epoch of batches."""

from __future__ import annotations

import inspect
import os
import time
import weakref
from collections.abc import Callable, Iterator
from time import perf_counter
from typing import Any, Final, Generic, TypeVar

from dataloaderx.contracts.backend import Backend
from dataloaderx.engine.handoff_imports import import_handoff_modules
from dataloaderx.engine.stream import JOIN_TIMEOUT_SECONDS
from dataloaderx.epoch.feed import Feed
from dataloaderx.epoch.forks import never_finalize_in_children
from dataloaderx.epoch.position import Position, Tracking
from dataloaderx.epoch.run import TAIL
from dataloaderx.epoch.state import SWITCHED, EpochState
from dataloaderx.epoch.stats import EpochStats
from dataloaderx.util.wrapping import ClosesOnExit, delegate

T_co = TypeVar("T_co", covariant=True)

_OWN_ATTRIBUTES: Final = frozenset({"_inner", "_epoch", "_finalizer"})


def _shut_down(epoch: EpochState[Any], owner_pid: int) -> None:
    if os.getpid() != owner_pid:
        # A forked child (a DataLoader worker, say) inherited this iterator: its thread
        # does not exist here and its workers and queues belong to the parent.
        return
    epoch.stats.stop(perf_counter())
    # One budget for both waits, so that close() (and interpreter exit after Ctrl-C) is
    # bounded even when the producer is stuck inside a DataLoader wait; a producer still
    # reading afterwards releases the source itself on its way out.
    deadline = time.monotonic() + JOIN_TIMEOUT_SECONDS
    try:
        epoch.slot.stop()
    finally:
        epoch.feed.close(timeout=max(0.0, deadline - time.monotonic()))


class PrefetchIterator(ClosesOnExit, Generic[T_co]):
    """One epoch of batches from a backend, with the interface of PyTorch's iterator.

    Supports ``next()``, ``len()``, ``close()`` and ``with``; closes itself when the epoch
    ends or it is garbage collected. Attributes it does not define (``_workers``,
    ``_shutdown_workers``, ...) are read from the wrapped iterator; ``_num_yielded``
    counts the batches handed out here. Each batch is made by the backend's producer or,
    while the backend's policy says so, *inline*: inside ``next()``, in the loop's thread,
    as ``DataLoader`` makes it (``docs/design.md``, *One epoch*).
    """

    def __init__(
        self,
        inner: Iterator[T_co],
        backend: Backend,
        release: Callable[[], None] | None,
        *,
        stats: EpochStats | None = None,
        tracking: Tracking | None = None,
        num_workers: int = 0,
        resized: Callable[[], bool] | None = None,
    ) -> None:
        self._inner = inner
        never_finalize_in_children(inner)
        self._epoch: EpochState[T_co] = EpochState(
            inner,
            backend,
            release,
            EpochStats(False) if stats is None else stats,
            Tracking(Position()) if tracking is None else tracking,
            num_workers,
            resized,
        )
        self._finalizer = weakref.finalize(self, _shut_down, self._epoch, os.getpid())
        # Before the backend starts anything that reads the source in another thread.
        import_handoff_modules()
        self._epoch.start(self._finalizer, helpers=num_workers > 0)

    def __iter__(self) -> PrefetchIterator[T_co]:
        return self

    def __next__(self) -> T_co:
        # The one attribute read on this object: its __getattr__ makes every read slow.
        epoch = self._epoch
        stream = epoch.stream
        while stream is not None:
            try:
                made = epoch.next_prefetched(stream)
            except Exception:
                del self  # (see below)
                raise
            if made is not SWITCHED:
                return made  # type: ignore[return-value]
            stream = epoch.stream  # the producer stopped: the epoch goes on another way
        # Inline: PyTorch's iterator, under the feed's lock, and a count.
        feed = epoch.feed
        start = perf_counter()
        try:
            if not feed.lock.acquire(False):
                feed.wait_to_read()
            try:
                if feed.closing.locked():
                    raise StopIteration
                batch = epoch.take()
            finally:
                if feed.closing.locked():
                    feed.release_locked()  # a close() that could not wait left it here
                feed.lock.release()
        except BaseException as error:
            epoch.inline_failed(error, start)
            if isinstance(error, Exception):
                # Its traceback keeps this frame, and PyTorch keeps an error from a worker in
                # a reference cycle: without ``self`` in the frame, an epoch left at an error
                # is collected and shut down at once, as after a ``break``. An interrupt
                # leaves it to the end of the exception, so that it reaches the loop at once.
                del self
            raise
        end = perf_counter()
        run = epoch.run
        run.seconds += end - start
        left = run.left = run.left - 1
        if left <= TAIL:
            run.ends.append(end)
        if not left or end > run.deadline:
            epoch.run_over(end)
        return batch

    @property
    def _num_yielded(self) -> int:
        """Batches handed out so far, as PyTorch's iterator counts them."""
        return self._epoch.position.handed

    def __len__(self) -> int:
        return len(self._inner)  # type: ignore[arg-type]

    def close(self) -> None:
        """Stop prefetching and release the source (worker processes included).

        Safe to call more than once, and from any thread. A read under way (in the loop's
        thread or a producer's) ends first: if it takes longer than the shutdown's budget,
        its thread releases the source as it leaves the read. Called from inside this
        iterator's own ``next()`` (a signal handler), it ends the epoch at once and leaves
        the release to the loop's next ``next()``, or to the collection of this iterator.
        """
        if self._inside_next():
            self._epoch.request_close()
        else:
            self._finalizer()

    def _inside_next(self) -> bool:
        """Whether the calling thread is inside this iterator's ``next()``: its own call
        stack holds a frame of ``__next__`` on this object's epoch."""
        frame = inspect.currentframe()
        code = PrefetchIterator.__next__.__code__
        while frame is not None:
            if frame.f_code is code and frame.f_locals.get("epoch") is self._epoch:
                return True
            frame = frame.f_back
        return False

    @property
    def source(self) -> Feed[T_co]:
        """The guarded view of the wrapped iterator that the backend reads from."""
        return self._epoch.feed

    def __getattr__(self, name: str) -> Any:
        return delegate(self._inner, name, _OWN_ATTRIBUTES)
