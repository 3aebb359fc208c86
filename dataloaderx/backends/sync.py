"""``sync``: no prefetching; batches are made in the consumer's thread on demand."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TypeVar

from dataloaderx._direct import Direct, DirectRun, direct_of
from dataloaderx.backends.base import Backend, BatchStream
from dataloaderx.registry import register_backend

__all__ = ["SyncBackend"]

T = TypeVar("T")


class _InlineStream(BatchStream[T]):
    def __init__(self, source: Iterator[T]) -> None:
        self._source = source

    def __next__(self) -> T:
        return next(self._source)

    def direct(self, run: DirectRun) -> Direct | None:
        """Every batch may be taken straight from the source: this stream adds nothing."""
        return direct_of(self._source, run)

    def close(self) -> None:
        """Nothing runs in the background, so there is nothing to stop."""


@register_backend("sync", aliases=("none",))
class SyncBackend(Backend):
    """No prefetch: the plain ``DataLoader`` behaviour, as a baseline."""

    def open(self, source: Iterator[T]) -> BatchStream[T]:
        return _InlineStream(source)
