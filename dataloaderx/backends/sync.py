"""``sync``: no prefetching; batches are made in the consumer's thread on demand."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TypeVar

from dataloaderx.contracts.backend import Backend, BatchStream, InlineMode
from dataloaderx.engine.stream import Stream

__all__ = ["SyncBackend"]

T = TypeVar("T")


class _OnDemand(Stream[T]):
    """``source`` itself, read when asked."""

    def __init__(self, source: Iterator[T]) -> None:
        self._source = source

    def __next__(self) -> T:
        return next(self._source)

    def close(self) -> None: ...  # nothing runs in the background, so nothing to stop


class SyncBackend(Backend):
    """No prefetch: the plain ``DataLoader`` behaviour, as a baseline."""

    def inline_mode(self) -> InlineMode:
        return InlineMode(policy=None)

    def open(self, source: Iterator[T]) -> BatchStream[T]:
        return _OnDemand(source)
