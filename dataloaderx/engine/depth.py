"""The ``depth="auto"`` controller, pure logic fed once per ``next()`` with what the loop
saw, and the meter that feeds it; the rules are in ``docs/design.md`` (*Bounded memory*)."""

from __future__ import annotations

import math
import sys
from itertools import accumulate
from time import perf_counter
from typing import Final, NamedTuple

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
        """Account for one ``next()``; return the depth to use from now on. ``buffered``: batches
        ready when the loop asked; ``waited``: seconds it then waited; ``step``: seconds away since
        its previous call (``None`` for the first); ``room_waited`` / ``byte_waited``: whether the
        producer waited for room under the depth limit / the byte cap since then."""
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
        median = next(depth for depth, total in enumerate(accumulate(counts)) if total >= half)
        return BufferUsage(used[0], median, used[-1], peak_bytes)


class StallMeter:
    """Times the loop's calls on a buffer sized by ``controller``, and feeds it; used by the
    consumer only, under the buffer's lock. The producer counts its waits for room under the
    depth limit and under the byte cap; the meter passes on whether each count changed."""

    __slots__ = ("_last", "_seen", "controller")

    def __init__(self, controller: DepthController) -> None:
        self.controller = controller
        self._last: float | None = None
        self._seen = (0, 0)

    def observe(self, start: float, buffered: int, room_waits: int, byte_waits: int) -> int:
        """Feed a call begun at ``start`` that found ``buffered`` ready; return the new depth."""
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
