"""Elastic worker threads (``worker_method="thread"``, ``num_workers="auto"``): as many threads
as the loader's :class:`~dataloaderx.workers.elastic.scaling.Scaling` decides.

A map-style dataset's tasks wait in one queue that every thread takes from, so a thread
can join or leave between any two tasks: a thread told to leave finishes the task it runs,
takes no other, and ends. Each batch's ``get_worker_info()`` answers with the id of the
thread that makes it, and with the batch's own seed and generators
(:func:`~dataloaderx.workers.elastic.seeds.batch_seed`), so that the batches are the same
whatever the count. An iterable dataset is sharded by worker id, so its workers change only
between epochs: each worker thread takes its own worker's tasks, and a new count starts new
threads (a fresh start for each, as a worker process's).
"""

from __future__ import annotations

import functools
import queue
import threading
from typing import Any, Final

from torch.utils.data.dataloader import _DatasetKind

from dataloaderx.engine.stream import POLL_SECONDS
from dataloaderx.util.cores import usable_cores
from dataloaderx.workers.contract import Outcome, Result, WorkerPool
from dataloaderx.workers.elastic.cpu_time import CpuTime
from dataloaderx.workers.elastic.seeds import batch_seed
from dataloaderx.workers.info import set_thread_info, worker_info
from dataloaderx.workers.pool import join_threads, thread_core, where

__all__ = ["THREADS_PER_CORE", "ElasticThreads"]

#: The most threads per core where ``max_workers`` is not given: items that wait on storage
#: gain from threads well past the cores.
THREADS_PER_CORE: Final = 4

#: ``(epoch, task, worker, seed key, indices)``: task number ``task`` of ``epoch``, the batch
#: of ``indices``, scheduled for ``worker``; the seed key is ``(loader epoch, batch number)``.
_Task = tuple[int, int, int, tuple[int, int], Any]
#: Sent to a thread: end.
_STOP: Final = "stop"


class _Running:
    """What one thread's batch reads with ``get_worker_info()``; that thread's alone."""

    def __init__(self, pool: ElasticThreads, thread: int) -> None:
        self._pool = pool
        self._thread = thread
        self.key: tuple[int, int] = (0, 0)
        self._made: tuple[tuple[int, int], Any] | None = None

    def info(self) -> Any:
        """The info of the batch this thread makes now (made on the first read)."""
        made = self._made
        if made is None or made[0] != self.key:
            setup = self._pool.setup
            epoch, batch = self.key
            seed = batch_seed(setup.base_seed, epoch, batch)
            info = worker_info(
                setup.dataset,
                self._thread,
                setup.num_workers,
                setup.base_seed,
                self._pool.name,
                batch_seed=seed,
            )
            made = self._made = (self.key, info)
        return made[1]


