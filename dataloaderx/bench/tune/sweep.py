"""The budgeted sweep: a first round over the grid, then rounds of the leaders.

1. **First round.** The user's own setting (``DataLoader`` with their ``num_workers``) runs
   first. Then each worker method climbs its own ladder of worker counts (processes up to
   the cores, threads past them, Ray actors up to the Ray cluster's CPUs) with one setting
   per count, its probe (the default backend and depth, :meth:`Grid.probe`): count by count
   in increasing order, at each count the processes' probe, then the threads', then the
   Ray actors'. The probe without workers (count 0) runs once and is the first rung of
   every ladder. A ladder stops growing once a count with at least two more workers than
   its best count so far is not :data:`MIN_GAIN` faster than it; the other ladders go on
   (threads that wait on I/O may pay where processes did not,
   and processes may pay where threads fight over the GIL). Then every other setting (each
   backend and depth, ``DataLoader``) runs at each ladder's best count. So the first round
   grows with the ladders plus the backends, not with their product, and a slow workload
   still reaches the counts that pay within a short budget. Last, where threads were
   tried, the fastest worker-thread setting runs with ``num_workers="auto"``.
2. **Pruning.** A setting whose first run reached less than :data:`KEEP_SHARE` of the best
   first run is clearly behind and dropped; at most :data:`MAX_LEADERS` of the rest, best
   first, are the leaders, whatever their worker method. The best first run is always a
   leader.
3. **Rounds of the leaders**, each leader once per round in turn, until the budget is spent
   (or :data:`MAX_ROUNDS` rounds ran).

No run starts that is expected to end past the budget: a run is expected to take as long as
the longest run so far of the same setting, or of any setting for one not run yet. The
answer is the leader with the best median rate.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Final, Protocol

from dataloaderx.bench.runner import WORKER_NAMES
from dataloaderx.bench.tune.grid import Grid, Setting
from dataloaderx.bench.tune.measure import Measurement
from dataloaderx.workers.method import RAY, THREAD

__all__ = ["Budget", "SweepResult", "run_sweep", "spread"]

#: A first run below this share of the best first run is pruned.
KEEP_SHARE: Final = 0.85
#: Leaders kept for the later rounds.
MAX_LEADERS: Final = 6
#: Rounds of the leaders at most, however fast their runs.
MAX_ROUNDS: Final = 25
#: More workers help when the best setting of the larger count is this much faster.
MIN_GAIN: Final = 0.03


class Progress(Protocol):
    """What the sweep reports as it goes (see ``dataloaderx.bench.progress.Progress``)."""

    def start_run(self, label: str) -> None: ...

    def advance(self, amount: float = 1) -> None: ...


class Budget:
    """The sweep's deadline on ``clock``, and the longest run seen per setting."""

    def __init__(self, seconds: float, clock: Callable[[], float]) -> None:
        self._clock = clock
        self.started = clock()
        self.deadline = self.started + seconds
        self._longest: dict[Setting, float] = {}

    def now(self) -> float:
        """The clock's reading."""
        return self._clock()

    def left(self) -> float:
        """Seconds until the deadline (negative past it)."""
        return self.deadline - self._clock()

    def fits(self, setting: Setting) -> bool:
        """Whether a run of ``setting`` is expected to end by the deadline."""
        expected = self._longest.get(setting, max(self._longest.values(), default=0.0))
        return expected <= self.left()

    def record(self, setting: Setting, seconds: float) -> None:
        """``setting`` ran for ``seconds``."""
        self._longest[setting] = max(seconds, self._longest.get(setting, 0.0))

    def used(self) -> float:
        """Seconds since the sweep started."""
        return self._clock() - self.started


@dataclass
class SweepResult:
    """Every run of every setting measured, in the order they were first run."""

    runs: dict[Setting, list[Measurement]] = field(default_factory=dict)
    leaders: tuple[Setting, ...] = ()
    #: Rounds of the leaders after the first round (the last one may be partial).
    rounds: int = 0
    #: The worker counts whose settings the first round started on, per worker method.
    worker_counts: dict[str, tuple[int, ...]] = field(default_factory=dict)
    #: Why the first round ended early or a ladder stopped growing, or ``""``.
    cut_short: str = ""
    seconds: float = 0.0

    def median_rate(self, setting: Setting) -> float:
        """Median batches per second over the runs of ``setting``."""
        return statistics.median(run.rate for run in self.runs[setting])

    def ranked(self) -> list[Setting]:
        """The leaders by median rate, best first, then the pruned settings by their one run.

        Only the leaders ran in the rounds: a pruned setting's single run is compared with
        the leaders' first runs, which chose them, and not with their medians."""

        def by_rate(settings: list[Setting]) -> list[Setting]:
            return sorted(settings, key=self.median_rate, reverse=True)

        return by_rate(list(self.leaders)) + by_rate(self.pruned())

    def pruned(self) -> list[Setting]:
        """The settings dropped after the first round."""
        return [setting for setting in self.runs if setting not in self.leaders]


