"""Counting what the training loop consumed, for any backend.

A backend's producer runs ahead of the loop. :class:`TrackedBackend` wraps any backend so
that the stream it opens counts batches where they are handed out (in the consumer's
thread), and, when given a ``snapshot`` function, takes a snapshot of the source's state
right after each batch is made and hands it over together with that batch.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar

from dataloaderx._direct import Direct, DirectRun, direct_of, narrowed
from dataloaderx.backends.base import Backend, BatchStream, pass_on

__all__ = ["Position", "TrackedBackend"]

T = TypeVar("T")


class Position:
    """Where one epoch stands, from the training loop's side.

    ``consumed`` counts the ``next()`` calls that handed out a batch or raised that
    batch's error (each uses up one batch of the epoch): those counted one by one
    (``settled``) and the batches of a direct run under way (``pending``; see
    :mod:`dataloaderx._direct`). ``finished`` is set once the epoch raised
    ``StopIteration``; ``state`` is the snapshot made with the latest batch handed out
    (or the one given at the start).
    """

    __slots__ = ("finished", "pending", "settled", "state")

    def __init__(self, consumed: int = 0, state: Any = None) -> None:
        self.settled = consumed
        self.pending: DirectRun | None = None
        self.finished = False
        self.state = state

    @property
    def consumed(self) -> int:
        """Batches of the epoch the loop has had (or had the error of)."""
        pending = self.pending
        return self.settled if pending is None else self.settled + pending.taken()


class _RecordingSource(Generic[T]):
    """The source as the backend sees it: each ``next()`` also queues a snapshot."""

    def __init__(
        self, source: Iterator[T], snapshot: Callable[[], Any], snapshots: deque[Any]
    ) -> None:
        self._source = source
        self._snapshot = snapshot
        self._snapshots = snapshots

    def __iter__(self) -> _RecordingSource[T]:
        return self

    def __next__(self) -> T:
        try:
            item = next(self._source)
        except StopIteration:
            raise
        except Exception:
            self._snapshots.append(self._snapshot())
            raise
        self._snapshots.append(self._snapshot())
        return item


class _SkippingSource(Generic[T]):
    """The source with its first ``skip`` outcomes made and dropped."""

    def __init__(self, source: Iterator[T], skip: int) -> None:
        self._source = source
        self._skip = skip

    def __iter__(self) -> _SkippingSource[T]:
        return self

    def __next__(self) -> T:
        while self._skip:
            self._skip -= 1
            try:
                next(self._source)
            except StopIteration:
                self._skip = 0
                raise
            except Exception:  # noqa: BLE001 - a batch the loop already saw fail
                continue
        return next(self._source)


class _CountingStream(BatchStream[T]):
    """The backend's stream as the loop sees it: counts (and pairs snapshots) at hand-out."""

    def __init__(
        self, stream: BatchStream[T], position: Position, snapshots: deque[Any] | None
    ) -> None:
        self._stream = stream
        self._position = position
        self._snapshots = snapshots
        pass_on(stream, self)

    def __next__(self) -> T:
        try:
            batch = next(self._stream)
        except StopIteration:
            self._position.finished = True
            raise
        except Exception:
            self._hand_out()
            raise
        self._hand_out()
        return batch

    def _hand_out(self) -> None:
        self._position.settled += 1
        if self._snapshots:
            self._position.state = self._snapshots.popleft()

    def direct(self, run: DirectRun) -> Direct | None:
        """The stream's direct runs, counted in as they go; none where each batch
        carries a snapshot of the source's state."""
        if self._snapshots is not None:
            return None
        position = self._position

        def settle() -> None:
            position.settled += run.taken()

        found = narrowed(direct_of(self._stream, run), None, settle)
        if found is not None:
            position.pending = run
        return found

    def close(self) -> None:
        self._stream.close()


class TrackedBackend(Backend):
    """``backend`` with the batches handed out counted into ``position``.

    With ``skip``, the source's first ``skip`` outcomes (batches or per-batch errors) are
    made and discarded in the producer's thread before the first one is handed out.
    With ``snapshot``, it is called in the producer's thread right after each batch
    (or per-batch error) is made, and its result becomes ``position.state`` when that
    batch is handed out. Any backend that hands out every batch it reads, once and in
    order, is tracked exactly without code of its own.
    """

    def __init__(
        self,
        backend: Backend,
        position: Position,
        snapshot: Callable[[], Any] | None = None,
        skip: int = 0,
    ) -> None:
        self._backend = backend
        self._position = position
        self._snapshot = snapshot
        self._skip = skip

    def open(self, source: Iterator[T]) -> BatchStream[T]:
        if self._skip:
            source = _SkippingSource(source, self._skip)
        if self._snapshot is None:
            return _CountingStream(self._backend.open(source), self._position, None)
        snapshots: deque[Any] = deque()
        recording = _RecordingSource(source, self._snapshot, snapshots)
        return _CountingStream(self._backend.open(recording), self._position, snapshots)

    def describe(self) -> dict[str, Any]:
        return self._backend.describe()
