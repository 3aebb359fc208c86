"""Producer-thread machinery shared by every threaded backend.

The pieces, each used by more than one backend:

* :func:`produce` turns a source iterator into *envelopes*, one per ``next()``: a batch,
  a per-batch error, a fatal error or the end, each with the warnings it raised. It
  checks a stop flag before every ``next()``.
* :class:`Channel` is a bounded single-producer, single-consumer buffer whose waits all
  time out and re-check a stop flag; bounded by a depth (fixed, or sized by a
  :class:`~dataloaderx.backends._depth_control.DepthController`) and optionally by bytes.
* :class:`ThreadedStream` is the consumer side: it unpacks envelopes in the consumer's
  thread and owns the shutdown of the producer thread (``close()``, idempotent).
* :func:`start_thread_stream` wires the three together on a named daemon thread.

The shutdown protocol is described in ``docs/design.md``.
"""

from __future__ import annotations

import itertools
import threading
import time
import warnings
from collections import deque
from collections.abc import Callable, Iterator
from time import perf_counter
from typing import Any, Final, Generic, TypeVar

from dataloaderx._warning_relay import reemit, start_capture, take_captured
from dataloaderx.backends._byte_budget import ByteBudget, Measure, batch_bytes
from dataloaderx.backends._depth_control import BufferUsage, DepthController, fixed_usage
from dataloaderx.backends._depth_options import AUTO, DEFAULT_MAX_DEPTH, DepthSpec

__all__ = [
    "END",
    "ERROR",
    "FAST_ITEM_SECONDS",
    "FAST_POLL_SECONDS",
    "FATAL",
    "ITEM",
    "JOIN_TIMEOUT_SECONDS",
    "POLL_SECONDS",
    "Channel",
    "Envelope",
    "StallMeter",
    "ThreadedStream",
    "measure_envelope",
    "new_channel",
    "produce",
    "start_thread_stream",
    "thread_name",
]

T = TypeVar("T")

#: Longest single sleep of any blocking wait before it re-checks its stop flag.
POLL_SECONDS: Final = 0.05
#: A batch made faster than this is "fast": the consumer is woken once per several.
FAST_ITEM_SECONDS: Final = 0.0005
#: Longest wait of a consumer for fast batches before it re-checks the buffer.
FAST_POLL_SECONDS: Final = 0.002
#: How long ``close()`` waits for the producer thread to finish the batch it is making.
#: Kept below DataLoader's 5 s worker-status poll, so that closing (for example at
#: interpreter exit after Ctrl-C killed the workers) never waits out that poll.
JOIN_TIMEOUT_SECONDS: Final = 1.0

ITEM: Final = 0
ERROR: Final = 1
FATAL: Final = 2
END: Final = 3

#: ``(kind, payload, warnings raised while making it)``.
Envelope = tuple[int, Any, "tuple[warnings.WarningMessage, ...] | None"]

_thread_numbers = itertools.count(1)


def thread_name(backend: str) -> str:
    """Return a unique, recognisable name for a producer thread of ``backend``."""
    return f"dataloaderx-{backend}-{next(_thread_numbers)}"


def produce(
    source: Iterator[Any],
    stop: threading.Event,
    *,
    prepare: Callable[[Any], Any] | None = None,
    on_start: Callable[[], None] | None = None,
) -> Iterator[Envelope]:
    """Yield one envelope per ``next(source)`` until the end, a fatal error or ``stop``.

    Runs in the producer thread. ``on_start`` runs first (for example to select a
    device); ``prepare`` transforms each batch (for example a host-to-device copy). An
    ``Exception`` from either is delivered as a per-batch error and production goes on,
    as PyTorch's own iterator does; any other ``BaseException`` ends production.
    """
    start_capture()
    if on_start is not None:
        try:
            on_start()
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer
            yield (FATAL, exc, take_captured())
            return
    while not stop.is_set():
        try:
            item = next(source)
        except StopIteration:
            yield (END, None, take_captured())
            return
        except Exception as exc:  # noqa: BLE001 - handed to the consumer
            yield (ERROR, exc, take_captured())
            continue
        except BaseException as exc:  # noqa: BLE001 - KeyboardInterrupt, SystemExit
            yield (FATAL, exc, take_captured())
            return
        if prepare is not None:
            try:
                item = prepare(item)
            except Exception as exc:  # noqa: BLE001 - handed to the consumer
                yield (ERROR, exc, take_captured())
                continue
            except BaseException as exc:  # noqa: BLE001
                yield (FATAL, exc, take_captured())
                return
        yield (ITEM, item, take_captured())


