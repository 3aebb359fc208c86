"""``thread``: a producer thread filling a bounded buffer (the default backend)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TypeVar

from dataloaderx.backends import _adaptive
from dataloaderx.backends._engine import start_thread_stream
from dataloaderx.backends.base import Backend, BatchStream, check_bool, check_positive_int
from dataloaderx.registry import register_backend

__all__ = ["ThreadBackend"]

T = TypeVar("T")


@register_backend("thread")
class ThreadBackend(Backend):
    """Prefetch up to ``depth`` batches in a background thread, while that pays.

    Helps when making a batch or the training step releases the GIL (file and network
    I/O, native decoding, torch ops, waiting on a GPU). With ``adaptive=True`` (the
    default) the loader measures the first batches both ways and makes batches inline,
    as ``DataLoader`` does, where the thread would not pay; ``adaptive=False`` always
    prefetches.
    """

    def __init__(self, *, depth: int = 2, adaptive: bool = True) -> None:
        self.depth = check_positive_int(self.name, "depth", depth)
        self.adaptive = check_bool(self.name, "adaptive", adaptive)
        self._policy = _adaptive.new_policy() if self.adaptive else None

    def open(self, source: Iterator[T]) -> BatchStream[T]:
        if self._policy is None:
            return start_thread_stream(source, backend=self.name, depth=self.depth)
        return _adaptive.start_adaptive_stream(
            source, backend=self.name, depth=self.depth, policy=self._policy
        )
