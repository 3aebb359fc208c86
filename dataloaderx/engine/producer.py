"""The producer thread: makes one epoch's batches ahead of the loop, as envelopes, into a
``Channel`` (``docs/design.md``, *The producer thread* and *Shutdown protocol*)."""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple, Protocol, TypeVar

from dataloaderx.engine.buffer_options import DepthSpec
from dataloaderx.engine.byte_budget import Measure, batch_bytes
from dataloaderx.engine.channel import Channel, new_channel
from dataloaderx.engine.stream import END, ERROR, FATAL, ITEM, Envelope, ThreadedStream
from dataloaderx.engine.warning_relay import start_capture, take_captured

T = TypeVar("T")

_numbers = itertools.count(1)
_numbers_lock = threading.Lock()


def thread_name(backend: str) -> str:
    """A unique, recognisable name for a producer thread of ``backend``."""
    with _numbers_lock:
        number = next(_numbers)
    return f"dataloaderx-{backend}-{number}"


class Hooks(NamedTuple):
    """What a backend adds to its producer thread's work."""

    #: Runs first in the producer thread (for example to select a device).
    on_start: Callable[[], None] | None = None
    #: Runs on each batch in the producer thread (for example a host-to-device copy).
    prepare: Callable[[Any], Any] | None = None
    #: Runs on each batch in the loop's thread, just before it is handed out.
    handout: Callable[[Any], Any] | None = None
    #: Counts the bytes of a prepared batch, against ``max_bytes``.
    measure: Measure = batch_bytes
    #: Runs once the producer thread has stopped.
    after_close: Callable[[], None] | None = None


def produce(
    source: Iterator[Any],
    stop: threading.Event,
    *,
    prepare: Callable[[Any], Any] | None = None,
    on_start: Callable[[], None] | None = None,
) -> Iterator[Envelope]:
    """Yield one envelope per ``next(source)`` until the end, a failed batch or ``stop``.

    An ``Exception`` from ``source`` or ``prepare`` is that batch's error; one from
    ``on_start``, or any other ``BaseException``, is fatal. Either is the last envelope: the
    producer never reads past a failed batch, so a loop that leaves the epoch at the error
    leaves no thread behind, and one that asks for more gets them from a new producer
    (``docs/design.md``, *The producer thread*)."""
    start_capture()
    if on_start is not None:
        try:
            on_start()
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer
            yield (FATAL, exc, take_captured())
            return
    while not stop.is_set():
        failure: BaseException | None = None
        try:
            item = next(source)
        except StopIteration:
            yield (END, None, take_captured())
            return
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer
            failure = exc
        if failure is None and prepare is not None:
            try:
                item = prepare(item)
            except BaseException as exc:  # noqa: BLE001 - handed to the consumer
                failure = exc
        if failure is None:
            yield (ITEM, item, take_captured())
            continue
        fatal = not isinstance(failure, Exception)  # KeyboardInterrupt, SystemExit
        last = [(FATAL if fatal else ERROR, failure, take_captured())]
        del failure
        # The error's traceback holds this frame, which may stay suspended here for good
        # (a consumer that leaves): no local of it may hold the error, or that is a cycle.
        yield last.pop()
        return


def _pump(
    envelopes: Iterator[Envelope], channel: Channel, stop: threading.Event, measure: Measure
) -> None:
    for envelope in envelopes:
        size = measure(envelope[1]) if envelope[0] == ITEM else 0
        if not channel.put(envelope, stop, size):
            return


class Buffered(Protocol):
    """What sizes a producer's buffer: a prefetching backend's options (and its name, which
    names the thread)."""

    @property
    def name(self) -> str: ...
    @property
    def depth(self) -> DepthSpec: ...
    @property
    def max_depth(self) -> int | None: ...
    @property
    def max_bytes(self) -> int | None: ...


def start_producer(
    source: Iterator[Any],
    backend: Buffered,
    hooks: Hooks = Hooks(),  # noqa: B008 - an immutable value
) -> ThreadedStream[T]:
    """Start a daemon producer thread feeding a channel of ``backend.depth`` batches
    (``"auto"``: sized by a controller, up to ``max_depth``); ``max_bytes`` caps the bytes
    of tensors queued, as ``hooks.measure`` counts them in each prepared batch."""
    stop = threading.Event()
    channel = new_channel(backend.depth, backend.max_depth, backend.max_bytes)
    envelopes = produce(source, stop, prepare=hooks.prepare, on_start=hooks.on_start)
    args = (envelopes, channel, stop, hooks.measure)
    name = thread_name(backend.name)
    thread = threading.Thread(target=_pump, args=args, name=name, daemon=True)
    thread.start()
    return ThreadedStream(
        thread, stop, channel, handout=hooks.handout, after_close=hooks.after_close
    )
