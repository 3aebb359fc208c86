"""An example dataloaderx plugin: the ``spawned`` worker method.

Each worker is a process of its own, started with ``spawn`` (a fresh interpreter that
inherits nothing) by the standard library's ``ProcessPoolExecutor``. Installing this
distribution registers it through its ``dataloaderx.worker_methods`` entry point, so
``DataLoaderX(..., num_workers=2, worker_method="spawned")`` works without importing this
module first. The pool only carries tasks: the worker contract is the
:class:`~dataloaderx.workers.WorkerCore`'s, run in each process.
"""

from __future__ import annotations

import multiprocessing
import threading
import time
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from dataloaderx import WorkerPool
from dataloaderx.workers import Outcome, Result, WorkerCore, WorkerKind, WorkerSetup

__all__ = ["SpawnedWorkers"]

#: The worker's core, in each worker process.
_core: WorkerCore | None = None


def _begin(setup: WorkerSetup, worker: int) -> None:
    """A worker process's start (the executor's initializer)."""
    global _core
    _core = WorkerCore(
        lambda: setup,
        worker,
        kind=WorkerKind.PROCESS,
        method="spawned",
        where=f"in DataLoader worker {worker} (a spawned process)",
    )
    _core.start_epoch(setup.base_seed, fresh=True)


def _run(indices: Any) -> tuple[Outcome, Any]:
    assert _core is not None
    return _core.run(indices)


def _next_epoch(base_seed: int) -> None:
    assert _core is not None
    _core.start_epoch(base_seed, fresh=False)


class SpawnedWorkers(WorkerPool):
    """``num_workers`` spawned processes, one executor of one process each."""

    def _start(self, name: str) -> None:
        context = multiprocessing.get_context("spawn")
        setup = self._setup._replace(pin=None)  # pinning is the loop's (DataLoader's) job
        self._executors = [
            ProcessPoolExecutor(1, context, initializer=_begin, initargs=(setup, worker))
            for worker in range(setup.num_workers)
        ]
        self._lock = threading.Lock()
        self._epoch = 0
        self._futures: dict[Future[Any], tuple[int, int, int]] = {}

    def send(self, worker: int, task: int, indices: Any) -> None:
        with self._lock:
            future = self._executors[worker].submit(_run, indices)
            self._futures[future] = (self._epoch, task, worker)

    def new_epoch(self) -> int:
        with self._lock:
            self._epoch += 1
            self._futures.clear()  # an earlier epoch's results are dropped
            for executor in self._executors:  # after its tasks already sent, in order
                executor.submit(_next_epoch, self._setup.base_seed)
            return self._epoch

    def receive(self, timeout: float) -> Result | None:
        with self._lock:
            futures = list(self._futures)
        if not futures:
            time.sleep(timeout)
            return None
        done, _ = wait(futures, timeout=timeout, return_when=FIRST_COMPLETED)
        for future in done:
            with self._lock:
                sent = self._futures.pop(future, None)
            if sent is not None:
                epoch, task, worker = sent
                try:
                    outcome, payload = future.result()
                except BrokenProcessPool as exc:  # the process died: the loop raises it
                    outcome, payload = Outcome.FATAL, exc
                return Result(epoch, task, worker, outcome, payload)
        return None

    def close(self) -> None:
        for executor in self._executors:
            executor.shutdown(wait=True, cancel_futures=True)
