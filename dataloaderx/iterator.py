"""The iterator ``iter(DataLoaderX(...))`` returns."""

from __future__ import annotations

import math
import os
import time
import weakref
from collections.abc import Callable, Iterator
from time import perf_counter
from typing import Any, Final, Generic, TypeVar

from dataloaderx._direct import TIMED_TAIL, DirectRun, direct_of, no_take, settle_nothing
from dataloaderx._handoff_imports import import_handoff_modules
from dataloaderx._read_ahead import open_read_ahead_bounded, read_ahead_limit
from dataloaderx._source import GuardedSource
from dataloaderx._wrapper import ClosesOnExit, delegate
from dataloaderx.backends._engine import JOIN_TIMEOUT_SECONDS
from dataloaderx.backends.base import Backend, BatchStream
from dataloaderx.stats import StatsRecorder, TimedSource

__all__ = ["PrefetchIterator"]

T_co = TypeVar("T_co", covariant=True)


def _shut_down(
    stream: BatchStream[Any],
    source: GuardedSource[Any],
    owner_pid: int,
    stats: StatsRecorder | None,
    run: DirectRun,
) -> None:
    if os.getpid() != owner_pid:
        # A forked child (a DataLoader worker, say) inherited this iterator: its thread
        # does not exist here and its workers and queues belong to the parent.
        return
    # One budget for both waits, so that close() (and interpreter exit after Ctrl-C) is
    # bounded even when the producer is stuck inside a DataLoader wait; a producer still
    # inside ``next()`` afterwards releases the source itself on its way out.
    deadline = time.monotonic() + JOIN_TIMEOUT_SECONDS
    try:
        stream.close()
    finally:
        if stats is not None:
            stats.freeze_usage()
        source.close(timeout=max(0.0, deadline - time.monotonic()))
        # The resume position and stats may keep the run: not the iterator it took from.
        run.take = no_take


_OWN_ATTRIBUTES: Final = frozenset(
    {
        "_inner",
        "_source",
        "_stream",
        "_finalizer",
        "_yielded",
        "_stats",
        "_buffered",
        "_run",
        "_settle",
        "_ask_in",
        "_ask_gap",
    }
)

#: After a ``next()`` that found no direct run on offer, the next ones look again only
#: after this many more batches at most (1, 2, 4, ... up to it): asking costs a call per
#: layer, and a stream that prefetches says no to every question.
ASK_GAP_MAX: Final = 8


