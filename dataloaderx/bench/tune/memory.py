"""Peak memory during a run: this process (worker threads included, as they share it) and
its child processes (worker processes)."""

from __future__ import annotations

import threading
from typing import Any, Final

from dataloaderx.util.wrapping import ClosesOnExit

__all__ = ["MEMORY_HINT", "PeakMemory"]

#: Seconds between samples.
INTERVAL: Final = 0.05
#: Seconds ``close()`` waits for the sampling thread.
JOIN_TIMEOUT: Final = 5.0
#: Shown where memory cannot be measured.
MEMORY_HINT: Final = "peak memory needs psutil: pip install 'dataloaderx[bench]'"


def _process_bytes(process: Any) -> int:
    """Proportional set size where the platform reports it (a page shared by the parent and
    its forked workers counts once in the sum), else resident set size."""
    try:
        return int(process.memory_full_info().pss)
    except AttributeError:
        return int(process.memory_info().rss)


class PeakMemory(ClosesOnExit):
    """Sample the memory of this process (all its threads) and its descendants every
    :data:`INTERVAL` seconds on a daemon thread until ``close()``; :attr:`peak_bytes` is
    the largest sum seen, or ``None`` without ``psutil``."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._peak: int | None = None
        self._thread: threading.Thread | None = None
        try:
            import psutil
        except ImportError:
            return
        self._psutil: Any = psutil
        self._process = psutil.Process()
        self._record()
        self._thread = threading.Thread(
            target=self._sample, name="dataloaderx-bench-memory", daemon=True
        )
        self._thread.start()

    def _record(self) -> None:
        psutil = self._psutil
        total = 0
        try:
            processes = [self._process, *self._process.children(recursive=True)]
        except psutil.Error:
            return
        for process in processes:
            try:
                total += _process_bytes(process)
            except psutil.Error:  # a worker that exited between the listing and the read
                continue
        with self._lock:
            self._peak = total if self._peak is None else max(self._peak, total)

    def _sample(self) -> None:
        while not self._stop.wait(INTERVAL):
            self._record()

    @property
    def peak_bytes(self) -> int | None:
        """The largest total seen so far."""
        with self._lock:
            return self._peak

    def close(self) -> None:
        """Stop the sampling thread."""
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join(JOIN_TIMEOUT)
        self._thread = None
