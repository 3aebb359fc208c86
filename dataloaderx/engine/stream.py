"""Streams: one epoch's batches from a producer, as the loop's thread reads them. A producer
thread feeds a :class:`Buffer` with *envelopes*, one per ``next()`` of the source: a batch, a
per-batch error, a fatal error or the end, each with the warnings raised while it was made."""

from __future__ import annotations

import abc
import threading
import time
import warnings
from collections.abc import Callable
from typing import Any, Final, Generic, TypeVar

from dataloaderx.contracts.backend import BatchStream
from dataloaderx.engine.depth import BufferUsage
from dataloaderx.engine.warning_relay import reemit

T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)

#: Longest single sleep of any blocking wait before it re-checks its stop flag.
POLL_SECONDS: Final = 0.05
#: How long ``close()`` waits for a producer thread to finish its batch: below DataLoader's 5 s
#: worker-status poll, so closing (at exit after Ctrl-C killed the workers, say) never waits it out.
JOIN_TIMEOUT_SECONDS: Final = 1.0

ITEM: Final = 0
ERROR: Final = 1
FATAL: Final = 2
END: Final = 3

#: ``(kind, payload, warnings raised while making it)``.
Envelope = tuple[int, Any, "tuple[warnings.WarningMessage, ...] | None"]


class Stream(abc.ABC, Generic[T_co]):
    """What an epoch reads from while it prefetches; ``close()`` is idempotent and prompt."""

    def __iter__(self) -> Stream[T_co]:
        return self

    @abc.abstractmethod
    def __next__(self) -> T_co: ...

    @abc.abstractmethod
    def close(self) -> None: ...

    def buffered(self) -> int:
        """How many batches are ready to hand out (0: not known)."""
        return 0

    def usage(self) -> BufferUsage | None:
        """The buffer's depths and the most bytes it held (``None``: not known)."""
        return None

    def handed_out(self) -> bool:
        """Whether the stream has handed out a batch (``False``: none, or not known)."""
        return False


class Buffer(abc.ABC):
    """The transport from a producer thread to the loop's thread; thread-safe."""

    @abc.abstractmethod
    def __len__(self) -> int:
        """Envelopes ready to be received."""

    @abc.abstractmethod
    def get(self, producer_alive: Callable[[], bool]) -> Envelope:
        """The oldest envelope, waiting in short steps while the producer is alive."""

    @abc.abstractmethod
    def usage(self) -> BufferUsage:
        """The depths used so far and the most bytes of tensors held at once."""

    @abc.abstractmethod
    def handed_out(self) -> bool:
        """Whether :meth:`get` has returned a batch."""

    @abc.abstractmethod
    def clear(self) -> None:
        """Drop every envelope and wake both sides (only while closing): from now on a put
        is refused and a get on an empty buffer returns the end."""


class ThreadedStream(Stream[T]):
    """The loop's side of a producer thread: unpacks envelopes, and stops the thread.
    ``handout`` runs on each batch in the loop's thread before it is returned; ``after_close``
    runs once the thread has stopped (it may free what the thread used)."""

    def __init__(
        self,
        thread: threading.Thread,
        stop: threading.Event,
        buffer: Buffer,
        *,
        handout: Callable[[Any], T] | None = None,
        after_close: Callable[[], None] | None = None,
    ) -> None:
        self.thread = thread
        self._stop = stop
        self._buffer = buffer
        self._handout = handout
        self._after_close = after_close
        self._finished = False
        #: A latch, taken by the first close() (from any thread) and never released.
        self._closing = threading.Lock()

    def __next__(self) -> T:
        if self._finished:
            raise StopIteration
        kind, payload, caught = self._buffer.get(self.thread.is_alive)
        if caught:
            reemit(caught)
        if kind == ITEM:
            return payload if self._handout is None else self._handout(payload)
        # The end, or an error: the producer made its last envelope and stops.
        self._finished = True
        self.close()
        if kind == END:
            raise StopIteration
        try:
            raise payload
        finally:
            del payload

    def buffered(self) -> int:
        return len(self._buffer)

    def usage(self) -> BufferUsage:
        return self._buffer.usage()

    def handed_out(self) -> bool:
        return self._buffer.handed_out()

    def close(self) -> None:
        """Stop the producer, join it (up to ``JOIN_TIMEOUT_SECONDS``), then run ``after_close``.

        The buffer is closed before the stop flag is set, so that a loop waiting in another
        thread gets the end, and never takes the producer that the flag ends for a dead one.
        """
        if not self._closing.acquire(blocking=False):
            return  # closed, or closing in another thread
        self._finished = True
        self._buffer.clear()
        self._stop.set()
        try:
            self._join()
        finally:
            after_close, self._after_close = self._after_close, None
            if after_close is not None:
                after_close()

    def _join(self) -> None:
        thread = self.thread
        # In the producer thread (garbage collection ran the finaliser there), only make room
        # so that its next put cannot wait for a loop that is gone.
        if thread is not threading.current_thread():
            deadline = time.monotonic() + JOIN_TIMEOUT_SECONDS
            while True:
                self._buffer.clear()
                thread.join(POLL_SECONDS)
                if not thread.is_alive() or time.monotonic() >= deadline:
                    break
        self._buffer.clear()


class _Foreign(Stream[T]):
    """Any other backend's stream, with the default capabilities."""

    def __init__(self, stream: BatchStream[T]) -> None:
        self._stream = stream

    def __next__(self) -> T:
        return next(self._stream)

    def close(self) -> None:
        self._stream.close()


def as_stream(opened: BatchStream[T]) -> Stream[T]:
    """What ``Backend.open`` returned, as a :class:`Stream`."""
    return opened if isinstance(opened, Stream) else _Foreign(opened)


class _Empty(Stream[Any]):
    """A stream with no batch: where no producer starts because the epoch has none left."""

    def __next__(self) -> Any:
        raise StopIteration

    def close(self) -> None:
        """Nothing runs."""


EMPTY: Final[Stream[Any]] = _Empty()
