"""``thread``: a producer thread filling a bounded buffer (the default backend)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Literal, TypeVar

from dataloaderx.contracts.backend import Backend, BatchStream, InlineMode
from dataloaderx.contracts.checks import check_bool
from dataloaderx.engine import decision
from dataloaderx.engine.buffer_options import check_depth_options
from dataloaderx.engine.producer import start_producer

__all__ = ["ThreadBackend"]

T = TypeVar("T")


class ThreadBackend(Backend):
    """Prefetch up to ``depth`` batches (or ``"auto"``) in a background thread, while that pays.

    Helps when making a batch or the step releases the GIL (I/O, native decoding, torch ops,
    GPU waits). ``adaptive=True`` (default) makes batches inline, as ``DataLoader`` does, where
    measuring the first batches shows the thread would not pay; ``False`` always prefetches.
    ``max_depth`` bounds ``depth="auto"``; ``max_bytes`` caps the tensor bytes buffered.
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
        self._policy = decision.new_policy() if self.adaptive else None

    def inline_mode(self) -> InlineMode | None:
        return None if self._policy is None else InlineMode(self._policy)

    def open(self, source: Iterator[T]) -> BatchStream[T]:
        return start_producer(source, self)
