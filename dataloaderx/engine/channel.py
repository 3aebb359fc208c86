"""The bounded buffer between one producer thread and the loop's thread."""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from time import perf_counter
from typing import Final

from dataloaderx.engine.buffer_options import AUTO, DEFAULT_MAX_DEPTH, DepthSpec
from dataloaderx.engine.byte_budget import ByteBudget
from dataloaderx.engine.depth import BufferUsage, DepthController, StallMeter, fixed_usage
from dataloaderx.engine.stream import END, ITEM, POLL_SECONDS, Buffer, Envelope

#: A batch made faster than this is "fast": the loop is woken once per several.
FAST_ITEM_SECONDS: Final = 0.0005
#: Longest wait of the loop for fast batches before it looks at the buffer again.
FAST_POLL_SECONDS: Final = 0.002


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
        #: Whether the latest batch took less than FAST_ITEM_SECONDS to make.
        self._fast = False
        #: Who waits now: the loop, and the producer (with the bytes of its item).
        self._loop_waits = False
        self._producer_waits: int | None = None
        #: How often the producer waited for room under the depth limit, and the cap.
        self._waits = [0, 0]
        #: Set by :meth:`clear`: the stream closed, and a waiting loop gets the end.
        self._cleared = False

    def __len__(self) -> int:
        with self._lock:
            return len(self._items)

    def put(
        self, item: Envelope, stop: threading.Event, size: int = 0, *, fast: bool = False
    ) -> bool:
        """Append ``item`` (``size`` bytes of tensors; ``fast``: made in a hurry) once there is
        room; return ``False`` if ``stop`` is set first."""
        with self._lock:
            counted = False
            while len(self._items) >= self._depth or not self._budget.fits(size):
                if stop.is_set():
                    return False
                if not counted:
                    counted = True
                    self._waits[0 if self._budget.fits(size) else 1] += 1
                if self._loop_waits:
                    self._not_empty.notify()  # it may be waiting for a pile of fast batches
                self._producer_waits = size
                self._not_full.wait(POLL_SECONDS)
                self._producer_waits = None
            if stop.is_set():
                return False
            self._items.append((item, size))
            self._budget.add(size)
            self._fast = fast
            if self._loop_waits and (not fast or item[0] != ITEM):
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
                self._not_empty.wait(FAST_POLL_SECONDS if self._fast else POLL_SECONDS)
                self._loop_waits = False
            item, size = self._items.popleft()
            self._budget.remove(size)
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
