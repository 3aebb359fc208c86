"""``background``: ``prefetch_generator.BackgroundGenerator``, made safe to stop."""

from __future__ import annotations

import queue
import sys
import threading
from collections.abc import Iterator
from time import perf_counter
from typing import Any, Literal, TypeVar

from dataloaderx.backends._byte_budget import ByteBudget, batch_bytes
from dataloaderx.backends._depth_control import (
    BufferUsage,
    DepthController,
    fixed_usage,
)
from dataloaderx.backends._depth_options import (
    AUTO,
    DEFAULT_MAX_DEPTH,
    check_depth_options,
)
from dataloaderx.backends._engine import (
    END,
    FATAL,
    POLL_SECONDS,
    Envelope,
    StallMeter,
    ThreadedStream,
    measure_envelope,
    produce,
    thread_name,
)
from dataloaderx.backends.base import Backend, BatchStream
from dataloaderx.registry import register_backend

__all__ = ["BackgroundBackend"]

T = TypeVar("T")


class _Gate:
    """The generator ``BackgroundGenerator`` runs: envelopes with their bytes, within bounds.

    Before releasing a batch into the queue it waits (in short, stop-checking steps) until
    the queue has room under its current size and the byte budget admits the batch, so the
    queue's own blocking ``put`` is only a backstop. It counts how often it waited for
    each, for the depth controller.
    """

    def __init__(
        self, envelopes: Iterator[Envelope], stop: threading.Event, budget: ByteBudget
    ) -> None:
        self._envelopes = envelopes
        self._stop = stop
        self.budget = budget
        self.pending: queue.Queue[tuple[bool, Any]] | None = None
        self.freed = threading.Event()
        self.waiting = False
        self.room_waits = 0
        self.byte_waits = 0

    def __iter__(self) -> Iterator[tuple[Envelope, int]]:
        for envelope in self._envelopes:
            size = measure_envelope(envelope, batch_bytes)
            if not (self._has_room() and self.budget.fits(size)) and not self._wait(size):
                return
            self.budget.add(size)
            yield envelope, size

    def _has_room(self) -> bool:
        pending = self.pending
        return pending is None or len(pending.queue) < pending.maxsize

    def _wait(self, size: int) -> bool:
        if self.budget.fits(size):
            self.room_waits += 1
        else:
            self.byte_waits += 1
        try:
            while True:
                self.freed.clear()
                self.waiting = True  # before the re-check: the consumer then wakes us
                if self._has_room() and self.budget.fits(size):
                    return True
                if self._stop.is_set():
                    return False
                self.freed.wait(POLL_SECONDS)
        finally:
            self.waiting = False

    def wake(self) -> None:
        """Consumer: room or bytes were freed; wake the gate if it waits for them."""
        if self.waiting:
            self.freed.set()


@register_backend("background", aliases=("prefetch_generator",))
class BackgroundBackend(Backend):
    """Prefetch with ``prefetch_generator.BackgroundGenerator(max_prefetch=depth)``.

    ``BackgroundGenerator`` alone leaks its thread when the loop stops early, because its
    ``queue.put`` never times out. Here it is fed a generator that checks a stop flag,
    and ``close()`` drains its queue until the thread has ended. ``depth="auto"`` resizes
    its queue (up to ``max_depth``); ``max_bytes`` caps the bytes of tensors it holds.
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
        pending: queue.Queue[tuple[bool, Any]] = generator.queue
        gate.pending = pending
        meter = None if controller is None else StallMeter(controller)

        def take() -> Envelope:
            while True:
                try:
                    ok, payload = pending.get(timeout=POLL_SECONDS)
                except queue.Empty:
                    if generator.is_alive() or not pending.empty():
                        continue
                    raise RuntimeError(
                        "dataloaderx: the BackgroundGenerator thread ended without "
                        "delivering a batch, an error or the end of the epoch"
                    ) from None
                if ok:
                    envelope, size = payload
                    gate.budget.remove(size)
                    gate.wake()
                    return envelope  # type: ignore[no-any-return]
                # BackgroundGenerator's own end marker or an error from its thread.
                if payload is StopIteration:
                    return (END, None, None)
                return (FATAL, payload, None)

        def receive() -> Envelope:
            if meter is None:
                return take()
            start = perf_counter()
            buffered = len(pending.queue)
            envelope = take()
            chosen = meter.observe(start, buffered, gate.room_waits, gate.byte_waits)
            if chosen != pending.maxsize:
                with pending.mutex:
                    if pending.maxsize != sys.maxsize:  # not while closing
                        pending.maxsize = chosen
                        pending.not_full.notify_all()
                gate.wake()
            return envelope

        def usage() -> BufferUsage:
            if controller is None:
                return fixed_usage(depth, gate.budget.peak)
            return controller.usage(gate.budget.peak)

        def drain() -> None:
            # Runs only while closing. BackgroundGenerator's puts never time out, and when
            # the garbage collector closes the stream inside that very thread nobody would
            # drain again: so lift the bound, letting its last puts (the batch in hand and
            # its end marker) through, and wake a put already waiting. (``maxsize = 0``
            # would not do: a put already waiting loops while ``qsize() >= maxsize``.)
            with pending.mutex:
                pending.maxsize = sys.maxsize
                pending.queue.clear()
                pending.not_full.notify_all()

        return ThreadedStream(
            thread=generator,
            stop=stop,
            receive=receive,
            drain=drain,
            buffered=lambda: len(pending.queue),
            usage=usage,
        )