class StallMeter:
    """Times the consumer's calls on a buffer sized by ``controller``, and feeds it.

    Runs in the consumer's thread only. The producer side reports how often it waited
    for room under the depth limit and under the byte cap, as two counters it alone
    increments; the meter passes on whether each changed since the previous call.
    """

    __slots__ = ("_last", "_seen", "controller")

    def __init__(self, controller: DepthController) -> None:
        self.controller = controller
        self._last: float | None = None
        self._seen = (0, 0)

    def observe(self, start: float, buffered: int, room_waits: int, byte_waits: int) -> int:
        """Account for a call that began at ``start`` and found ``buffered`` items ready.

        Returns the depth the controller chose.
        """
        end = perf_counter() if buffered == 0 else start
        last, self._last = self._last, end
        seen, self._seen = self._seen, (room_waits, byte_waits)
        return self.controller.observe(
            buffered=buffered,
            waited=end - start,
            step=None if last is None else start - last,
            room_waited=room_waits != seen[0],
            byte_waited=byte_waits != seen[1],
        )


class Channel:
    """Bounded buffer between one producer thread and one consumer thread.

    Both fast paths are lock-free (``deque.append`` / ``deque.popleft``); a side takes an
    event's lock only to wake the other, and only when the other may be asleep:

    * The producer sleeps only on a full buffer. While it sleeps the length drops one
      by one, so the consumer sees it reach the low-water mark exactly once per
      drain, and wakes the producer there.
    * The consumer sleeps only on an empty buffer. A batch that took at least
      :data:`FAST_ITEM_SECONDS` to make wakes it at once, as do the end of the epoch
      and errors. Faster batches are left to pile up: the producer wakes the consumer
      just before it sleeps on the full buffer itself, so the two threads take turns
      in runs of ``depth`` batches instead of trading the GIL on every batch. Meanwhile
      the consumer re-checks every :data:`FAST_POLL_SECONDS`, which bounds the extra
      latency of a ready batch.

    Lost wake-ups are ruled out by the clear-then-recheck order: a side clears its
    event, re-checks the buffer, and only then waits. Its partner wakes it only after an
    ``append``/``popleft`` that the re-check did not see, so after the re-check (the
    buffer's operations are atomic and ordered, by the GIL or, in a free-threaded
    build, by the deque's own lock): the ``set()`` cannot precede the ``clear()``.
    Every wait is also bounded by :data:`POLL_SECONDS` and re-checks its stop
    condition, so nothing can hang.

    With ``max_bytes``, an item also waits until the :class:`ByteBudget` admits its size
    (the producer advertises that size before re-checking, and the consumer wakes it once
    it fits). With a ``controller`` (``depth="auto"``), each ``get`` feeds a
    :class:`StallMeter` and applies the depth it returns.
    """

    def __init__(
        self,
        depth: int,
        *,
        max_bytes: int | None = None,
        controller: DepthController | None = None,
    ) -> None:
        self.depth = depth if controller is None else controller.depth
        self._low_water = self.depth // 2
        self._items: deque[Envelope] = deque()
        #: The bytes of each item, appended before the item and removed after it.
        self._sizes: deque[int] = deque()
        self.budget = ByteBudget(max_bytes)
        self._meter = None if controller is None else StallMeter(controller)
        self._not_empty = threading.Event()
        self._not_full = threading.Event()
        #: Whether the latest batch took less than FAST_ITEM_SECONDS to make.
        self._fast = False
        self._resumed: float | None = None
        # Producer-only: waits for room under the depth limit, and under the byte cap;
        # the bytes of the item it is waiting to put under the cap (0: not waiting so).
        self._room_waits = 0
        self._byte_waits = 0
        self._wants = 0

    def __len__(self) -> int:
        return len(self._items)

    def put(self, item: Envelope, stop: threading.Event, size: int = 0) -> bool:
        """Append ``item`` (``size`` bytes of tensors) once there is room.

        Return ``False`` if ``stop`` is set first. There is room when fewer than
        ``depth`` items are queued and the byte budget admits ``size`` more.
        """
        now = perf_counter()
        resumed = self._resumed
        fast = resumed is not None and now - resumed < FAST_ITEM_SECONDS
        items = self._items
        budget = self.budget
        if len(items) >= self.depth or (budget.limit is not None and not budget.fits(size)):
            self._not_empty.set()  # the consumer may be waiting for fast batches
            if not self._wait_for_room(stop, size):
                return False
            now = perf_counter()
        elif stop.is_set():
            return False
        self._sizes.append(size)
        if size:
            budget.add(size)
        items.append(item)
        if not fast or item[0] != ITEM:
            self._not_empty.set()
        self._fast = fast
        self._resumed = now
        return True

    def _wait_for_room(self, stop: threading.Event, size: int) -> bool:
        items = self._items
        budget = self.budget
        counted = False
        try:
            while True:
                self._not_full.clear()
                # Advertised before the re-check, so a consumer that frees bytes after
                # it cannot miss that this thread waits for them.
                self._wants = size if budget.limit is not None else 0
                fits = budget.fits(size)
                if fits and len(items) < self.depth:
                    return not stop.is_set()
                if stop.is_set():
                    return False
                if fits:
                    self._wants = 0  # only the depth limit: woken at the low-water mark
                if not counted:
                    counted = True
                    if fits:
                        self._room_waits += 1
                    else:
                        self._byte_waits += 1
                self._not_full.wait(POLL_SECONDS)
        finally:
            self._wants = 0

    def get(self, producer_alive: Callable[[], bool]) -> Envelope:
        """Return the oldest item, waiting for one while the producer is alive."""
        items = self._items
        meter = self._meter
        if meter is None:
            item: Envelope | None
            try:
                item = items.popleft()
            except IndexError:
                item = None
            if item is None:
                # Waiting outside the ``except`` block keeps an interrupt raised while
                # waiting from being reported as raised "during handling of" the IndexError.
                item = self._wait_for_item(producer_alive)
        else:
            item = self._take_tuned(producer_alive, meter)
        size = self._sizes.popleft()
        if size:
            self.budget.remove(size)
        remaining = len(items)
        wants = self._wants
        if remaining == self._low_water or (
            wants and remaining < self.depth and self.budget.fits(wants)
        ):
            self._not_full.set()
        return item

    def _take_tuned(self, producer_alive: Callable[[], bool], meter: StallMeter) -> Envelope:
        start = perf_counter()
        buffered = len(self._items)
        try:
            item = self._items.popleft()
        except IndexError:
            item = None
        if item is None:
            item = self._wait_for_item(producer_alive)
        depth = meter.observe(start, buffered, self._room_waits, self._byte_waits)
        if depth != self.depth:
            grew = depth > self.depth
            self.depth = depth
            self._low_water = depth // 2
            if grew:
                self._not_full.set()
        return item

    def _wait_for_item(self, producer_alive: Callable[[], bool]) -> Envelope:
        items = self._items
        while True:
            self._not_empty.clear()
            try:
                return items.popleft()
            except IndexError:
                pass
            if not producer_alive():
                try:
                    return items.popleft()
                except IndexError:
                    raise RuntimeError(
                        "dataloaderx: the producer thread ended without delivering a batch, "
                        "an error or the end of the epoch"
                    ) from None
            self._not_empty.wait(FAST_POLL_SECONDS if self._fast else POLL_SECONDS)

    def usage(self) -> BufferUsage:
        """The depths used so far and the most bytes of tensors held at once."""
        peak = self.budget.peak
        if self._meter is None:
            return fixed_usage(self.depth, peak)
        return self._meter.controller.usage(peak)

    def clear(self) -> None:
        """Drop every buffered item and wake a waiting producer (only while closing)."""
        self._items.clear()
        self._sizes.clear()
        self._not_full.set()


