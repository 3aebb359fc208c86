"""Which worker thread makes a batch: its worker's thread, or whichever thread is free where
no batch can tell the difference (``docs/thread-workers.md``, *Which thread makes a batch*).

Each task belongs to a worker, as the schedule gave it (batch ``k`` to worker ``k mod n``
in order), and is numbered in that worker's order (its *place*, from 0). A thread runs a task as
its worker: ``get_worker_info()`` answers with that worker's info. Tasks are shared only
once each worker's first batch came back without anything in it asking for its worker's
info, on a map-style dataset without ``worker_init_fn``; a task that asks later, while
shared, waits until its worker's earlier tasks are done, so that each worker's generators
draw in its own order.
"""

from __future__ import annotations

import enum
import functools
import threading
from typing import Any

from dataloaderx.engine.stream import POLL_SECONDS
from dataloaderx.workers.contract import Outcome, Result
from dataloaderx.workers.info import set_thread_info

__all__ = ["Assignment", "TaskAssignment"]


class Assignment(enum.Enum):
    """Where a worker's tasks run."""

    #: In the worker's own thread, for good: an iterable dataset, a ``worker_init_fn``, or
    #: a task that asked for its worker's info.
    OWN = "own"
    #: In the worker's own thread, while the first batch of each worker shows whether the
    #: tasks ask for their worker's info.
    WATCH = "watch"
    #: In whichever thread is free.
    SHARED = "shared"


class TaskAssignment:
    """Where one pool's tasks run, and each worker's order; thread-safe.

    The loop's thread reports each result while :attr:`Assignment.WATCH` lasts
    (:meth:`made`). A worker thread calls :meth:`begin` (:meth:`begin_shared` once its
    tasks come from the shared queue) before each task and :meth:`end` after it (or
    instead, for a task it skips), until :meth:`begin` answers :attr:`Assignment.OWN`:
    from then on each thread runs only its own worker's tasks, in order, and nothing is
    asked per task.
    """

    def __init__(self, num_workers: int, *, may_share: bool, stop: threading.Event) -> None:
        self._lock = threading.Lock()
        self._turn = threading.Condition(self._lock)
        self._stop = stop
        #: Guarded by ``_lock`` from here on.
        self._assignment = Assignment.WATCH if may_share else Assignment.OWN
        self._infos: list[Any] = [None] * num_workers
        #: Per worker: its first place not yet done, and the places done after it.
        self._done_before = [0] * num_workers
        self._done_after: list[set[int]] = [set() for _ in range(num_workers)]
        self._waiting = 0
        #: The loop thread's alone: the workers whose first batch is not back yet.
        self._unproven = set(range(num_workers))
        #: Per thread, the task it runs (``(worker, place)``), that thread's alone, and
        #: what a read of its worker's info calls.
        self._running = [(0, 0)] * num_workers
        self._hooks = [functools.partial(self._read, thread) for thread in range(num_workers)]

    def made(self, result: Result) -> Assignment:
        """In the loop's thread, while :attr:`Assignment.WATCH` lasts: account for
        ``result``; the assignment from now on."""
        with self._lock:
            if self._assignment is Assignment.WATCH and result.outcome is Outcome.BATCH:
                self._unproven.discard(result.worker)
                if not self._unproven:
                    self._assignment = Assignment.SHARED
            return self._assignment

    def publish(self, worker: int, info: Any) -> None:
        """Worker ``worker`` started with ``info``, which its tasks see wherever they run."""
        with self._lock:
            self._infos[worker] = info

    def begin(self, thread: int, worker: int, place: int) -> Assignment:
        """Thread ``thread`` runs task ``place`` of ``worker`` next, as that worker; the
        assignment now (with :attr:`Assignment.OWN`, :meth:`end` is not to be called)."""
        with self._lock:
            assignment = self._assignment
        if assignment is not Assignment.OWN:
            self.begin_shared(thread, worker, place)
        return assignment

    def begin_shared(self, thread: int, worker: int, place: int) -> None:
        """:meth:`begin` where the assignment is known not to be :attr:`Assignment.OWN`: for
        a thread that takes tasks from the shared queue (:attr:`Assignment.SHARED` for
        good), and for :meth:`begin` itself. The info is read without the lock: a thread
        that watches runs its own worker's tasks, whose info it published itself; and every
        worker published its info before its first result, which came before the switch to
        the shared queue (the queues order it)."""
        self._running[thread] = (worker, place)
        set_thread_info(self._infos[worker], self._hooks[thread])

    def end(self, worker: int, place: int) -> None:
        """Task ``place`` of ``worker`` is done (or skipped)."""
        with self._lock:
            if place != self._done_before[worker]:
                self._done_after[worker].add(place)
                return
            after = self._done_after[worker]
            place += 1
            while place in after:
                after.remove(place)
                place += 1
            self._done_before[worker] = place
            if self._waiting:
                self._turn.notify_all()

    def _read(self, thread: int) -> None:
        """The task of ``thread`` asked for its worker's info: keep each worker's tasks in
        its own thread from now on, or, where they are shared already, wait for the worker's
        earlier ones."""
        worker, place = self._running[thread]
        with self._lock:
            if self._assignment is Assignment.WATCH:
                self._assignment = Assignment.OWN
                return
            self._waiting += 1
            try:
                while self._done_before[worker] < place:
                    if self._stop.is_set():
                        raise RuntimeError("the loader's worker threads are stopping")
                    self._turn.wait(POLL_SECONDS)
            finally:
                self._waiting -= 1
