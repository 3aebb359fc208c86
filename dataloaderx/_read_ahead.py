"""Prefetch no further than the epoch's last batch until the loop asks for more.

A single-process ``DataLoader`` over a map-style dataset reads its sampler only when the
loop calls ``next()``. Reading past the last batch has an effect: ``RandomSampler``
draws one more permutation from its generator as it ends, which changes the next
epoch's order. A loop that stops by length (Lightning, ``for _ in range(len(loader))``)
never makes that read; a ``for`` loop makes it when it asks for the batch after the
last. A producer thread must not make it for them, or the next epoch's order would
depend on whether (and when) the producer got there.

:func:`open_read_ahead_bounded` therefore opens the backend on at most the epoch's
remaining batches; only when the loop asks for the next one is the backend opened
again on the rest of the source, which then ends the epoch (or, if the sampler's length
was wrong, goes on making batches).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Generic, TypeVar

from torch.utils.data.dataloader import _DatasetKind, _SingleProcessDataLoaderIter

from dataloaderx._direct import Direct, DirectRun, direct_of, narrowed
from dataloaderx.backends.base import Backend, BatchStream, pass_on

__all__ = ["open_read_ahead_bounded", "read_ahead_limit"]

T = TypeVar("T")


def read_ahead_limit(inner: Iterator[Any]) -> int | None:
    """How many batches may be made ahead of the loop, or ``None`` for no limit.

    Only a single-process map-style ``DataLoader`` iterator reads its sampler on demand;
    with worker processes DataLoader itself reads the sampler ahead.
    """
    if not isinstance(inner, _SingleProcessDataLoaderIter):
        return None
    if inner._dataset_kind != _DatasetKind.Map:
        return None
    return max(0, len(inner) - inner._num_yielded)


class _Bounded(Generic[T]):
    """``source``, ending after ``limit`` calls without touching it again."""

    def __init__(self, source: Iterator[T], limit: int) -> None:
        self._source = source
        self._left = limit
        self.reached = False

    def __iter__(self) -> _Bounded[T]:
        return self

    def __next__(self) -> T:
        if self._left <= 0:
            self.reached = True
            raise StopIteration
        self._left -= 1  # a call that raises used up its batch of indices too
        return next(self._source)

    def direct(self, run: DirectRun) -> Direct | None:
        """The source's direct runs, no longer than the batches left before the limit."""

        def settle() -> None:
            self._left -= run.taken()

        return narrowed(direct_of(self._source, run), self._left, settle)


class _ReopeningStream(Generic[T]):
    """The backend's stream over the bounded source, then over the rest on demand."""

    def __init__(self, backend: Backend, source: Iterator[T], limit: int) -> None:
        self._backend = backend
        self._source = source
        self._bounded = _Bounded(source, limit)
        # An epoch with no batch left starts nothing until the loop asks.
        self._stream: BatchStream[T] | None = backend.open(self._bounded) if limit else None
        self._reopened = False
        pass_on(self._stream, self)

    def __next__(self) -> T:
        if self._stream is not None:
            try:
                return next(self._stream)
            except StopIteration:
                if self._reopened or not self._bounded.reached:
                    raise
            self._stream.close()
        # The loop asked for the batch after the last one: now the source may be read.
        self._reopened = True
        self._stream = self._backend.open(self._source)
        return next(self._stream)

    def direct(self, run: DirectRun) -> Direct | None:
        """The current stream's direct runs (its source is bounded while it must be)."""
        return None if self._stream is None else direct_of(self._stream, run)

    def close(self) -> None:
        """Close the current stream; safe to call more than once."""
        if self._stream is not None:
            self._stream.close()


def open_read_ahead_bounded(
    backend: Backend, source: Iterator[T], limit: int | None
) -> BatchStream[T]:
    """``backend.open(source)``, reading at most ``limit`` batches before the loop asks."""
    if limit is None:
        return backend.open(source)
    return _ReopeningStream(backend, source, limit)
