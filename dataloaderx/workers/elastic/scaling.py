"""``Scaling``: a loader's elastic worker count, kept across its epochs: the windows measured,
the policy's decisions, and each change with its reason; thread-safe."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from time import perf_counter
from typing import Final

from dataloaderx.util.idle import idle_seconds, took_turns
from dataloaderx.workers.elastic.bounds import Bounds
from dataloaderx.workers.elastic.policy import ScalePolicy, Window

__all__ = ["GIL_TURNS", "ON_THEIR_WAY", "WINDOW_BATCHES", "WINDOW_SECONDS", "Resize", "Scaling"]

#: A window lasts at least this long, and holds at least this many batches and two per
#: worker: enough that one batch more or less moves its rate by a few percent at most.
WINDOW_SECONDS: Final = 0.5
WINDOW_BATCHES: Final = 16
#: Batches on their way per worker when the count changes or an epoch starts (the tasks the
#: loader keeps out per worker, ``prefetch_factor``: 2 by default): not measured.
ON_THEIR_WAY: Final = 2
#: Batches the backend's mode decision takes to measure both modes again once told of a
#: change (prefetched 8-16, inline 2-8, then those made ahead handed out): not measured,
#: so that a window sees the mode decided, not the decision's trials.
MODE_PROBE_BATCHES: Final = 32
#: Two worker threads or more whose batches kept this many cores busy in a window (from,
#: up to), while the cores idled (:func:`~dataloaderx.util.idle.took_turns`), took turns on
#: one core with another free: more would wait their turn too.
GIL_TURNS: Final = (0.75, 1.15)


#: ``(at, workers, why)``: the worker count from ``at`` (``time.perf_counter()``) on.
Resize = tuple[float, int, str]


@dataclass
class _Counting:
    """A window being measured, from ``start`` (``time.perf_counter()``), when the pool's
    batches had spent ``cpu`` seconds on the CPU and the cores had idled ``idle`` (each
    ``None`` where not told)."""

    start: float
    cpu: float | None
    idle: float | None
    batches: int = 0
    #: The loader's wait for the pool's batches.
    wait: float = 0.0

    @classmethod
    def begin(cls, now: float, cpu: float | None) -> _Counting:
        return cls(now, cpu, None if cpu is None else idle_seconds())

    def window(self, workers: int, now: float, cpu: float | None) -> tuple[Window, _Counting]:
        """The window measured, at ``workers``, up to ``now`` (the pool's batches' CPU
        seconds then: ``cpu``), and the next one's count from there."""
        after = _Counting.begin(now, cpu)
        seconds, turns = now - self.start, False
        if workers >= 2 and cpu is not None and self.cpu is not None:
            idle = None if after.idle is None or self.idle is None else after.idle - self.idle
            turns = took_turns((cpu - self.cpu) / seconds, idle, seconds, GIL_TURNS)
        return Window(workers, self.batches, seconds, self.wait, turns), after