class ElasticThreads(WorkerPool):
    """Between 1 and ``setup.num_workers`` worker threads named ``name-<id>``; thread-safe.

    :meth:`resize` changes the count: at once for a map-style dataset, at the next epoch
    for an iterable one.
    """

    @classmethod
    def most_workers(cls, options: Any) -> int:
        return THREADS_PER_CORE * usable_cores()

    @property
    def setup(self) -> Any:
        """The loader's arguments every thread makes its fetcher from."""
        return self._setup

    def _start(self, name: str) -> None:
        self._name = name
        self._map = self._setup.dataset_kind == _DatasetKind.Map
        self._results: queue.SimpleQueue[Result] = queue.SimpleQueue()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        #: Guarded by ``_lock``: the epoch whose tasks run, the count asked for, and the
        #: threads by id (those told to leave and not yet gone are not among them).
        self._epoch = 0
        self._target = self._workers
        self._threads: dict[int, threading.Thread] = {}
        #: A map-style dataset's one queue; an iterable one's queue per worker, for the
        #: epoch's count of workers.
        self._shared: queue.SimpleQueue[_Task | str] = queue.SimpleQueue()
        self._inboxes: list[queue.SimpleQueue[_Task | str]] = []
        #: The iterator's: the loader's epoch and the batches before the first task.
        self._origin = (0, 0)
        #: The batches' CPU time; the first batches' share: two per thread the pool starts with.
        self._cpu = CpuTime(2 * self._workers)
        with self._lock:
            self._start_threads(self._workers)

    @property
    def epoch(self) -> int:
        """The epoch whose tasks the workers run now."""
        with self._lock:
            return self._epoch

    def scheduled_workers(self) -> int:
        with self._lock:
            return self._setup.num_workers if self._map else len(self._inboxes)

    def resizing(self) -> bool:
        with self._lock:
            return not self._map and self._target != len(self._inboxes)

    def set_origin(self, epoch: int, first_batch: int) -> None:
        self._origin = (epoch, first_batch)

    def cpu_share(self) -> float | None:
        return self._cpu.share

    def cpu_seconds(self) -> float | None:
        return self._cpu.seconds

    def resize(self, workers: int) -> int:
        with self._lock:
            self._target = workers
            if not self._map:
                return len(self._inboxes)
            self._start_threads(workers)
            return workers

    def new_epoch(self) -> int:
        """Start a new epoch, with the count asked for; return the epoch's number."""
        with self._lock:
            self._epoch += 1
            if not self._map and self._target != len(self._inboxes):
                ending = list(self._threads.values())
                for inbox in self._inboxes:
                    inbox.put(_STOP)
                self._threads, self._inboxes = {}, []
                self._start_threads(self._target)
            else:
                ending = []
            epoch = self._epoch
        join_threads(ending)
        return epoch

    def send(self, worker: int, task: int, indices: Any) -> None:
        epoch, first = self._origin
        with self._lock:
            item = (self._epoch, task, worker, (epoch, first + task), indices)
            inbox = self._shared if self._map else self._inboxes[worker]
        inbox.put(item)

    def receive(self, timeout: float) -> Result | None:
        try:
            return self._results.get(timeout=timeout)
        except queue.Empty:
            return None

    def ended(self) -> list[int]:
        """The threads that ended without being told to."""
        with self._lock:
            threads = dict(self._threads)
        return [thread for thread, handle in threads.items() if not handle.is_alive()]

    def describe(self, worker: int) -> str:
        return f"worker thread {worker}"

    @property
    def handles(self) -> list[Any]:
        with self._lock:
            return list(self._threads.values())

    def close(self) -> None:
        """Stop every thread and wait briefly for them; safe to call twice, from any thread.
        A thread in the middle of a task ends as soon as the task does."""
        self._stop.set()
        with self._lock:
            threads = list(self._threads.values())
            for inbox in (self._shared, *self._inboxes):
                for _ in threads:
                    inbox.put(_STOP)
        join_threads(threads)

    def _start_threads(self, workers: int) -> None:
        """Under ``_lock``: start threads until ``workers`` run (the lowest free ids)."""
        while len(self._threads) < workers:
            thread = min(set(range(self._setup.num_workers)) - set(self._threads))
            inbox = self._shared
            if not self._map:
                inbox = queue.SimpleQueue()
                self._inboxes.append(inbox)
            handle = threading.Thread(
                target=self._serve,
                args=(thread, inbox, workers),
                name=f"{self._name}-{thread}",
                daemon=True,
            )
            self._threads[thread] = handle
            handle.start()

    def _leaves(self, thread: int) -> bool:
        """Whether ``thread`` is to leave the pool now (it then has)."""
        with self._lock:
            if self._stop.is_set() or self._threads.get(thread) is not threading.current_thread():
                return True
            if len(self._threads) <= self._target or not self._map:
                return False
            del self._threads[thread]
            return True

    def _serve(self, thread: int, inbox: queue.SimpleQueue[_Task | str], workers: int) -> None:
        setup = self._setup if self._map else self._setup._replace(num_workers=workers)
        # A map-style dataset's workers are the threads that may run (its ids); an
        # iterable one's, the epoch's.
        core = thread_core(setup, thread, self.name)
        core.start_epoch(setup.base_seed, fresh=True)
        running = _Running(self, thread)
        if self._map:  # each batch's own info, whichever thread makes it
            set_thread_info(core.info, running.info)
        started = self.epoch  # the epoch of the core's fetcher
        while not self._leaves(thread):
            try:
                task = inbox.get(timeout=POLL_SECONDS)
            except queue.Empty:
                continue
            if isinstance(task, str):  # _STOP
                return
            epoch, number, worker, running.key, indices = task
            if epoch != self.epoch:
                continue  # an earlier epoch's, not started
            if epoch != started:  # a new fetcher, as a worker process makes
                core.start_epoch(setup.base_seed, fresh=False)
                started = epoch
            outcome, payload = self._cpu.timed(functools.partial(core.run, indices, where(thread)))
            self._results.put(Result(epoch, number, worker, outcome, payload))
            del payload
            if outcome is Outcome.FATAL:
                return
