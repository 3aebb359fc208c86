"""One epoch's tasks among worker threads: which worker gets the next task, and which result
is handed out next (pure logic; the loop's thread only).

Tasks go to the workers in turn, skipping a worker whose iterable dataset ran out, at most
``prefetch_factor`` per worker at once; with ``in_order`` results are handed out in the
order their tasks were sent, so worker ``k`` makes batches ``k``, ``k + num_workers``, ...
of a map-style epoch, as worker processes do. Without it, each result is handed out as it
arrives, and a worker gets a task only while it holds less than its share of them.
"""

from __future__ import annotations

import itertools

from dataloaderx.workers.contract import Outcome, Result

__all__ = ["Schedule"]


class Schedule:
    """The tasks of one epoch that are sent and not yet handed out."""

    def __init__(self, num_workers: int, prefetch_factor: int, in_order: bool) -> None:
        #: The most tasks out at once (the iterator of an elastic pool sets it for the count).
        self.limit = prefetch_factor * num_workers
        self._in_order = in_order
        #: Tasks sent so far; a task's number is its place in that order.
        self.sent = 0
        #: In order, the task whose result is handed out next (or an earlier, finished one).
        self._turn = 0
        #: The worker of each task not yet handed out, and the results come before their turn.
        self._owners: dict[int, int] = {}
        self._early: dict[int, Result] = {}
        self._active = [True] * num_workers
        self._load = [0] * num_workers
        self._cycle = itertools.cycle(range(num_workers))

    @property
    def done(self) -> bool:
        """Whether every task sent has been handed out (or gave no batch)."""
        return not self._owners

    def next_worker(self) -> int | None:
        """The worker the next task goes to, or ``None``: none may take one now."""
        if len(self._owners) >= self.limit:
            return None
        active = sum(self._active)
        for _ in range(len(self._active)):
            worker = next(self._cycle)
            if self._active[worker] and (
                self._in_order or self._load[worker] < max(1, self.limit // active)
            ):
                return worker
        return None

    def sent_to(self, worker: int) -> int:
        """Note a task sent to ``worker``; return its number."""
        task = self.sent
        self.sent += 1
        self._owners[task] = worker
        self._load[worker] += 1
        return task

    def ready(self) -> Result | None:
        """A result whose turn it is, among those that came early."""
        if not self._in_order:
            return None
        while self._turn < self.sent and self._turn not in self._owners:
            self._turn += 1
        return self._early.pop(self._turn, None)

    def arrived(self, result: Result) -> Result | None:
        """Account for ``result``; return it if it is to be handed out now."""
        if result.outcome is Outcome.EXHAUSTED:
            self._active[result.worker] = False
            self._finish(result)
            return None
        if self._in_order and result.task != self._turn:
            self._early[result.task] = result
            return None
        return result

    def handed_out(self, result: Result) -> None:
        """``result`` leaves the schedule."""
        self._finish(result)

    def _finish(self, result: Result) -> None:
        del self._owners[result.task]
        self._load[result.worker] -= 1
