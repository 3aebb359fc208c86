"""The bounded buffer between one producer thread and the loop's thread."""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from time import perf_counter

from dataloaderx.engine.buffer_options import AUTO, DEFAULT_MAX_DEPTH, DepthSpec
from dataloaderx.engine.byte_budget import ByteBudget
from dataloaderx.engine.depth import BufferUsage, DepthController, StallMeter, fixed_usage
from dataloaderx.engine.stream import END, ITEM, POLL_SECONDS, Buffer, Envelope


class Channel(Buffer):
    """A bounded buffer of envelopes; one lock guards every field, and each side waits on its
    condition only when it must, with a timeout (``docs/design.md``, *Handoff*). With a
    ``controller`` (``depth="auto"``), each :meth:`get` feeds it and applies its depth."""

    def __init__(
        self, depth: int, *, max_bytes: int | None = None, controller: DepthController | None = None
    ) -> None:
        self._lock = threading.Lock()
        self._not_empty = threading.Condition(self._lock)
        self._not_full = threading.Condition(self._lock)
        self._items: deque[tuple[Envelope, int]] = deque()
        self._budget = ByteBudget(max_bytes)
        self._depth = depth if controller is None else controller.depth
        self._meter = None if controller is None else StallMeter(controller)
        #: Who waits now: the loop, and the producer (with the bytes of its item).
        self._loop_waits = False
        self._producer_waits: int | None = None
        #: How often the producer waited for room under the depth limit, and the cap.
        self._waits = [0, 0]
        #: Set by :meth:`clear`: the stream closed, and a waiting loop gets the end.
        self._cleared = False
        self._handed = False

    def __len__(self) -> int:
        with self._lock:
            return len(self._items)

    def put(self, item: Envelope, stop: threading.Event, size: int = 0) -> bool:
        """Append ``item`` (``size`` bytes of tensors) once there is room; return ``False`` if
        ``stop`` is set or the channel cleared first."""
        with self._lock:
            counted = False
            while len(self._items) >= self._depth or not self._budget.fits(size):
                if stop.is_set() or self._cleared:
                    return False
                if not counted:
                    counted = True
                    self._waits[0 if self._budget.fits(size) else 1] += 1
                self._producer_waits = size
                self._not_full.wait(POLL_SECONDS)
                self._producer_waits = None
            if stop.is_set() or self._cleared:
                return False
            self._items.append((item, size))
            self._budget.add(size)
            if self._loop_waits:
                self._not_empty.notify()
        return True

    def get(self, producer_alive: Callable[[], bool]) -> Envelope:
        with self._lock:
            start = perf_counter() if self._meter is not None else 0.0
            buffered = len(self._items)
            while not self._items:
                if self._cleared:
                    return (END, None, None)  # closed meanwhile, from another thread
                if not producer_alive():
                    raise RuntimeError(
                        "dataloaderx: the producer thread ended without delivering a batch, "
                        "an error or the end of the epoch"
                    )
                self._loop_waits = True
                self._not_empty.wait(POLL_SECONDS)
                self._loop_waits = False
            item, size = self._items.popleft()
            self._budget.remove(size)
            self._handed = self._handed or item[0] == ITEM
            if self._meter is not None:
                self._depth = self._meter.observe(start, buffered, *self._waits)
            waiting = self._producer_waits  # the bytes of its batch, if it waits for room
            if (
                waiting is not None
                and len(self._items) < self._depth
                and self._budget.fits(waiting)
            ):
                self._not_full.notify()
            return item

    def usage(self) -> BufferUsage:
        with self._lock:
            peak = self._budget.peak
            if self._meter is None:
                return fixed_usage(self._depth, peak)
            return self._meter.controller.usage(peak)

    def handed_out(self) -> bool:
        with self._lock:
            return self._handed

    def clear(self) -> None:
        with self._lock:
            self._items.clear()
            self._budget.held = 0
            self._cleared = True
            self._not_full.notify()
            self._not_empty.notify()


def new_channel(depth: DepthSpec, max_depth: int | None, max_bytes: int | None) -> Channel:
    """A :class:`Channel` of a fixed ``depth``, or sized by a controller for ``"auto"``."""
    if depth == AUTO:
        controller = DepthController(DEFAULT_MAX_DEPTH if max_depth is None else max_depth)
        return Channel(controller.depth, max_bytes=max_bytes, controller=controller)
    return Channel(depth, max_bytes=max_bytes)