def _leaders(first: dict[Setting, float]) -> tuple[Setting, ...]:
    top = max(first.values())
    kept = [setting for setting, rate in first.items() if rate >= KEEP_SHARE * top]
    kept.sort(key=first.__getitem__, reverse=True)
    return tuple(kept[:MAX_LEADERS])


@dataclass
class _Ladder:
    """One worker method's counts, and its best count so far by the best first run."""

    method: str
    counts: tuple[int, ...]
    best_count: int = -1
    best_rate: float = 0.0
    #: Why the ladder stopped growing, or ``""``.
    stopped: str = ""

    def climb(self, count: int, rate: float) -> None:
        """The settings of ``count`` reached ``rate`` at best: a new best, or a stop (where
        larger counts are left)."""
        if rate > self.best_rate * (1 + MIN_GAIN):
            self.best_count, self.best_rate = count, rate
        elif count >= self.best_count + 2 and count < self.counts[-1]:
            workers = WORKER_NAMES[self.method]
            self.stopped = (
                f"{workers if self.method == RAY else f'worker {workers}'}: "
                f"num_workers={count} was no faster than "
                f"num_workers={self.best_count}: larger counts not tried"
            )


class _Sweeper:
    def __init__(
        self,
        measure: Callable[[Setting], Measurement],
        budget: Budget,
        progress: Progress,
    ) -> None:
        self.measure = measure
        self.budget = budget
        self.progress = progress
        self.result = SweepResult()

    def run(self, setting: Setting, label: str) -> bool:
        """Run ``setting`` once if the budget allows; say whether it ran."""
        if self.result.runs and not self.budget.fits(setting):
            return False
        left = max(0.0, self.budget.left())
        self.progress.start_run(f"{label}: {setting.label} ({left:.0f} s of budget left)")
        before = self.budget.now()
        measured = self.measure(setting)
        seconds = self.budget.now() - before
        self.budget.record(setting, seconds)
        self.progress.advance(seconds)
        self.result.runs.setdefault(setting, []).append(measured)
        return True

    def first_round(self, grid: Grid, own: Setting) -> None:
        if not self.run(own, "first round"):
            return
        ladders = [_Ladder(method, counts) for method, counts in grid.ladders().items()]
        finished = self.climb(grid, ladders) and self.fill(grid, ladders) and self.elastic()
        reasons = [ladder.stopped for ladder in ladders if ladder.stopped]
        if not finished:
            reasons.append(
                "the budget ran out in the first round: raise --budget to try every setting"
            )
        self.result.cut_short = "; ".join(reasons)

    def climb(self, grid: Grid, ladders: list[_Ladder]) -> bool:
        """Run the probe of every ladder, count by count (a probe shared by two ladders
        once); ``False`` where the budget ran out."""
        for count in sorted({count for ladder in ladders for count in ladder.counts}):
            for ladder in ladders:
                if ladder.stopped or count not in ladder.counts:
                    continue
                started = self.result.worker_counts.get(ladder.method, ())
                self.result.worker_counts[ladder.method] = (*started, count)
                probe = grid.probe(count, ladder.method)
                if not self.once(probe):
                    return False
                ladder.climb(count, self.result.runs[probe][0].rate)
        return True

    def fill(self, grid: Grid, ladders: list[_Ladder]) -> bool:
        """Run every setting of each ladder's best count; ``False`` where the budget ran out."""
        for ladder in ladders:
            for setting in grid.settings(ladder.best_count, ladder.method):
                if not self.once(setting):
                    return False
        return True

    def elastic(self) -> bool:
        """Run ``num_workers="auto"`` with the fastest worker-thread setting so far (where
        threads were tried); ``False`` where the budget ran out."""
        runs = self.result.runs
        threads = [setting for setting in runs if setting.worker_method == THREAD]
        if not threads:
            return True
        return self.once(max(threads, key=lambda setting: runs[setting][0].rate).elastic_setting())

    def once(self, setting: Setting) -> bool:
        """Run ``setting`` in the first round unless it ran; ``False`` where it could not."""
        return setting in self.result.runs or self.run(setting, "first round")

    def leader_rounds(self) -> None:
        while self.result.rounds < MAX_ROUNDS:
            for setting in self.result.leaders:
                if not self.run(setting, f"round {self.result.rounds + 2}"):
                    return
            self.result.rounds += 1


def run_sweep(
    grid: Grid,
    own: Setting,
    measure: Callable[[Setting], Measurement],
    *,
    budget: Budget,
    progress: Progress,
) -> SweepResult:
    """Sweep ``grid`` within ``budget``, starting with the user's own setting ``own``."""
    sweeper = _Sweeper(measure, budget, progress)
    sweeper.first_round(grid, own)
    result = sweeper.result
    result.leaders = _leaders({s: runs[0].rate for s, runs in result.runs.items()})
    sweeper.leader_rounds()
    result.seconds = budget.used()
    return result


def spread(runs: Sequence[Measurement]) -> float | None:
    """``(max - min) / median`` of the rates of ``runs``; ``None`` for fewer than two."""
    if len(runs) < 2:
        return None
    rates = [run.rate for run in runs]
    middle = statistics.median(rates)
    return (max(rates) - min(rates)) / middle if middle > 0 else None
