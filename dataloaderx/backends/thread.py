"""``thread``: a producer thread filling a bounded buffer (the default backend)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Literal, TypeVar

from dataloaderx.backends._depth_options import check_depth_options
from dataloaderx.backends._engine import start_thread_stream
from dataloaderx.backends.base import Backend, BatchStream
from dataloaderx.registry import register_backend

__all__ = ["ThreadBackend"]

T = TypeVar("T")


@register_backend("thread")
class ThreadBackend(Backend):
    """Prefetch up to ``depth`` batches (or ``"auto"``) in a background thread.

    Helps when making a batch or the training step releases the GIL (file and network
    I/O, native decoding, torch ops, waiting on a GPU). ``max_depth`` bounds
    ``depth="auto"``; ``max_bytes`` caps the bytes of tensors buffered.
    """

    def __init__(
        self,
        *,
        depth: int | Literal["auto"] = 2,
        max_depth: int | None = None,
        max_bytes: int | str | None = None,
    ) -> None:
        self.depth, self.max_depth, self.max_bytes = check_depth_options(
            self.name, depth=depth, max_depth=max_depth, max_bytes=max_bytes
        )

    def open(self, source: Iterator[T]) -> BatchStream[T]:
        return start_thread_stream(
            source,
            backend=self.name,
            depth=self.depth,
            max_depth=self.max_depth,
            max_bytes=self.max_bytes,
        )
