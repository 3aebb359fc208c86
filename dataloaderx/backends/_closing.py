"""A batch stream that releases more resources once its own ``close()`` has run."""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar

from dataloaderx.backends.base import BatchStream, pass_on

__all__ = ["ClosingStream"]

T = TypeVar("T")


class ClosingStream(Generic[T]):
    """Wrap ``stream`` so that ``close()`` closes it, then calls ``release`` (once).

    ``release`` runs after the stream's producer has stopped, so it may free what the
    producer used (copy threads, staging memory). The stream's optional attributes
    (``buffered`` and the others of :data:`OPTIONAL_STREAM_ATTRIBUTES`) are passed on.
    """

    def __init__(self, stream: BatchStream[T], release: Callable[[], None]) -> None:
        self._stream = stream
        self._release: Callable[[], None] | None = release
        pass_on(stream, self)

    def __iter__(self) -> ClosingStream[T]:
        return self

    def __next__(self) -> T:
        return next(self._stream)

    def close(self) -> None:
        """Close the stream, then release; safe to call more than once."""
        try:
            self._stream.close()
        finally:
            release, self._release = self._release, None
            if release is not None:
                release()
