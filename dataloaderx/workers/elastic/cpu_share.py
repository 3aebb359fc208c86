"""``CpuShare``: the share of their time worker threads' first batches spent on the CPU in
their own thread, from which an elastic pool of threads first sizes itself
(:meth:`~dataloaderx.workers.elastic.policy.ScalePolicy.start`)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TypeVar

__all__ = ["CpuShare"]

T = TypeVar("T")


class CpuShare:
    """CPU time over wall time of the first ``batches`` batches :meth:`timed`; thread-safe."""

    def __init__(self, batches: int) -> None:
        self._batches = batches
        self._lock = threading.Lock()
        #: Guarded by ``_lock``: the batches timed, and their CPU and wall seconds.
        self._timed = 0
        self._cpu = 0.0
        self._wall = 0.0

    def timed(self, run: Callable[[], T]) -> T:
        """``run()`` in this thread, timed while fewer than ``batches`` batches were."""
        with self._lock:
            timing = self._timed < self._batches
        if not timing:
            return run()
        cpu, wall = time.thread_time(), time.perf_counter()
        result = run()
        cpu, wall = time.thread_time() - cpu, time.perf_counter() - wall
        with self._lock:
            self._timed += 1
            self._cpu += cpu
            self._wall += wall
        return result

    @property
    def share(self) -> float | None:
        """The share, once ``batches`` batches were timed; ``None`` before."""
        with self._lock:
            if self._timed < self._batches or self._wall <= 0:
                return None
            return min(1.0, self._cpu / self._wall)
