"""How many workers an elastic pool runs: a hill climb on the loader's measured rate, started by
the wait for data (pure logic, no clock). The rules, with the constants below:
``docs/elastic-workers.md``, *The policy*.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from typing import NamedTuple

__all__ = [
    "CLOSED_WINDOWS",
    "GAIN",
    "GIL_CORES",
    "GROWTH",
    "LOSS",
    "PHASE_CHANGE",
    "PROBATION",
    "WAIT_HIGH",
    "WAIT_LOW",
    "Change",
    "ScalePolicy",
    "Window",
]

#: The fractions of a window the loader waited for data at most which fewer workers are
#: tried (``WAIT_LOW``), and at least which more are (``WAIT_HIGH``).
WAIT_LOW, WAIT_HIGH = 0.02, 0.05
#: More workers are kept where batches came at least ``GAIN`` faster (Cachew's threshold
#: for adding a worker, USENIX ATC 2022); fewer, where the loader did not wait, where it
#: waits at most ``LOSS`` more of the window's time, and they are not tried where the rate
#: per worker measured says they would make batches ``LOSS`` slower.
GAIN, LOSS = 0.07, 0.03
#: A first failed try closes its direction at its count for ``CLOSED_WINDOWS`` windows; a
#: second closes it until a phase change: a rate ``PHASE_CHANGE`` (a share of it) away from
#: the one measured when the direction was closed, or a wait ``PHASE_CHANGE`` (of the
#: window's time) away, in ``PHASE_WINDOWS`` windows in a row.
CLOSED_WINDOWS, PHASE_CHANGE, PHASE_WINDOWS = 60, 0.25, 3
#: The first batches size the pool only where its threads together kept at most this many
#: cores busy: threads that wait for the GIL keep about one busy, the one that holds it.
GIL_CORES = 0.5
#: A try of more workers asks for at most ``GROWTH`` times as many.
GROWTH = 4
#: Fewer workers, kept where the loader did not wait, are still on trial for this many
#: windows: the loader coming to wait within them fails the try after all.
PROBATION = 3


class Window(NamedTuple):
    """What the loader measured at one worker count."""

    workers: int
    batches: int
    seconds: float
    #: Time the loader spent waiting for the workers' next batch.
    wait_seconds: float
    #: Whether the workers, threads of the loader's process, took turns on one core with
    #: another free (their items hold the GIL, or a lock they share): more would wait too.
    turns: bool = False

    @property
    def rate(self) -> float:
        """Batches per second."""
        return self.batches / self.seconds if self.seconds > 0 else 0.0

    @property
    def wait_fraction(self) -> float:
        return min(1.0, self.wait_seconds / self.seconds) if self.seconds > 0 else 0.0


class Change(NamedTuple):
    """A decision to run ``workers`` workers, and why."""

    workers: int
    reason: str


class _Direction(enum.Enum):
    UP = 1
    DOWN = -1


@dataclass
class _Try:
    """A change under trial: from ``workers`` at ``rate``."""

    direction: _Direction
    workers: int
    rate: float
    wait: float
    #: Whether the workers took turns on one core (:attr:`Window.turns`) there.
    turns: bool


@dataclass
class _Capacity:
    """Batches per second per worker, measured at ``workers`` where the loader waited (the
    workers set the pace); it holds for ``windows`` more windows (:data:`CLOSED_WINDOWS`
    from the measure). Workers that compete (for the cores, for the GIL) each make less
    beside more: it bounds what more make, not what fewer do."""

    per_worker: float
    workers: int
    windows: int


@dataclass
class _Closed:
    """A direction closed at a count: until ``windows`` more windows, or a phase change."""

    windows: float
    #: The rate and the share of time waited at the count when it was closed, and whether
    #: the workers took turns on one core there or at the count tried from it.
    rate: float
    wait: float
    turns: bool
    #: Windows in a row at the count whose rate moved by :data:`PHASE_CHANGE` (a share of
    #: it), or whose wait did (of the window's time).
    moved: int = 0


def _moved(window: Window, rate: float, wait: float, turns: bool) -> bool:
    """Whether ``window`` is a phase change away from ``rate`` and ``wait`` (a share of the
    time): its rate by :data:`PHASE_CHANGE` of ``rate``, or its wait by as many points, but
    where workers took turns on one core (``turns``, or in ``window``): the loop's thread
    takes turns with them then, and waits for the GIL as much as for a batch."""
    return abs(window.rate - rate) > PHASE_CHANGE * rate or (
        not (turns or window.turns) and abs(window.wait_fraction - wait) > PHASE_CHANGE
    )


def _needed_gain(wait: float) -> float:
    """The gain that keeps more workers, after a window that waited ``wait`` of its time:
    :data:`GAIN`, or half of what ending the wait would give where that is less (the
    loop's own pace caps the gain), and at least :data:`LOSS`."""
    available = wait / (1 - wait) if wait < 1 else math.inf
    return max(LOSS, min(GAIN, available / 2))


def _turns_tolerance(trial: _Try, workers: int) -> float:
    """How much slower ``workers``, fewer than ``trial``'s, may make batches and be kept, where
    the loader waited: none, but half of what fewer cost where each thread makes its own
    share, where ``trial``'s threads took turns on one core."""
    return (1 - workers / trial.workers) / 2 if trial.turns else 0.0


class ScalePolicy:
    """The worker count between ``min_workers`` and ``max_workers``; used by one thread."""

    def __init__(self, min_workers: int, max_workers: int) -> None:
        self.min_workers = min_workers
        self.max_workers = max_workers
        self._trial: _Try | None = None
        self._closed: dict[tuple[_Direction, int], _Closed] = {}
        #: Failed tries per direction and count.
        self._failures: dict[tuple[_Direction, int], int] = {}
        #: Fewer workers kept, and the windows left of their probation.
        self._probation: tuple[_Try, int] | None = None
        #: The window observed before.
        self._previous: Window | None = None
        #: What a worker made, where the loader last waited.
        self._capacity: _Capacity | None = None
        #: Fewer workers kept, by the count they came from, and the windows each stays
        #: answerable for: more kept up to that count within them fail it after all.
        self._shrinks: dict[int, tuple[_Try, int]] = {}

    def start(self, workers: int, share: float) -> Change | None:
        """The pool's first batches, at ``workers`` (the cores), spent ``share`` of their
        time on the CPU: the count that keeps the cores busy, where it is more and the
        threads did not wait for the GIL; ``None`` otherwise."""
        if workers * share > GIL_CORES:
            return None
        wanted = self.max_workers if share <= 0 else round(workers / share)
        target = min(self.max_workers, max(self.min_workers, wanted))
        if target <= workers:
            return None
        return Change(
            target, f"started {target}: the first batches spent {share:.0%} of their time on CPU"
        )

    def observe(self, window: Window) -> Change | None:
        """Account for ``window``; the change to make now, or ``None``."""
        previous, self._previous = self._previous, window
        self._measure_capacity(window)
        for key, closed in list(self._closed.items()):
            closed.windows -= 1
            if key[1] == window.workers:
                moved = _moved(window, closed.rate, closed.wait, closed.turns)
                closed.moved = closed.moved + 1 if moved else 0
            if closed.windows <= 0 or closed.moved >= PHASE_WINDOWS:
                del self._closed[key]
        self._shrinks = {
            workers: (shrink, windows - 1)
            for workers, (shrink, windows) in self._shrinks.items()
            if windows > 1
        }
        trial, self._trial = self._trial, None
        if trial is not None:
            return self._judge(trial, window)
        probation, self._probation = self._probation, None
        if probation is not None:
            kept, windows = probation
            if window.wait_fraction >= WAIT_HIGH:
                self._shrinks.pop(kept.workers, None)
                self._close(kept)
                return Change(
                    kept.workers,
                    f"back to {kept.workers}: {window.workers} came to wait "
                    f"{window.wait_fraction:.0%}",
                )
            if windows > 1:
                self._probation = (kept, windows - 1)
        return self._try(window, previous)

    def _try(self, window: Window, previous: Window | None) -> Change | None:
        n, wait = window.workers, window.wait_fraction
        fewer = n > self.min_workers and not self._is_closed(_Direction.DOWN, n)
        more = n < self.max_workers and not self._is_closed(_Direction.UP, n)
        if wait >= WAIT_HIGH and (more or (fewer and window.turns)):
            if previous is not None and (
                previous.workers != n or previous.wait_fraction < WAIT_HIGH
            ):
                # The wait may have begun within this window (a new phase), or come from the
                # change before it: the next whole window at this count says how much.
                return None
            if fewer and window.turns:
                # Threads that took turns on one core (for the GIL, most likely): fewer may
                # be as fast. Where they are not, something else held them (storage, say):
                # that closes fewer, and more are tried as usual.
                return self._fewer(window, "took turns on one core")
            # Enough workers to end the wait if each added one made batches as fast as
            # those running; at least one more, at most GROWTH times as many.
            wanted = math.ceil(n / (1 - wait)) if wait < 1 else GROWTH * n
            target = min(self.max_workers, max(n + 1, min(GROWTH * n, wanted)))
            self._trial = _Try(_Direction.UP, n, window.rate, wait, window.turns)
            return Change(target, f"tried {target}: the loader waited {wait:.0%} at {n}")
        if not fewer:
            return None
        if wait <= WAIT_LOW:
            target = self._enough(self._quarter_fewer(n), window.rate)
            if target >= n:
                return None
            self._trial = _Try(_Direction.DOWN, n, window.rate, wait, window.turns)
            return Change(target, f"tried {target}: the loader waited {wait:.0%} at {n}")
        failed = self._closed.get((_Direction.UP, n))
        if wait >= WAIT_HIGH and failed is not None and not failed.moved:
            # More did not pay, and nothing moved since: fewer may be as fast (they compete
            # for the cores).
            return self._fewer(window, "more did not pay")
        return None

    def _fewer(self, window: Window, why: str) -> Change:
        """Try fewer workers than ``window``'s, where the loader waited, for ``why``."""
        n = window.workers
        target = self._quarter_fewer(n)
        self._trial = _Try(_Direction.DOWN, n, window.rate, window.wait_fraction, window.turns)
        return Change(target, f"tried {target}: {n} waited {window.wait_fraction:.0%}, {why}")

    def _quarter_fewer(self, workers: int) -> int:
        """A quarter fewer than ``workers`` (at least one), within the bounds."""
        return max(self.min_workers, workers - max(1, workers // 4))

    def _judge(self, trial: _Try, window: Window) -> Change | None:
        n, rate, before = window.workers, window.rate, trial.rate
        gain = rate / before - 1 if before > 0 else 0.0
        if trial.direction is _Direction.UP:
            needed = _needed_gain(trial.wait)
            if gain >= needed:
                self._undo_shrinks(trial.workers, window)
                return Change(n, f"kept {n}: {gain:+.0%} batches/s over {trial.workers}")
            self._close(trial)
            return Change(
                trial.workers,
                f"back to {trial.workers}: {n} gave {gain:+.0%} batches/s (needs {needed:+.0%})",
            )
        # Where the loader waited before, fewer workers must be as fast (where more took turns
        # on one core, see _turns_tolerance); else the loop set the pace (and a change of it,
        # the rate): they must not make it wait.
        wait = window.wait_fraction
        if trial.wait >= WAIT_HIGH:
            kept = gain >= -_turns_tolerance(trial, n)
        else:
            kept = wait < WAIT_HIGH and wait - trial.wait <= LOSS
        if kept:
            if trial.wait < WAIT_HIGH:  # the loader did not wait: it must not come to
                self._probation = (trial, PROBATION)
            if trial.turns:  # more, which took turns, were no faster: a failed try of more
                self._close(_Try(_Direction.UP, n, rate, wait, turns=True))
            self._shrinks[trial.workers] = (trial, CLOSED_WINDOWS)
            return Change(n, f"kept {n}: {gain:+.0%} batches/s, waited {wait:.0%}")
        self._close(trial)
        return Change(
            trial.workers,
            f"back to {trial.workers}: {n} gave {gain:+.0%} batches/s, waited {wait:.0%}",
        )

    def _measure_capacity(self, window: Window) -> None:
        capacity = self._capacity
        if window.wait_fraction >= WAIT_HIGH and window.rate > 0:
            self._capacity = _Capacity(window.rate / window.workers, window.workers, CLOSED_WINDOWS)
        elif capacity is not None:
            capacity.windows -= 1
            if capacity.windows <= 0:
                self._capacity = None

    def _enough(self, target: int, rate: float) -> int:
        """``target`` workers, or more where the rate per worker measured at ``target`` or
        fewer says they would make ``rate`` less :data:`LOSS` only with more."""
        capacity = self._capacity
        if capacity is None or target < capacity.workers:
            return target
        return max(target, math.ceil(rate * (1 - LOSS) / capacity.per_worker))

    def _undo_shrinks(self, low: int, window: Window) -> None:
        """More workers, ``window``'s count from ``low``, were kept: a shrink kept lately
        from a count above ``low`` up to it fails, unless ``window`` is a phase change away
        from where the shrink started (the step changed, not the count that suffices)."""
        for workers in [each for each in self._shrinks if low < each <= window.workers]:
            shrink, _ = self._shrinks.pop(workers)
            if not _moved(window, shrink.rate, shrink.wait, shrink.turns):
                self._close(shrink)

    def _is_closed(self, direction: _Direction, workers: int) -> bool:
        return (direction, workers) in self._closed

    def _close(self, trial: _Try) -> None:
        """``trial`` failed: close its direction at the count it started from."""
        key = (trial.direction, trial.workers)
        failures = self._failures.get(key, 0) + 1
        self._failures[key] = failures
        windows = CLOSED_WINDOWS if failures == 1 else math.inf
        self._closed[key] = _Closed(windows, trial.rate, trial.wait, trial.turns)
