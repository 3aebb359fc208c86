"""Worker threads: each runs its worker's tasks, in order, as a worker process does, or,
where no batch can tell, the next task of any worker (:mod:`dataloaderx.workers.assignment`).

Each thread runs a :class:`~dataloaderx.workers.core.WorkerCore` (the worker contract),
pinning its batches where the loader pins. Threads share the process, so unlike a process
a thread reseeds no global generator; as a process, it runs torch on one intra-op thread
where that setting can be the thread's own (:mod:`dataloaderx.workers.intra_op`).
"""

from __future__ import annotations

import functools
import queue
import threading
import time
from typing import Any

import torch
from torch.utils.data._utils.pin_memory import pin_memory
from torch.utils.data.dataloader import _DatasetKind

from dataloaderx.engine.stream import JOIN_TIMEOUT_SECONDS, POLL_SECONDS
from dataloaderx.workers.assignment import Assignment, TaskAssignment
from dataloaderx.workers.contract import Outcome, Result, WorkerPool, WorkerSetup
from dataloaderx.workers.core import WorkerCore, WorkerKind
from dataloaderx.workers.intra_op import one_intra_op_thread

__all__ = ["WorkerThreads", "join_threads", "thread_core", "where"]


#: ``(epoch, task, worker, place, indices)``: task number ``task`` of ``epoch``, the batch
#: of ``indices``, which belongs to ``worker`` and has ``place`` in that worker's order.
_Task = tuple[int, int, int, int, Any]


#: Sent to a worker: take the next tasks from the shared queue.
_SHARE = "share"
#: Sent to a worker: end.
_STOP = "stop"


def where(worker: int) -> str:
    """How an error names worker thread ``worker``."""
    return f"in DataLoader worker thread {worker}"


def join_threads(threads: list[threading.Thread]) -> None:
    """Wait for ``threads`` (the calling one left out), up to ``JOIN_TIMEOUT_SECONDS`` in
    all: one still in a task ends as soon as the task does."""
    deadline = time.monotonic() + JOIN_TIMEOUT_SECONDS
    for thread in threads:
        if thread is threading.current_thread():
            continue
        while thread.is_alive() and time.monotonic() < deadline:
            thread.join(POLL_SECONDS)


def thread_core(setup: WorkerSetup, worker: int, method: str) -> WorkerCore:
    """In a new worker thread: its device and intra-op threads set, the core of ``worker``."""
    if setup.pin is not None:  # the current device is per thread, and starts at 0
        torch.accelerator.set_device_index(setup.pin[1])
    one_thread = one_intra_op_thread()
    if one_thread is not None:  # before worker_init_fn, which may set another count
        one_thread()
    return WorkerCore(
        lambda: setup,
        worker,
        kind=WorkerKind.THREAD,
        method=method,
        where=where(worker),
        finish=None if setup.pin is None else functools.partial(pin_memory, device=setup.pin[0]),
    )


