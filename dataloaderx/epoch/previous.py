"""``PreviousEpoch``: a loader's latest epoch over persistent workers, which must end before
the next ``iter(loader)`` resets their iterator."""

from __future__ import annotations

import weakref
from typing import Any

from dataloaderx.epoch.feed import Feed
from dataloaderx.epoch.iterator import PrefetchIterator

__all__ = ["PreviousEpoch"]


class PreviousEpoch:
    """The latest epoch of a loader with persistent workers: its iterator, held weakly (the
    loop owns it), and the source its producer reads, which outlives it."""

    def __init__(self) -> None:
        self._iterator: weakref.ref[PrefetchIterator[Any]] | None = None
        self._source: Feed[Any] | None = None

    def remember(self, iterator: PrefetchIterator[Any]) -> None:
        """``iterator`` is the epoch the next one ends."""
        self._iterator = weakref.ref(iterator)
        self._source = iterator.source

    def end(self) -> None:
        """Stop the epoch's producer and wait until it no longer reads the persistent-worker
        iterator."""
        iterator = None if self._iterator is None else self._iterator()
        if iterator is not None:
            iterator.close()
        if self._source is not None:
            self._source.close(timeout=None)
        self._iterator = self._source = None
