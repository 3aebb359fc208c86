"""Which worker thread makes a batch: its worker's thread, or whichever thread is free where
no batch can tell the difference (``docs/thread-workers.md``, *Which thread makes a batch*).

Each task belongs to a worker, as the schedule gave it (batch ``k`` to worker ``k mod n``
in order), and is numbered in that worker's order (its *place*, from 0). A thread runs a task as
its worker: ``get_worker_info()`` answers with that worker's info. Tasks are shared only
once each worker's first batch came back without anything in it asking for its worker's
info, on a map-style dataset without ``worker_init_fn``, and where those first batches did
not take turns on one core (:data:`TURNS`); a task that asks later, while shared, waits
until its worker's earlier tasks are done, so that each worker's generators draw in its
own order.
"""

from __future__ import annotations

import enum
import functools
import threading
import time
from typing import Any, Final

from dataloaderx.engine.stream import POLL_SECONDS
from dataloaderx.util.idle import idle_seconds, took_turns
from dataloaderx.workers.contract import Outcome, Result
from dataloaderx.workers.info import set_thread_info

__all__ = ["TURNS", "Assignment", "TaskAssignment"]

#: Where the workers' first tasks' CPU time, summed, over the time from the first one's start
#: to the last one's end (cores' worth) falls in this range, with cores idle meanwhile
#: (:func:`~dataloaderx.util.idle.took_turns`), the threads took turns on one core with
#: another free: their items hold the GIL, and each worker's tasks stay in its thread
#: (``docs/thread-workers.md``, *Which thread makes a batch*).
TURNS: Final = (0.25, 1.15)


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


class _FirstTasks:
    """What :attr:`Assignment.WATCH` watches: each worker's first task, whether its batch
    came back, and how long it took."""

    def __init__(self, num_workers: int) -> None:
        #: The loop thread's alone: the workers whose first batch is not back yet.
        self.unproven = set(range(num_workers))
        #: Per worker, its first task's start (thread CPU time, wall time, the cores' idle
        #: time), written by the worker's thread alone before its first result.
        self.started: list[tuple[float, float, float | None]] = [(0.0, 0.0, None)] * num_workers
        #: Each first task done: its (CPU seconds, start, end), guarded by the assignment's
        #: lock.
        self.times: list[tuple[float, float, float]] = []

    def start(self, worker: int) -> None:
        """In the thread of ``worker``: its first task starts."""
        self.started[worker] = (time.thread_time(), time.perf_counter(), idle_seconds())

    def timed(self, worker: int) -> tuple[float, float, float]:
        """In the thread of ``worker``: its first task's times, now that it is done."""
        cpu, start, _ = self.started[worker]
        return time.thread_time() - cpu, start, time.perf_counter()

    def took_turns(self) -> bool:
        """Whether the first tasks done took turns on one core with another free
        (:data:`TURNS`), over the time since the first one started."""
        times = self.times
        if not times:
            return False
        span = max(end for _, _, end in times) - min(start for _, start, _ in times)
        busy = sum(cpu for cpu, _, _ in times) / span if span > 0 else 0.0
        _, start, idle_then = min(self.started, key=lambda started: started[1])
        idle_now, now = idle_seconds(), time.perf_counter()
        idle = None if idle_then is None or idle_now is None else idle_now - idle_then
        return took_turns(busy, idle, now - start, TURNS)


class TaskAssignment:
    """Where one pool's tasks run, and each worker's order; thread-safe.

    The loop's thread reports each result while :attr:`Assignment.WATCH` lasts
    (:meth:`made`). A worker thread calls :meth:`begin` (once its tasks come from the
    shared queue, :meth:`share` once, then :meth:`begin_shared`) before each task and
    :meth:`end` after it (or instead, for a task it skips), until :meth:`begin` answers
    :attr:`Assignment.OWN`: from then on each thread runs only its own worker's tasks, in
    order, and nothing is asked per task.
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
        self._first = _FirstTasks(num_workers)
        #: Per thread, the task it runs (``(worker, place)``), written by that thread alone,
        #: and what a read of a worker's info in it calls.
        self._running = [(0, 0)] * num_workers
        self._hooks = [functools.partial(self._read, thread) for thread in range(num_workers)]

    def made(self, result: Result) -> Assignment:
        """In the loop's thread, while :attr:`Assignment.WATCH` lasts: account for
        ``result``; the assignment from now on."""
        with self._lock:
            if self._assignment is Assignment.WATCH and result.outcome is Outcome.BATCH:
                first = self._first
                first.unproven.discard(result.worker)
                if not first.unproven:
                    self._assignment = Assignment.OWN if first.took_turns() else Assignment.SHARED
            return self._assignment

    def publish(self, worker: int, info: Any) -> None:
        """Worker ``worker`` started with ``info``, which its tasks see wherever they run."""
        with self._lock:
            self._infos[worker] = info

    def begin(self, thread: int, worker: int, place: int) -> Assignment:
        """Thread ``thread`` runs task ``place`` of ``worker`` next, as that worker; the
        assignment now (with :attr:`Assignment.OWN`, :meth:`end` is not to be called, and
        the thread's tasks see their worker's info without asking this assignment)."""
        with self._lock:
            assignment = self._assignment
            info = self._infos[worker]
        self._running[thread] = (worker, place)
        set_thread_info(info, None if assignment is Assignment.OWN else self._hooks[thread])
        if place == 0:  # a worker's first task, in its own thread
            self._first.start(worker)
        return assignment

    def share(self, thread: int) -> None:
        """Thread ``thread`` takes its tasks from the shared queue from now on: each read of
        a worker's info in it asks this assignment for the info of the task it runs."""
        with self._lock:
            info = self._infos[thread]
        set_thread_info(info, self._hooks[thread])

    def begin_shared(self, thread: int, worker: int, place: int) -> None:
        """:meth:`begin` for a thread that takes tasks from the shared queue, where the
        assignment is :attr:`Assignment.SHARED` for good (:meth:`share` was called)."""
        self._running[thread] = (worker, place)

    def end(self, worker: int, place: int) -> None:
        """Task ``place`` of ``worker`` is done (or skipped)."""
        times = self._first.timed(worker) if place == 0 else None
        with self._lock:
            if times is not None:
                self._first.times.append(times)
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

    def _read(self, thread: int) -> Any:
        """The task of ``thread`` asks for its worker's info: keep each worker's tasks in
        its own thread from now on, or, where they are shared already, wait for the worker's
        earlier ones; the info."""
        worker, place = self._running[thread]
        with self._lock:
            if self._assignment is Assignment.WATCH:
                self._assignment = Assignment.OWN
            elif self._assignment is Assignment.SHARED:
                self._waiting += 1
                try:
                    while self._done_before[worker] < place:
                        if self._stop.is_set():
                            raise RuntimeError("the loader's worker threads are stopping")
                        self._turn.wait(POLL_SECONDS)
                finally:
                    self._waiting -= 1
            return self._infos[worker]
