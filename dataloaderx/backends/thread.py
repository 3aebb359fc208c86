"""``thread``: a producer thread filling a bounded buffer (the default backend)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TypeVar

from dataloaderx.backends._engine import start_thread_stream
from dataloaderx.backends.base import Backend, BatchStream, check_positive_int
from dataloaderx.registry import register_backend

__all__ = ["ThreadBackend"]

T = TypeVar("T")


@register_backend("thread")
class ThreadBackend(Backend):
    """Prefetch up to ``depth`` batches in a background thread.

    Helps when making a batch or the training step releases the GIL (file and network
    I/O, native decoding, torch ops, waiting on a GPU).
    """

    def __init__(self, *, depth: int = 2) -> None:
        self.depth = check_positive_int(self.name, "depth", depth)

    def open(self, source: Iterator[T]) -> BatchStream[T]:
        return start_thread_stream(source, backend=self.name, depth=self.depth)
