"""``background``: ``prefetch_generator.BackgroundGenerator``, made safe to stop."""

from __future__ import annotations

import queue
import sys
import threading
from collections.abc import Iterator
from typing import Any, TypeVar

from dataloaderx.backends._engine import (
    END,
    FATAL,
    POLL_SECONDS,
    Envelope,
    ThreadedStream,
    produce,
    thread_name,
)
from dataloaderx.backends.base import Backend, BatchStream, check_positive_int
from dataloaderx.registry import register_backend

__all__ = ["BackgroundBackend"]

T = TypeVar("T")


@register_backend("background", aliases=("prefetch_generator",))
class BackgroundBackend(Backend):
    """Prefetch with ``prefetch_generator.BackgroundGenerator(max_prefetch=depth)``.

    ``BackgroundGenerator`` alone leaks its thread when the loop stops early, because its
    ``queue.put`` never times out. Here it is fed a generator that checks a stop flag,
    and ``close()`` drains its queue until the thread has ended.
    """

    def __init__(self, *, depth: int = 2) -> None:
        self.depth = check_positive_int(self.name, "depth", depth)

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
        generator = BackgroundGenerator(produce(source, stop), max_prefetch=self.depth)
        generator.name = thread_name(self.name)
        pending: queue.Queue[tuple[bool, Any]] = generator.queue

        def receive() -> Envelope:
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
                    envelope: Envelope = payload
                    return envelope
                # BackgroundGenerator's own end marker or an error from its thread.
                if payload is StopIteration:
                    return (END, None, None)
                return (FATAL, payload, None)

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
        )