class PrefetchIterator(ClosesOnExit, Generic[T_co]):
    """One epoch of batches from a backend, with the interface of PyTorch's iterator.

    Supports ``next()``, ``len()``, ``close()`` and ``with``. It closes itself when the
    epoch ends, and when it is garbage collected. Attributes it does not define (for
    example ``_workers`` or ``_shutdown_workers``) are read from the wrapped iterator;
    ``_num_yielded`` counts the batches handed out here, as on PyTorch's iterator.
    With a ``stats`` recorder, every ``next()`` and every batch made is timed into it.

    Where the stream offers a direct run (batches made inline: ``sync``, or a steady
    inline run of an adaptive backend), ``next()`` takes them straight from the source
    and every layer accounts for them in bulk at the end of the run
    (:mod:`dataloaderx._direct`): the same batches, errors and counts, for one Python
    call per batch instead of one per layer. The run is its own small slotted object:
    this class defines ``__getattr__``, which makes every attribute read on it take the
    slow path, and the run's are read on every batch.
    """

    def __init__(
        self,
        inner: Iterator[T_co],
        backend: Backend,
        release: Callable[[], None] | None,
        stats: StatsRecorder | None = None,
    ) -> None:
        self._inner = inner
        self._yielded = 0
        self._stats = stats
        self._source: GuardedSource[T_co] = GuardedSource(inner, release)
        opened = self._source if stats is None else TimedSource(self._source, stats)
        # Before the backend starts anything that reads the source in another thread.
        import_handoff_modules()
        self._stream: BatchStream[T_co] = open_read_ahead_bounded(
            backend, opened, read_ahead_limit(inner)
        )
        self._buffered: Callable[[], int] | None = getattr(self._stream, "buffered", None)
        if stats is not None:
            stats.usage = getattr(self._stream, "buffer_usage", None)
            stats.mode_log = getattr(self._stream, "mode_log", None)
        self._run = DirectRun()
        self._settle: Callable[[], None] = settle_nothing
        self._finalizer = weakref.finalize(
            self, _shut_down, self._stream, self._source, os.getpid(), stats, self._run
        )
        # next() calls left before asking the stream for a direct run again, and the
        # gap after the next answer of no.
        self._ask_in = 0
        self._ask_gap = 1

    def __iter__(self) -> PrefetchIterator[T_co]:
        return self

    def __next__(self) -> T_co:
        run = self._run
        left = run.left
        if left:
            run.busy = True
            if not run.closing:
                left -= 1
                start = perf_counter()
                try:
                    batch: T_co = run.take()
                except BaseException as error:  # noqa: BLE001 - raised again, through the layers
                    run.busy = False
                    # Counted by no layer yet: the source raises it again to the next call,
                    # made through every layer, which each handle it as always.
                    self._source.replay(error)
                    self._end_run()
                    return self._next_through_layers()
                end = perf_counter()
                run.seconds += end - start
                if left < TIMED_TAIL:
                    run.ends[left] = end
                run.left = left
                run.busy = False
                if run.closing:  # close() came while the batch was being made
                    self._source.release_after_take()
                if not left or end > run.deadline:
                    self._end_run()
                return batch
            run.busy = False
            self._end_run()
            return self._next_through_layers()
        if self._ask_in:
            self._ask_in -= 1
        elif self._start_run():
            return self.__next__()
        return self._next_through_layers()

    @property
    def _num_yielded(self) -> int:
        """Batches handed out so far, as PyTorch's iterator counts them."""
        return self._yielded + self._run.taken()

    def _start_run(self) -> bool:
        """Take the direct run the stream offers, if any; say whether there is one."""
        run = self._run
        run.deadline = math.inf
        direct = direct_of(self._stream, run)
        if direct is None:
            self._ask_in = self._ask_gap
            self._ask_gap = min(2 * self._ask_gap, ASK_GAP_MAX)
            return False
        self._ask_gap = 1
        run.limit = run.left = direct.limit
        run.seconds = 0.0
        run.take = direct.take
        self._settle = direct.settle
        if self._stats is not None:
            self._stats.pending = run
        return True

    def _end_run(self) -> None:
        """Account for the run's batches in every layer."""
        run = self._run
        settle, self._settle = self._settle, settle_nothing
        run.take = no_take
        try:
            settle()
            if self._stats is not None:
                self._stats.record_direct(run)
        finally:
            self._yielded += run.taken()
            run.limit = run.left = 0
            run.forget_ends()

    def _next_through_layers(self) -> T_co:
        if self._stats is not None:
            return self._timed_next(self._stats)
        try:
            batch = next(self._stream)
        except StopIteration:
            self.close()
            raise
        self._yielded += 1
        return batch

    def _timed_next(self, stats: StatsRecorder) -> T_co:
        buffered = 0 if self._buffered is None else self._buffered()
        start = perf_counter()
        delivered = False
        try:
            batch = next(self._stream)
            delivered = True
        except StopIteration:
            self.close()
            raise
        finally:
            stats.record_next(start, perf_counter(), buffered, delivered)
        self._yielded += 1
        return batch

    def __len__(self) -> int:
        return len(self._inner)  # type: ignore[arg-type]

    def close(self) -> None:
        """Stop prefetching and release the source (worker processes included).

        Safe to call more than once.
        """
        self._finalizer()
        if self._run.limit:
            self._end_run()

    @property
    def source(self) -> GuardedSource[T_co]:
        """The guarded view of the wrapped iterator that the backend reads from."""
        return self._source

    def __getattr__(self, name: str) -> Any:
        return delegate(self._inner, name, _OWN_ATTRIBUTES)