class Scaling:
    """The worker count of a loader with ``num_workers="auto"``, within ``bounds``.

    The thread that takes the pool's batches calls :meth:`waited` for each wait for one and
    :meth:`handed_out` for each batch; :meth:`handed_out` answers a new count when the
    policy makes a change. While the pool does not run the count yet (workers starting or
    leaving, an iterable dataset's count waiting for the next epoch), then after a change
    and at an epoch's start, the batches already on their way (two per worker, before and
    after the change) are not measured.
    """

    def __reduce__(self) -> tuple[type[Scaling], tuple[Bounds]]:
        # A copy of the loader (pickled, deep-copied) sizes its own pool from the start.
        return Scaling, (self.bounds,)

    def __init__(self, bounds: Bounds) -> None:
        self.bounds = bounds
        self._lock = threading.Lock()
        #: Guarded by ``_lock`` from here on.
        self._policy = ScalePolicy(bounds.min_workers, bounds.max_workers)
        self._workers = bounds.start
        self._history: list[Resize] = [
            (perf_counter(), bounds.start, "the cores this process may use")
        ]
        #: The length of the history at the latest :meth:`resized`.
        self._told = 1
        self._epoch_start = perf_counter()
        self._epoch_workers = bounds.start
        #: Batches still on their way from before a change (not measured), then the window
        #: being measured.
        self._settle = 0
        self._counting: _Counting | None = None
        #: Whether the pool's first batches sized it (:meth:`size`), or a resume did.
        self._sized = False

    @property
    def workers(self) -> int:
        """The worker count now."""
        with self._lock:
            return self._workers

    @property
    def epoch_workers(self) -> int:
        """The count at the latest epoch's start: an iterable dataset's epoch runs with it."""
        with self._lock:
            return self._epoch_workers

    def resume_with(self, workers: int) -> None:
        """The next epoch continues a saved one that ran ``workers`` workers: so does it."""
        with self._lock:
            bounds = self.bounds
            workers = min(bounds.max_workers, max(bounds.min_workers, workers))
            self._sized = True
            if workers != self._workers:
                self._resize(workers, "the count of the epoch resumed", perf_counter())

    def resized(self) -> bool:
        """Whether the worker count changed since the call before (or the loader's start),
        told once the pool runs it and the batches on their way from before are out (what
        either mode costs is measured on the new count): asked at each report to the
        backend's mode decision, across epochs."""
        with self._lock:
            if self._counting is None:
                return False
            told, self._told = self._told, len(self._history)
            if told == self._told:
                return False
            # The decision measures both modes now: the next window is measured after.
            self._hold(MODE_PROBE_BATCHES)
            return True

    def history(self) -> tuple[Resize, ...]:
        """The count at the latest epoch's start, and every change since."""
        with self._lock:
            since, history = self._epoch_start, list(self._history)
        first = max((k for k, (at, _, _) in enumerate(history) if at <= since), default=0)
        return tuple(history[first:])

    @property
    def sizing(self) -> bool:
        """Whether the pool's first batches are still to size it (:meth:`size`)."""
        with self._lock:
            return not self._sized

    def size(self, share: float) -> int | None:
        """The pool's first batches spent ``share`` of their time on the CPU: the new count
        where the policy starts more workers from it (once for the loader), else ``None``."""
        now = perf_counter()
        with self._lock:
            if self._sized:
                return None
            self._sized = True
            change = self._policy.start(self._workers, share)
            return None if change is None else self._resize(change.workers, change.reason, now)

    def new_epoch(self) -> None:
        """An epoch starts: its first batches (the pool filling, and a window's worth while
        its caches warm) are not measured."""
        with self._lock:
            self._epoch_start = now = perf_counter()
            if self._history[-1][1] != self._workers:  # workers ended between epochs
                self._history.append((now, self._workers, "the count before the epoch's end"))
            self._epoch_workers = self._workers
            self._hold(ON_THEIR_WAY * self._workers + WINDOW_BATCHES)

    def idled(self, workers: int, reason: str) -> None:
        """Between epochs, the pool came to run ``workers`` for ``reason``; the next epoch
        runs the count again."""
        with self._lock:
            self._history.append((perf_counter(), workers, reason))

    def waited(self, seconds: float) -> None:
        """The loader waited ``seconds`` for the pool's next batch."""
        with self._lock:
            if self._counting is not None:
                self._counting.wait += seconds

    def handed_out(self, running: int, resizing: bool, cpu: float | None = None) -> int | None:
        """A batch left the pool, which runs ``running`` workers and is ``resizing`` towards
        the count asked for (or not), and whose batches spent ``cpu`` seconds on the CPU so
        far (``None``: not measured); the new worker count, where the policy changes it, or
        where the pool runs fewer than asked and is no longer resizing (it had no room)."""
        now = perf_counter()
        with self._lock:
            if running != self._workers:
                if not resizing:
                    return self._resize(running, f"ran {running}: no room for more", now)
                self._hold(ON_THEIR_WAY * max(running, self._workers))
                return None
            if self._settle:
                self._settle -= 1
                if not self._settle:
                    self._counting = _Counting.begin(now, cpu)
                return None
            counting = self._counting
            if counting is None:
                self._counting = _Counting.begin(now, cpu)
                return None
            counting.batches += 1
            seconds = now - counting.start
            if seconds < WINDOW_SECONDS or counting.batches < max(
                WINDOW_BATCHES, 2 * self._workers
            ):
                return None
            window, self._counting = counting.window(self._workers, now, cpu)
            change = self._policy.observe(window)
            if change is None or change.workers == self._workers:
                return None
            return self._resize(change.workers, change.reason, now)

    def _resize(self, workers: int, reason: str, now: float) -> int:
        before, self._workers = self._workers, workers
        self._history.append((now, workers, reason))
        self._hold(ON_THEIR_WAY * max(before, workers))
        return workers

    def _hold(self, batches: int) -> None:
        """Measure again once the next ``batches`` batches are out (after a change, those on
        their way: :data:`ON_THEIR_WAY` per worker)."""
        self._settle = batches
        self._counting = None
