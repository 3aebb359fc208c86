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
    "LOSS",
    "PHASE_CHANGE",
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
#: for adding a worker, USENIX ATC 2022); fewer where at most ``LOSS`` slower.
GAIN, LOSS = 0.07, 0.03
#: A first failed try closes its direction at its count for ``CLOSED_WINDOWS`` windows; a
#: second closes it until a phase change: a rate ``PHASE_CHANGE`` away from the one
#: measured when the direction was closed, in ``PHASE_WINDOWS`` windows in a row.
CLOSED_WINDOWS, PHASE_CHANGE, PHASE_WINDOWS = 60, 0.25, 3


class Window(NamedTuple):
    """What the loader measured at one worker count."""

    workers: int
    batches: int
    seconds: float
    #: Time the loader spent waiting for the workers' next batch.
    wait_seconds: float

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


@dataclass
class _Closed:
    """A direction closed at a count: until ``windows`` more windows, or a phase change."""

    windows: float
    rate: float
    #: Windows in a row at the count whose rate moved by :data:`PHASE_CHANGE`.
    moved: int = 0


def _needed_gain(wait: float) -> float:
    """The gain that keeps more workers, after a window that waited ``wait`` of its time:
    :data:`GAIN`, or half of what ending the wait would give where that is less (the
    loop's own pace caps the gain), and at least :data:`LOSS`."""
    available = wait / (1 - wait) if wait < 1 else math.inf
    return max(LOSS, min(GAIN, available / 2))


class ScalePolicy:
    """The worker count between ``min_workers`` and ``max_workers``; used by one thread."""

    def __init__(self, min_workers: int, max_workers: int) -> None:
        self.min_workers = min_workers
        self.max_workers = max_workers
        self._trial: _Try | None = None
        self._closed: dict[tuple[_Direction, int], _Closed] = {}
        #: Failed tries per direction and count.
        self._failures: dict[tuple[_Direction, int], int] = {}

    def observe(self, window: Window) -> Change | None:
        """Account for ``window``; the change to make now, or ``None``."""
        for key, closed in list(self._closed.items()):
            closed.windows -= 1
            if key[1] == window.workers:
                moved = abs(window.rate - closed.rate) > PHASE_CHANGE * closed.rate
                closed.moved = closed.moved + 1 if moved else 0
            if closed.windows <= 0 or closed.moved >= PHASE_WINDOWS:
                del self._closed[key]
        trial, self._trial = self._trial, None
        if trial is not None:
            return self._judge(trial, window)
        return self._try(window)

    def _try(self, window: Window) -> Change | None:
        n, wait = window.workers, window.wait_fraction
        if wait >= WAIT_HIGH and n < self.max_workers and not self._is_closed(_Direction.UP, n):
            # Enough workers to end the wait if each added one made batches as fast as
            # those running; at least one more, at most twice as many.
            wanted = math.ceil(n / (1 - wait)) if wait < 1 else 2 * n
            target = min(self.max_workers, max(n + 1, min(2 * n, wanted)))
            self._trial = _Try(_Direction.UP, n, window.rate, wait)
            return Change(target, f"tried {target}: the loader waited {wait:.0%} at {n}")
        if n <= self.min_workers or self._is_closed(_Direction.DOWN, n):
            return None
        if wait <= WAIT_LOW:
            self._trial = _Try(_Direction.DOWN, n, window.rate, wait)
            return Change(n - 1, f"tried {n - 1}: the loader waited {wait:.0%} at {n}")
        if wait >= WAIT_HIGH:  # and more did not pay: fewer may be as fast (they compete)
            target = max(self.min_workers, n - max(1, n // 4))
            self._trial = _Try(_Direction.DOWN, n, window.rate, wait)
            return Change(target, f"tried {target}: {n} waited {wait:.0%}, more did not pay")
        return None

    def _judge(self, trial: _Try, window: Window) -> Change | None:
        n, rate, before = window.workers, window.rate, trial.rate
        gain = rate / before - 1 if before > 0 else 0.0
        if trial.direction is _Direction.UP:
            needed = _needed_gain(trial.wait)
            if gain >= needed:
                return Change(n, f"kept {n}: {gain:+.0%} batches/s over {trial.workers}")
            self._close(_Direction.UP, trial.workers, before)
            return Change(
                trial.workers,
                f"back to {trial.workers}: {n} gave {gain:+.0%} batches/s (needs {needed:+.0%})",
            )
        # Where the loader waited before, fewer workers must be as fast; else they may be
        # a little slower, as long as the loader does not come to wait.
        kept = (
            gain >= 0
            if trial.wait >= WAIT_HIGH
            else gain >= -LOSS and window.wait_fraction < WAIT_HIGH
        )
        if kept:
            return Change(n, f"kept {n}: {gain:+.0%} batches/s, waited {window.wait_fraction:.0%}")
        self._close(_Direction.DOWN, trial.workers, before)
        return Change(
            trial.workers,
            f"back to {trial.workers}: {n} gave {gain:+.0%} batches/s, "
            f"waited {window.wait_fraction:.0%}",
        )

    def _is_closed(self, direction: _Direction, workers: int) -> bool:
        return (direction, workers) in self._closed

    def _close(self, direction: _Direction, workers: int, rate: float) -> None:
        key = (direction, workers)
        failures = self._failures.get(key, 0) + 1
        self._failures[key] = failures
        windows = CLOSED_WINDOWS if failures == 1 else math.inf
        self._closed[key] = _Closed(windows, rate)
