"""The ``depth="auto"`` controller: how many batches the buffer may hold.

Pure logic, fed once per ``next()`` of the training loop with what the consumer side of a
buffer saw; it never sleeps or reads a clock, so tests drive it with scripted sequences.

* **Grow** when the loop had to wait for data (a *stall*) although the producer spent some
  of the time since the previous stall waiting for room under the depth limit: a deeper
  buffer would have let it work ahead. The step is the stall's length in consumer steps
  (at least 1), so one long burst is absorbed at once. Growth stops at ``max_depth``, and
  does not happen when the producer waited on the byte cap (``max_bytes``) instead.
* **Shrink** by one when, over a whole window of :data:`WINDOW` calls, the buffer never
  held fewer than 2 batches when the loop asked: one slot fewer would not have made it
  wait. At most one step per window, so shrinking is slow, and it never undoes growth
  that a stall in the same window asked for.

A loop that is slower than the producer (the buffer stays full) shrinks to the floor and
stays there; a producer that is always slower than the loop never waits for room, so the
depth does not grow for nothing. Neither case oscillates.
"""

from __future__ import annotations

import math
import sys
from typing import Final, NamedTuple

__all__ = [
    "MIN_STALL_FRACTION",
    "START_DEPTH",
    "WINDOW",
    "BufferUsage",
    "DepthController",
    "fixed_usage",
]

#: The depth ``"auto"`` starts at, and never goes below (unless ``max_depth`` is lower).
START_DEPTH: Final = 2
#: Calls per shrink window.
WINDOW: Final = 64
#: A wait shorter than this fraction of the loop's step is hand-off noise, not a stall.
MIN_STALL_FRACTION: Final = 0.02
#: Weight of the newest step in the running estimate of the loop's step time.
_STEP_WEIGHT: Final = 0.1


class BufferUsage(NamedTuple):
    """How deep the buffer was over an epoch, and the most bytes of tensors it held."""

    depth_min: int
    depth_median: int
    depth_max: int
    peak_bytes: int


def fixed_usage(depth: int, peak_bytes: int) -> BufferUsage:
    """The usage of a buffer whose depth never changed."""
    return BufferUsage(depth, depth, depth, peak_bytes)


class DepthController:
    """Chooses the depth of one epoch's buffer, between a floor and ``max_depth``."""

    __slots__ = (
        "_byte_waited",
        "_counts",
        "_lowest",
        "_room_waited",
        "_seen",
        "_step",
        "depth",
        "floor",
        "max_depth",
    )

    def __init__(self, max_depth: int) -> None:
        self.max_depth = max_depth
        self.floor = min(START_DEPTH, max_depth)
        self.depth = self.floor
        self._step: float | None = None
        self._seen = 0
        self._lowest = sys.maxsize
        self._room_waited = False
        self._byte_waited = False
        #: ``_counts[d]``: calls made while the depth was ``d``.
        self._counts = [0] * (max_depth + 1)

    def observe(
        self,
        *,
        buffered: int,
        waited: float,
        step: float | None,
        room_waited: bool,
        byte_waited: bool,
    ) -> int:
        """Account for one ``next()`` of the loop and return the depth to use from now on.

        ``buffered``: batches ready when it asked; ``waited``: seconds it then waited for
        one; ``step``: seconds it spent away since its previous call (``None`` for the
        first); ``room_waited`` / ``byte_waited``: whether the producer waited for room
        under the depth limit / under the byte cap since the previous call.
        """
        depth = self.depth
        self._counts[depth] += 1
        self._room_waited |= room_waited
        self._byte_waited |= byte_waited
        if step is not None:
            previous = self._step
            self._step = step if previous is None else previous + _STEP_WEIGHT * (step - previous)
        typical = self._step
        if typical is not None and waited > MIN_STALL_FRACTION * typical:
            if self._room_waited and not self._byte_waited and depth < self.max_depth:
                grow = max(1, math.ceil(waited / typical)) if typical > 0 else 1
                self.depth = min(self.max_depth, depth + grow)
                self._restart_window()
            self._room_waited = False
            self._byte_waited = False
        self._lowest = min(self._lowest, buffered)
        self._seen += 1
        if self._seen >= WINDOW:
            if self._lowest >= 2 and self.depth > self.floor:
                self.depth -= 1
            self._restart_window()
        return self.depth

    def _restart_window(self) -> None:
        self._seen = 0
        self._lowest = sys.maxsize

    def usage(self, peak_bytes: int) -> BufferUsage:
        """The smallest, median and largest depth over the calls so far, per call."""
        counts = self._counts
        used = [depth for depth, count in enumerate(counts) if count]
        if not used:
            return fixed_usage(self.depth, peak_bytes)
        half = (sum(counts) + 1) // 2
        running = 0
        median = used[-1]
        for depth in used:
            running += counts[depth]
            if running >= half:
                median = depth
                break
        return BufferUsage(used[0], median, used[-1], peak_bytes)