class WorkerThreads(WorkerPool):
    """``setup.num_workers`` daemon threads named ``name-<id>``; thread-safe.

    :meth:`send` queues a task for one worker; :meth:`receive` returns the next
    :class:`Result` of any worker. Tasks of an earlier epoch that no thread has started
    when :meth:`new_epoch` is called are skipped.
    """

    def _start(self, name: str) -> None:
        setup = self._setup
        self._inboxes: list[queue.SimpleQueue[_Task | str]] = [
            queue.SimpleQueue() for _ in range(setup.num_workers)
        ]
        self._shared: queue.SimpleQueue[_Task | str] = queue.SimpleQueue()
        self._results: queue.SimpleQueue[Result] = queue.SimpleQueue()
        self._stop = threading.Event()
        self._assignment = TaskAssignment(
            setup.num_workers,
            may_share=setup.dataset_kind == _DatasetKind.Map
            and setup.init_fn is None
            and setup.num_workers > 1,
            stop=self._stop,
        )
        #: The loop thread's: whether the assignment may still change, whether tasks go to
        #: the shared queue, and each worker's next place.
        self._watching = True
        self._sharing = False
        self._places = [0] * setup.num_workers
        #: How an error names each worker, whichever thread ran its task.
        self._where = [where(n) for n in range(setup.num_workers)]
        self._lock = threading.Lock()
        self._epoch = 0  #: guarded by ``_lock``
        self.threads = [
            threading.Thread(target=self._serve, args=(worker,), name=f"{name}-{worker}")
            for worker in range(setup.num_workers)
        ]
        for thread in self.threads:
            thread.daemon = True
            thread.start()

    @property
    def epoch(self) -> int:
        """The epoch whose tasks the workers run now."""
        with self._lock:
            return self._epoch

    def send(self, worker: int, task: int, indices: Any) -> None:
        """Queue task number ``task`` (the batch of ``indices``) for ``worker``."""
        inbox = self._shared if self._sharing else self._inboxes[worker]
        place = self._places[worker]
        self._places[worker] = place + 1
        inbox.put((self.epoch, task, worker, place, indices))

    def new_epoch(self) -> int:
        """Start a new epoch (each worker makes a new fetcher before its first task of it);
        return the epoch's number."""
        with self._lock:
            self._epoch += 1
            return self._epoch

    def describe(self, worker: int) -> str:
        return f"worker thread {worker}"

    @property
    def handles(self) -> list[Any]:
        return list(self.threads)

    def receive(self, timeout: float) -> Result | None:
        """The next result, waiting up to ``timeout`` seconds (``None``: none came)."""
        try:
            result = self._results.get(timeout=timeout)
        except queue.Empty:
            return None
        if self._watching:
            assigned = self._assignment.made(result)
            self._watching = assigned is Assignment.WATCH
            if assigned is Assignment.SHARED:
                self._sharing = True
                for inbox in self._inboxes:
                    inbox.put(_SHARE)
        return result

    def ended(self) -> list[int]:
        """The workers whose thread has ended."""
        return [worker for worker, thread in enumerate(self.threads) if not thread.is_alive()]

    def close(self) -> None:
        """Stop every worker and wait briefly for them; safe to call twice and from any thread.

        A worker in the middle of a task finishes it first (a thread cannot be interrupted):
        one that takes longer than the wait ends as soon as its task does.
        """
        self._stop.set()
        for inbox in self._inboxes:
            inbox.put(_STOP)
            self._shared.put(_STOP)
        join_threads(self.threads)

    def _serve(self, worker: int) -> None:
        setup = self._setup
        core = thread_core(setup, worker, self.name)
        core.start_epoch(setup.base_seed, fresh=True)
        assignment = self._assignment
        assignment.publish(worker, core.info)
        asks = True  # whether each task is to be told to the assignment
        started = 0  # the epoch of the core's fetcher
        inbox, shared = self._inboxes[worker], self._shared
        while not self._stop.is_set():
            try:
                task = inbox.get(timeout=POLL_SECONDS)
            except queue.Empty:
                continue
            if isinstance(task, str):
                if task == _STOP:
                    return
                inbox = shared  # _SHARE
                assignment.share(worker)
                continue
            epoch, number, owner, place, indices = task
            if inbox is shared:
                assignment.begin_shared(worker, owner, place)
            elif asks:
                asks = assignment.begin(worker, owner, place) is not Assignment.OWN
            try:
                if epoch != self.epoch:
                    continue  # an earlier epoch's, not started
                if epoch != started:  # a new fetcher, as a worker process makes
                    core.start_epoch(setup.base_seed, fresh=False)
                    started = epoch
                outcome, payload = core.run(indices, self._where[owner])
            finally:
                if asks:
                    assignment.end(owner, place)
            self._results.put(Result(epoch, number, owner, outcome, payload))
            del payload
            if outcome is Outcome.FATAL:
                return
