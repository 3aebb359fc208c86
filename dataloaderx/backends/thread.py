"""``thread``: a producer thread filling a bounded buffer (the default backend)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Literal, TypeVar

from dataloaderx.backends import _adaptive
from dataloaderx.backends._depth_options import check_depth_options
from dataloaderx.backends._engine import start_thread_stream
from dataloaderx.backends.base import Backend, BatchStream, check_bool
from dataloaderx.registry import register_backend

__all__ = ["ThreadBackend"]

T = TypeVar("T")


@register_backend("thread")
class ThreadBackend(Backend):
    """Prefetch up to ``depth`` batches (or ``"auto"``) in a background thread, while that pays.

    Helps when making a batch or the training step releases the GIL (file and network
    I/O, native decoding, torch ops, waiting on a GPU). With ``adaptive=True`` (the
    default) the loader measures the first batches both ways and makes batches inline,
    as ``DataLoader`` does, where the thread would not pay; ``adaptive=False`` always
    prefetches. ``max_depth`` bounds ``depth="auto"``; ``max_bytes`` caps the bytes of
    tensors buffered.
    """

    def __init__(
        self,
        *,
        depth: int | Literal["auto"] = 2,
        max_depth: int | None = None,
        max_bytes: int | str | None = None,
        adaptive: bool = True,
    ) -> None:
        self.depth, self.max_depth, self.max_bytes = check_depth_options(
            self.name, depth=depth, max_depth=max_depth, max_bytes=max_bytes
        )
        self.adaptive = check_bool(self.name, "adaptive", adaptive)
        self._policy = _adaptive.new_policy() if self.adaptive else None

    def open(self, source: Iterator[T]) -> BatchStream[T]:
        limits: dict[str, Any] = {"max_depth": self.max_depth, "max_bytes": self.max_bytes}
        if self._policy is None:
            return start_thread_stream(source, backend=self.name, depth=self.depth, **limits)
        return _adaptive.start_adaptive_stream(
            source, backend=self.name, depth=self.depth, policy=self._policy, **limits
        )
