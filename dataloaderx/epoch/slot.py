"""The producer an epoch runs, if any: what closing stops and the statistics read."""

from __future__ import annotations

import threading
from typing import Any

from dataloaderx.contracts.policy import Mode
from dataloaderx.engine.depth import BufferUsage
from dataloaderx.engine.stream import Stream


class ProducerSlot:
    """Holds the epoch's producer stream while one runs, which closing the epoch (from any
    thread) stops; thread-safe. ``mode`` is how the latest batches were made, ``usage`` the
    buffer usage of the latest producer that handed out a batch, else of the first."""

    __slots__ = ("_lock", "_stream", "mode", "usage")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._stream: Stream[Any] | None = None
        self.mode: Mode | None = None
        self.usage: BufferUsage | None = None

    def hold(self, stream: Stream[Any]) -> None:
        """``stream`` runs from now on."""
        with self._lock:
            self._stream = stream

    def stop(self) -> None:
        """Close the running stream, if any, and keep its buffer usage."""
        with self._lock:
            stream, self._stream = self._stream, None
            if stream is None:
                return
            try:
                stream.close()
            finally:
                usage = stream.usage()  # one that only read past the end adds nothing
                if usage is not None and (stream.handed_out() or self.usage is None):
                    self.usage = usage

    def __getstate__(self) -> dict[str, Any]:  # a copy keeps what the figures need only
        return {"mode": self.mode, "usage": self.current_usage()}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__()  # type: ignore[misc]
        self.mode = state["mode"]
        self.usage = state["usage"]

    def current_usage(self) -> BufferUsage | None:
        """The running producer's buffer usage, else the latest one's."""
        with self._lock:
            stream = self._stream
            return self.usage if stream is None else stream.usage() or self.usage
