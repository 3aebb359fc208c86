"""The iterator ``iter(DataLoaderX(...))`` returns."""

from __future__ import annotations

import os
import time
import weakref
from collections.abc import Callable, Iterator
from time import perf_counter
from typing import Any, Final, Generic, TypeVar

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


_OWN_ATTRIBUTES: Final = frozenset(
    {"_inner", "_source", "_stream", "_finalizer", "_num_yielded", "_stats", "_buffered"}
)


class PrefetchIterator(ClosesOnExit, Generic[T_co]):
    """One epoch of batches from a backend, with the interface of PyTorch's iterator.

    Supports ``next()``, ``len()``, ``close()`` and ``with``. It closes itself when the
    epoch ends, and when it is garbage collected. Attributes it does not define (for
    example ``_workers`` or ``_shutdown_workers``) are read from the wrapped iterator;
    ``_num_yielded`` counts the batches handed out here, as on PyTorch's iterator.
    With a ``stats`` recorder, every ``next()`` and every batch made is timed into it.
    """

    def __init__(
        self,
        inner: Iterator[T_co],
        backend: Backend,
        release: Callable[[], None] | None,
        stats: StatsRecorder | None = None,
    ) -> None:
        self._inner = inner
        self._num_yielded = 0
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
        self._finalizer = weakref.finalize(
            self, _shut_down, self._stream, self._source, os.getpid(), stats
        )

    def __iter__(self) -> PrefetchIterator[T_co]:
        return self

    def __next__(self) -> T_co:
        if self._stats is not None:
            return self._timed_next(self._stats)
        try:
            batch = next(self._stream)
        except StopIteration:
            self.close()
            raise
        self._num_yielded += 1
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
        self._num_yielded += 1
        return batch

    def __len__(self) -> int:
        return len(self._inner)  # type: ignore[arg-type]

    def close(self) -> None:
        """Stop prefetching and release the source (worker processes included).

        Safe to call more than once.
        """
        self._finalizer()

    @property
    def source(self) -> GuardedSource[T_co]:
        """The guarded view of the wrapped iterator that the backend reads from."""
        return self._source

    def __getattr__(self, name: str) -> Any:
        return delegate(self._inner, name, _OWN_ATTRIBUTES)
