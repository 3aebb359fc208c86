"""An example dataloaderx plugin: the ``logged`` backend.

Installing this distribution registers the backend through its ``dataloaderx.backends``
entry point, so ``DataLoaderX(..., backend="logged")`` works without importing this
module first.
"""

from __future__ import annotations

import logging
from collections.abc import Generator, Iterator
from typing import TypeVar

from dataloaderx import Backend, BatchStream
from dataloaderx.contracts.checks import check_positive_int

__all__ = ["LoggedBackend"]

T = TypeVar("T")

logger = logging.getLogger(__name__)


class LoggedBackend(Backend):
    """No prefetch; logs the running batch count every ``every`` batches."""

    def __init__(self, *, every: int = 100) -> None:
        # Validate options here, before any iteration starts, naming the option.
        self.every = check_positive_int(self.name, "every", every)

    def open(self, source: Iterator[T]) -> BatchStream[T]:
        # A generator object is a valid BatchStream: next() and an idempotent close().
        return self._batches(source)

    def _batches(self, source: Iterator[T]) -> Generator[T, None, None]:
        for count, batch in enumerate(source, start=1):
            if count % self.every == 0:
                logger.info("%s batches so far", count)
            yield batch
