"""The phases of the mode decision, each with the data it measures. ``ModeDecision`` replaces its
phase object on every transition: nothing carries over but what the new one is built with."""

from __future__ import annotations

import enum
import statistics
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import ClassVar, Final

#: Cycles in the window whose median is watched for drift: enough to keep it steady when
#: batches from worker processes arrive in bursts.
DRIFT_WINDOW: Final = 32
#: The window's median is checked every half window, or less often where cycles are short:
#: every this many seconds of cycles (at the median of the check before) ...
CHECK_SECONDS: Final = 0.05
#: ... but at least every this many cycles.
CHECK_GAP_MAX: Final = 1024
#: Prefetched cycles a compared prefetch decision settles for before it is confirmed.
CONFIRM_AFTER: Final = 16
#: A probe goes on until its cycles add up to this many seconds, so that short, noisy cycles
#: are judged on more of them (a batch costs little there) ...
PROBE_SECONDS: Final = 0.003
#: ... up to this many cycles.
PROBE_MAX: Final = 16


class Phase(enum.Enum):
    """Where the decision stands."""

    #: Prefetching is measured: the producer's times and the loop's.
    PROBE = "probe"
    #: Inline cycles are measured against the probe's mean prefetched cycle.
    COMPARE = "compare"
    #: A compared prefetch decision runs its first cycles before it is confirmed.
    SETTLE = "settle"
    #: Inline cycles are measured against the settled prefetched cycles.
    CONFIRM = "confirm"
    #: Decided: the cycle is watched for drift (and a prefetch decision re-confirmed).
    STEADY = "steady"


def enough(cycles: Sequence[float], least: int) -> bool:
    """Whether a probe measured enough: ``least`` cycles and ``PROBE_SECONDS``, or ``PROBE_MAX``."""
    count = len(cycles)
    return count >= PROBE_MAX or (count >= least and sum(cycles) >= PROBE_SECONDS)


def spread(cycles: Sequence[float]) -> float:
    """How far apart the middle half of ``cycles`` lies, as a fraction of their median."""
    ordered = sorted(cycles)
    quarter = len(ordered) // 4
    middle = ordered[quarter : len(ordered) - quarter]
    return (middle[-1] - middle[0]) / statistics.median(ordered)


@dataclass
class Probe:
    """PROBE: the prefetched cycles, and the producer's ``(wall, cpu)`` per batch."""

    phase: ClassVar[Phase] = Phase.PROBE
    #: In a re-check of an inline decision: the median inline cycle that drifted.
    drifted_inline: float | None = None
    #: After a change of the workers, from prefetching: it goes on unless inline wins.
    prefetching: bool = False
    seconds: list[float] = field(default_factory=list)
    #: Sums over the cycles: the loop's wait inside ``next()``, and its CPU time.
    wait: float = 0.0
    cpu: float = 0.0
    produced: list[tuple[float, float]] = field(default_factory=list)


@dataclass
class Compare:
    """COMPARE or CONFIRM: inline cycles, against a mean prefetched cycle."""

    phase: Phase
    prefetch: float
    #: CONFIRM: the drift reference to keep once prefetching is confirmed.
    reference: float | None = None
    inline: list[float] = field(default_factory=list)
    #: COMPARE after a change of the workers, from prefetching: see ``Probe``.
    prefetching: bool = False


@dataclass
class Watch:
    """SETTLE or STEADY: the decided mode's cycles since the decision."""

    phase: Phase
    #: The latest cycles, whose median is checked for drift.
    window: deque[float] = field(default_factory=lambda: deque(maxlen=DRIFT_WINDOW))
    since: int = 0
    #: The window is checked once ``since`` reaches this ...
    next_check: int = DRIFT_WINDOW // 2
    #: ... and had this median at the latest check.
    median: float | None = None
    #: The median of the first full window: the steady state a drift is measured from.
    reference: float | None = None
    drifted: bool = False
    #: STEADY after prefetching was confirmed: confirm it again once ``since`` reaches this.
    reconfirm_at: int | None = None

    def quiet(self) -> int:
        """How many coming cycles, all but the last, cannot reach a check."""
        if self.phase is Phase.SETTLE:
            return max(1, CONFIRM_AFTER - self.since)
        filling = DRIFT_WINDOW - len(self.window)
        quiet = max(self.next_check - self.since, filling)
        if self.reconfirm_at is not None:
            quiet = min(quiet, max(self.reconfirm_at - self.since, filling))
        return max(1, quiet)

    def schedule_check(self, median: float) -> None:
        """A check found ``median``: the next one comes after its ``CHECK_SECONDS`` of
        cycles, at least half a window and at most ``CHECK_GAP_MAX`` cycles later."""
        self.median = median
        half = DRIFT_WINDOW // 2
        if median <= CHECK_SECONDS / CHECK_GAP_MAX:
            gap = CHECK_GAP_MAX
        else:
            gap = max(half, min(CHECK_GAP_MAX, int(CHECK_SECONDS / median)))
        self.next_check = self.since + gap