class ThreadedStream(Generic[T]):
    """Consumer side of one epoch produced by a background thread.

    ``receive`` returns the next envelope (waiting in short, interruptible steps);
    ``drain`` empties the transport so a producer blocked on a full buffer can return;
    ``handout`` runs in the consumer's thread on each batch before it is returned;
    ``buffered`` (optional) counts the envelopes ready to be received; ``usage``
    (optional) reports the depths used and the peak bytes held.
    """

    def __init__(
        self,
        *,
        thread: threading.Thread,
        stop: threading.Event,
        receive: Callable[[], Envelope],
        drain: Callable[[], None],
        handout: Callable[[Any], T] | None = None,
        buffered: Callable[[], int] | None = None,
        usage: Callable[[], BufferUsage] | None = None,
    ) -> None:
        self.thread = thread
        if buffered is not None:
            self.buffered = buffered
        if usage is not None:
            self.buffer_usage = usage
        self._stop = stop
        self._receive = receive
        self._drain = drain
        self._handout = handout
        self._finished = False
        self._closed = False

    def __iter__(self) -> ThreadedStream[T]:
        return self

    def __next__(self) -> T:
        if self._finished:
            raise StopIteration
        kind, payload, caught = self._receive()
        if caught:
            reemit(caught)
        if kind == ITEM:
            return payload if self._handout is None else self._handout(payload)
        if kind == ERROR:
            try:
                raise payload
            finally:
                del payload
        self._finished = True
        self.close()
        if kind == FATAL:
            try:
                raise payload
            finally:
                del payload
        raise StopIteration

    def close(self) -> None:
        """Stop the producer and wait (up to :data:`JOIN_TIMEOUT_SECONDS`) for it to end."""
        if self._closed:
            return
        self._closed = True
        self._finished = True
        self._stop.set()
        thread = self.thread
        if thread is threading.current_thread():
            # Garbage collection ran the finaliser inside the producer thread: make room
            # so that its next put cannot wait for a consumer that is gone.
            self._drain()
            return
        deadline = time.monotonic() + JOIN_TIMEOUT_SECONDS
        while True:
            self._drain()
            thread.join(POLL_SECONDS)
            if not thread.is_alive() or time.monotonic() >= deadline:
                break
        self._drain()


