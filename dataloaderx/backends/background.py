"""``background``: ``prefetch_generator.BackgroundGenerator``, made safe to stop."""

from __future__ import annotations

import queue
import sys
import threading
from collections.abc import Iterator
from time import perf_counter
from typing import Any, Literal, TypeVar

from dataloaderx.contracts.backend import Backend, BatchStream
from dataloaderx.engine.buffer_options import AUTO, DEFAULT_MAX_DEPTH, check_depth_options
from dataloaderx.engine.byte_budget import ByteBudget, batch_bytes
from dataloaderx.engine.depth import BufferUsage, DepthController, StallMeter, fixed_usage
from dataloaderx.engine.producer import produce, thread_name
from dataloaderx.engine.stream import (
    END,
    FATAL,
    ITEM,
    POLL_SECONDS,
    Buffer,
    Envelope,
    ThreadedStream,
)

__all__ = ["BackgroundBackend"]

T = TypeVar("T")

#: Queue items: ``(True, [envelope, bytes])`` each, then ``(False, StopIteration or error)``.
_Queued = tuple[bool, Any]


class _Gate:
    """The generator ``BackgroundGenerator`` runs: before yielding a batch (with its bytes) it
    waits, under the queue's lock and in stop-checking steps, for room in the queue and byte
    budget (its blocking ``put`` is only a backstop), counting waits for the depth controller."""

    def __init__(self, envelopes: Iterator[Envelope], stop: threading.Event, budget: ByteBudget):
        self._envelopes = envelopes
        self._stop = stop
        self.budget = budget
        self.pending: queue.Queue[_Queued] | None = None
        self.ready = threading.Event()  #: set once pending is known (its thread starts at once)
        self.room_waits = 0
        self.byte_waits = 0

    def __iter__(self) -> Iterator[list[Any]]:
        """Each envelope with its bytes, in a list that the loop empties: a frame of this thread
        that outlives it (Python 3.12 keeps a finished generator's callers, locals and all,
        reachable from an error's traceback) must not hold the error it handed over."""
        while not self.ready.wait(POLL_SECONDS):
            if self._stop.is_set():
                return
        for envelope in self._envelopes:
            size = batch_bytes(envelope[1]) if envelope[0] == ITEM else 0
            if not self._admit(size):
                return
            yield [envelope, size]
            del envelope

    def _admit(self, size: int) -> bool:
        pending: Any = self.pending  # set before ``ready``
        with pending.mutex:
            counted = False
            while len(pending.queue) >= pending.maxsize or not self.budget.fits(size):
                if self._stop.is_set():
                    return False
                if not counted:
                    counted = True
                    if self.budget.fits(size):
                        self.room_waits += 1
                    else:
                        self.byte_waits += 1
                pending.not_full.wait(POLL_SECONDS)
            if self._stop.is_set() or pending.maxsize == sys.maxsize:  # stopped, or cleared
                return False
            self.budget.add(size)
        return True


class _QueueBuffer(Buffer):
    """The loop's side of ``BackgroundGenerator``'s queue."""

    def __init__(
        self, pending: queue.Queue[_Queued], gate: _Gate, controller: DepthController | None
    ) -> None:
        self._pending = pending
        self._depth = pending.maxsize  #: the fixed depth (closing lifts ``maxsize``)
        self._gate = gate
        self._meter = None if controller is None else StallMeter(controller)
        self._cleared = False  #: set by clear(): the stream closed; a waiting loop gets the end
        self._handed = False

    def __len__(self) -> int:
        with self._pending.mutex:
            return len(self._pending.queue)

    def get(self, producer_alive: Any) -> Envelope:
        start = perf_counter()
        buffered = len(self)
        while True:
            try:
                ok, payload = self._pending.get(timeout=POLL_SECONDS)
                break
            except queue.Empty:
                with self._pending.mutex:
                    if self._cleared:
                        return (END, None, None)  # closed meanwhile, from another thread
                if producer_alive() or len(self):
                    continue
                raise RuntimeError(
                    "dataloaderx: the BackgroundGenerator thread ended without "
                    "delivering a batch, an error or the end of the epoch"
                ) from None
        if not ok:  # BackgroundGenerator's own end marker, or an error from its thread
            return (END, None, None) if payload is StopIteration else (FATAL, payload, None)
        size = payload.pop()
        envelope = payload.pop()
        pending, gate = self._pending, self._gate
        with pending.mutex:
            gate.budget.remove(size)
            self._handed = self._handed or envelope[0] == ITEM
            if self._meter is not None:
                chosen = self._meter.observe(start, buffered, gate.room_waits, gate.byte_waits)
                if pending.maxsize != sys.maxsize:  # not while closing
                    pending.maxsize = chosen
            pending.not_full.notify_all()
        return envelope  # type: ignore[no-any-return]

    def usage(self) -> BufferUsage:
        with self._pending.mutex:
            peak = self._gate.budget.peak
            if self._meter is None:
                return fixed_usage(self._depth, peak)
            return self._meter.controller.usage(peak)

    def handed_out(self) -> bool:
        with self._pending.mutex:
            return self._handed

    def clear(self) -> None:
        # Only while closing. BackgroundGenerator's puts never time out and, when the garbage
        # collector closes the stream in that very thread, nobody clears again: lift the bound
        # for its last puts and wake a waiting one (it loops on ``qsize() >= maxsize``: not 0).
        pending = self._pending
        with pending.mutex:
            pending.maxsize = sys.maxsize
            pending.queue.clear()
            self._gate.budget.held = 0
            self._cleared = True
            pending.not_full.notify_all()


class BackgroundBackend(Backend):
    """Prefetch with ``prefetch_generator.BackgroundGenerator(max_prefetch=depth)``.

    Alone it leaks its thread when the loop stops early (its ``queue.put`` never times out);
    here its generator checks a stop flag and ``close()`` drains its queue until the thread
    ends. ``depth="auto"`` resizes the queue (to ``max_depth``); ``max_bytes`` caps its bytes.
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

    @classmethod
    def unavailable_reason(cls) -> str | None:
        try:
            import prefetch_generator  # noqa: F401
        except ImportError:
            return (
                "backend 'background' needs the package prefetch_generator; "
                "install it with `pip install prefetch_generator` or use backend='thread'"
            )
        return None

    def open(self, source: Iterator[T]) -> BatchStream[T]:
        from prefetch_generator import BackgroundGenerator

        stop = threading.Event()
        controller = None
        depth = self.depth
        if depth == AUTO:
            controller = DepthController(self.max_depth or DEFAULT_MAX_DEPTH)
            depth = controller.depth
        gate = _Gate(produce(source, stop), stop, ByteBudget(self.max_bytes))
        generator = BackgroundGenerator(gate, max_prefetch=depth)
        generator.name = thread_name(self.name)
        pending: queue.Queue[_Queued] = generator.queue
        gate.pending = pending
        gate.ready.set()
        return ThreadedStream(generator, stop, _QueueBuffer(pending, gate, controller))
