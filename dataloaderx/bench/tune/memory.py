"""Peak memory during a run: this process (worker threads included, as they share it) and
its child processes (worker processes), less a Ray node this process started.

A local Ray started here (``ray.init``, or a loader with ``worker_method="ray"``) runs its
GCS, its raylet and the workers under them as this process's children; they are Ray's
memory, not the loader's, and reading them all took about 11 ms of CPU per sample (more
with actors). Children run from Ray's package are left out, with everything under them: a
Ray row's figure is the loop's process.

A sample also slows the run it measures: it walks each process's page tables holding that
process's memory-map lock, and the loader's threads wait on the lock for their own
allocations. Hence the interval: worker threads on torch ops (2 cores) made 11% fewer
batches/s with samples 20 ms apart, 3% fewer 50 ms apart, about 1% 100 ms apart."""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path
from typing import Any, Final

from dataloaderx.util.wrapping import ClosesOnExit

__all__ = ["MEMORY_HINT", "PeakMemory"]

#: Seconds between samples, by default.
INTERVAL: Final = 0.1
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


def _child_pids(pid: int) -> list[int] | None:
    """The direct children of ``pid`` from ``/proc/PID/task/*/children``, or ``None`` where
    the platform has no such files. (``psutil``'s ``children()`` reads every process's
    ``stat`` file: milliseconds on a busy host, too much between samples that close.)"""
    tasks = Path(f"/proc/{pid}/task")
    if not tasks.is_dir():
        return None
    found: list[int] = []
    for path in tasks.glob("*/children"):
        try:
            found.extend(int(word) for word in path.read_text().split())
        except OSError:  # a thread or the process that ended meanwhile
            continue
    return found


def _ray_directory() -> str | None:
    """The folder of the Ray package this process imported, if any."""
    ray = sys.modules.get("ray")
    file = None if ray is None else ray.__file__
    return None if file is None else os.path.dirname(file) + os.sep


class PeakMemory(ClosesOnExit):
    """Sample the memory of this process (all its threads) and its descendants every
    ``interval`` seconds on a daemon thread until ``close()``; :attr:`peak_bytes` is the
    largest sum seen (the first sample is taken at construction), or ``None`` without
    ``psutil``."""

    def __init__(self, interval: float = INTERVAL) -> None:
        self._interval = interval
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
        #: The processes seen so far, by pid: sampling thread only.
        self._known: dict[int, Any] = {self._process.pid: self._process}
        #: Whether each child seen runs from Ray's package, by pid: sampling thread only.
        self._ray_children: dict[int, bool] = {}
        self._record()
        self._thread = threading.Thread(
            target=self._sample, name="dataloaderx-bench-memory", daemon=True
        )
        self._thread.start()

    def _processes(self) -> list[Any]:
        """This process and its descendants."""
        psutil = self._psutil
        ray = _ray_directory()
        children = _child_pids(self._process.pid)
        if children is None:  # psutil lists them (slowly)
            roots = [
                child for child in self._process.children() if not self._runs_from(child.pid, ray)
            ]
            below = [process for root in roots for process in root.children(recursive=True)]
            return [self._process, *roots, *below]
        found: list[Any] = [self._process]
        pending = [pid for pid in children if not self._runs_from(pid, ray)]
        while pending:
            pid = pending.pop()
            process = self._known.get(pid)
            if process is None:
                try:
                    process = self._known[pid] = psutil.Process(pid)
                except psutil.Error:
                    continue
            found.append(process)
            pending.extend(_child_pids(pid) or ())
        return found

    def _runs_from(self, pid: int, directory: str | None) -> bool:
        """Whether the child ``pid`` runs a program from ``directory`` (``None``: none
        does): its executable or script, among the first words of its command line (asked
        once)."""
        if directory is None:
            return False
        known = self._ray_children.get(pid)
        if known is None:
            try:
                command = self._psutil.Process(pid).cmdline()
            except self._psutil.Error:
                return False
            known = self._ray_children[pid] = any(
                part.startswith(directory) for part in command[:3]
            )
        return known

    def _record(self) -> None:
        psutil = self._psutil
        total = 0
        try:
            processes = self._processes()
        except psutil.Error:
            return
        for process in processes:
            try:
                total += _process_bytes(process)
            except psutil.Error:  # a worker that exited between the listing and the read
                self._known.pop(process.pid, None)
        with self._lock:
            self._peak = total if self._peak is None else max(self._peak, total)

    def _sample(self) -> None:
        while not self._stop.wait(self._interval):
            self._record()

    @property
    def peak_bytes(self) -> int | None:
        """The largest total seen so far."""
        with self._lock:
            return self._peak

    def close(self) -> None:
        """Stop the sampling thread, after one last sample."""
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join(JOIN_TIMEOUT)
        if not self._thread.is_alive():  # the known processes are the sampling thread's
            self._record()
        self._thread = None