def _pump(
    envelopes: Iterator[Envelope], channel: Channel, stop: threading.Event, measure: Measure
) -> None:
    for envelope in envelopes:
        size = measure(envelope[1]) if envelope[0] == ITEM else 0
        if not channel.put(envelope, stop, size):
            return


def measure_envelope(envelope: Envelope, measure: Measure) -> int:
    """The bytes ``measure`` counts in a batch envelope; 0 for any other envelope."""
    return measure(envelope[1]) if envelope[0] == ITEM else 0


def new_channel(depth: DepthSpec, max_depth: int | None, max_bytes: int | None) -> Channel:
    """A :class:`Channel` of a fixed ``depth``, or sized by a controller for ``"auto"``."""
    if depth == AUTO:
        controller = DepthController(DEFAULT_MAX_DEPTH if max_depth is None else max_depth)
        return Channel(controller.depth, max_bytes=max_bytes, controller=controller)
    return Channel(depth, max_bytes=max_bytes)


def start_thread_stream(
    source: Iterator[Any],
    *,
    backend: str,
    depth: DepthSpec,
    prepare: Callable[[Any], Any] | None = None,
    on_start: Callable[[], None] | None = None,
    handout: Callable[[Any], T] | None = None,
    max_depth: int | None = None,
    max_bytes: int | None = None,
    measure: Measure = batch_bytes,
) -> ThreadedStream[T]:
    """Start a daemon producer thread feeding a :class:`Channel` of ``depth`` batches.

    ``depth="auto"`` lets a :class:`DepthController` size the buffer, up to ``max_depth``;
    ``max_bytes`` caps the bytes of tensors queued, as ``measure`` counts them in each
    (prepared) batch.
    """
    stop = threading.Event()
    channel = new_channel(depth, max_depth, max_bytes)
    envelopes = produce(source, stop, prepare=prepare, on_start=on_start)
    thread = threading.Thread(
        target=_pump,
        args=(envelopes, channel, stop, measure),
        name=thread_name(backend),
        daemon=True,
    )
    thread.start()
    return ThreadedStream(
        thread=thread,
        stop=stop,
        receive=lambda: channel.get(thread.is_alive),
        drain=channel.clear,
        handout=handout,
        buffered=channel.__len__,
        usage=channel.usage,
    )
