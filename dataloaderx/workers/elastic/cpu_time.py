"""``CpuTime``: the CPU time worker threads spend on their batches in their own threads: the
first batches' share of their time, from which an elastic pool of threads first sizes itself
(:meth:`~dataloaderx.workers.elastic.policy.ScalePolicy.start`), and every batch's, from
which each window tells whether the threads took turns on one core."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TypeVar

__all__ = ["CpuTime"]

T = TypeVar("T")


class CpuTime:
    """The CPU time of every batch :meth:`timed`, and the share of their time the first
    ``batches`` spent on the CPU; thread-safe."""

    def __init__(self, batches: int) -> None:
        self._batches = batches
        self._lock = threading.Lock()
        #: Guarded by ``_lock``: every batch's CPU seconds; the first batches timed, and
        #: their CPU and wall seconds.
        self._seconds = 0.0
        self._timed = 0
        self._cpu = 0.0
        self._wall = 0.0

    def timed(self, run: Callable[[], T]) -> T:
        """``run()`` in this thread, its CPU time counted (and its wall time, while fewer
        than ``batches`` batches were)."""
        with self._lock:
            first = self._timed < self._batches
        cpu, wall = time.thread_time(), time.perf_counter() if first else 0.0
        try:
            return run()
        finally:
            cpu = time.thread_time() - cpu
            with self._lock:
                self._seconds += cpu
                if first:
                    self._timed += 1
                    self._cpu += cpu
                    self._wall += time.perf_counter() - wall

    @property
    def seconds(self) -> float:
        """The CPU seconds of every batch timed so far."""
        with self._lock:
            return self._seconds

    @property
    def share(self) -> float | None:
        """The first batches' share, once ``batches`` batches were timed; ``None`` before."""
        with self._lock:
            if self._timed < self._batches or self._wall <= 0:
                return None
            return min(1.0, self._cpu / self._wall)
