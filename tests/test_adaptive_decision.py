"""The prefetch-or-inline decision, from scripted cycle timings (no clock, no thread)."""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol

import pytest

from dataloaderx.contracts.policy import INLINE, PREFETCH, Cycles, Mode
from dataloaderx.engine.decision import (
    CLEAR_LOSS_AFTER,
    FIRST_RECHECK_GAP,
    INLINE_PROBE,
    INLINE_PROBE_MORE,
    OVERRUN_FACTOR,
    PREFETCH_PROBE,
    ModeDecision,
)
from dataloaderx.engine.phases import (
    CHECK_GAP_MAX,
    CONFIRM_AFTER,
    DRIFT_WINDOW,
    PROBE_MAX,
    Phase,
)

MS = 0.001
#: The most cycle times a report carries (what the epoch keeps of a run).
TAIL = 32


class Cycle(NamedTuple):
    """One scripted batch as the loop sees it; seconds."""

    mode: Mode
    seconds: float
    wait: float
    cpu: float = 0.0
    produced: tuple[tuple[float, float], ...] = ()

    def report(self) -> Cycles:
        """This cycle reported on its own."""
        return Cycles(self.mode, 1, (self.seconds,), self.wait, self.cpu, self.produced)


@dataclass(frozen=True)
class Workload:
    """Seconds per batch of one scripted loop: its step, and making a batch.

    ``produce`` is the time ``next(source)`` takes; ``produce_cpu`` and ``step_cpu`` the
    CPU time that holds the GIL (a pure-Python loop), so that two threads cannot overlap
    it. ``parallel`` is the share of ``produce`` spent waiting for work that runs in other
    processes anyway (DataLoader workers), which a thread cannot hide either.
    """

    step: float
    produce: float
    step_cpu: float = 0.0
    produce_cpu: float = 0.0
    parallel: float = 0.0

    def inline(self) -> Cycle:
        own = self.produce * (1 - self.parallel)
        waited = max(own, self.produce - self.step)
        return Cycle(INLINE, self.step + waited, waited)

    def prefetch(self) -> Cycle:
        # The GIL-holding parts cannot overlap; the rest overlaps fully.
        serial = self.step_cpu + self.produce_cpu
        seconds = max(self.step, self.produce, serial) + 0.02 * MS  # plus the hand-off
        wait = seconds - self.step
        return Cycle(
            PREFETCH,
            seconds,
            wait,
            cpu=self.step_cpu,
            produced=((self.produce + self.step_cpu, self.produce_cpu),),
        )


class Loop(Protocol):
    def inline(self) -> Cycle: ...

    def prefetch(self) -> Cycle: ...


@dataclass
class GilConvoy:
    """A GIL-bound loop as two threads really run it: prefetched cycles are bimodal.

    While the buffer holds a batch the step runs at once (``short``); then the consumer
    waits a whole switch interval for the GIL (``long``). ``pattern`` lists the cycles
    of one round, repeated; ``lucky`` short cycles come first (a probe can be lucky).
    """

    serial: float
    short: float
    long: float
    pattern: str = "ssl"
    lucky: int = 0
    _made: int = field(default=0, init=False)

    def inline(self) -> Cycle:
        return Cycle(INLINE, self.serial, self.serial / 2)

    def prefetch(self) -> Cycle:
        made = self._made
        self._made += 1
        short = made < self.lucky or self.pattern[made % len(self.pattern)] == "s"
        seconds = self.short if short else self.long
        half = self.serial / 2
        return Cycle(PREFETCH, seconds, max(0.0, seconds - half), half, ((half, half),))


def noisy(cycle: Cycle, rng: random.Random, spread: float) -> Cycle:
    factor = 1 + rng.uniform(-spread, spread)
    return Cycle(cycle.mode, cycle.seconds * factor, cycle.wait * factor, cycle.cpu, cycle.produced)


def run(
    decision: ModeDecision,
    workload: Callable[[int], Loop],
    batches: int,
    *,
    start: int = 0,
    spread: float = 0.0,
    seed: int = 0,
    helper_processes: bool = True,
    bulk: bool = False,
    cut_overruns: bool = False,
) -> list[Mode]:
    """Make ``batches`` batches of one epoch as the decision says; return each one's mode.

    Every cycle is reported on its own, or, with ``bulk``, as an epoch reports them: the
    cycles of a run at once, at most the latest ``TAIL`` of their times; with
    ``cut_overruns`` too, a run whose cycles take longer than its verdict allows is
    reported there, as overran.
    """
    rng = random.Random(seed)
    modes: list[Mode] = []
    verdict = decision.start_epoch(helper_processes=helper_processes)
    run: list[float] = []
    for index in range(start, start + batches):
        mode = verdict.mode
        modes.append(mode)
        load = workload(index)
        cycle = noisy(load.prefetch() if mode == PREFETCH else load.inline(), rng, spread)
        if index == start:  # the epoch's first batch ends no cycle
            verdict = decision.observe(Cycles(mode, 0))
        elif not bulk or verdict.measure:
            verdict = decision.observe(cycle.report())
        else:
            run.append(cycle.seconds)
            overran = cut_overruns and len(run) < verdict.cycles and sum(run) > verdict.seconds
            if len(run) == verdict.cycles or overran or index == start + batches - 1:
                report = Cycles(mode, len(run), run[-TAIL:], overran=overran)
                verdict = decision.observe(report)
                run = []
    return modes


def test_slow_fetch_with_a_gpu_like_step_prefetches_without_trying_inline() -> None:
    decision = ModeDecision()
    io_bound = Workload(step=15 * MS, produce=15 * MS)  # both release the GIL
    modes = run(decision, lambda _: io_bound, 40)
    assert modes[0] == INLINE  # the first batch: nothing to overlap yet
    assert modes[1:] == [PREFETCH] * 39  # no batch was made inline to find out
    assert decision.decisions == 1
    assert decision.reason.startswith("making batches overlapped the step: ")


def test_slow_fetch_made_in_this_process_prefetches_without_trying_inline() -> None:
    decision = ModeDecision()
    # The consumer waits for every batch, but no worker process could be making them.
    slow_fetch = Workload(step=3.75 * MS, produce=15 * MS)
    modes = run(decision, lambda _: slow_fetch, 80, helper_processes=False)
    assert modes == [INLINE] + [PREFETCH] * 79
    assert decision.decisions == 1
    assert decision.reason.startswith("making batches overlapped the step: ")


@dataclass(frozen=True)
class PreemptedGilLoop:
    """A GIL-bound loop on a loaded machine: 3 ms of CPU per thread and batch.

    Prefetched, another process preempts the thread holding the GIL, so the other
    thread's wait for it (in its wall time) exceeds the holder's CPU time.
    """

    def inline(self) -> Cycle:
        return Cycle(INLINE, 6.5 * MS, 3.25 * MS)

    def prefetch(self) -> Cycle:
        return Cycle(PREFETCH, 7 * MS, 3 * MS, cpu=3 * MS, produced=((10.5 * MS, 3 * MS),))


def test_a_busy_gil_bound_loop_stretched_by_preemption_is_not_a_clear_win() -> None:
    decision = ModeDecision()
    # step + produce - CPU = 4 + 10.5 - 6 = 8.5 ms > 7 ms / 0.9: the bound alone would
    # call it an overlap, but the threads used the CPU for 6 of the 7 ms.
    modes = run(decision, lambda _: PreemptedGilLoop(), 60, helper_processes=False)
    assert modes[1 + PREFETCH_PROBE] == INLINE
    assert modes[-30:] == [INLINE] * 30
    assert decision.reason.startswith("prefetching did not pay: ")


def test_workers_waited_for_during_a_fast_step_are_not_taken_for_a_clear_win() -> None:
    decision = ModeDecision()
    # The producer only waits for worker processes, which work during the step inline too.
    workers = Workload(step=3.75 * MS, produce=15 * MS, parallel=1.0)
    modes = run(decision, lambda _: workers, 80, helper_processes=True)
    assert modes[1 + PREFETCH_PROBE] == INLINE  # not decided from the bound: measured
    assert modes[-40:] == [INLINE] * 40
    assert decision.reason.startswith("prefetching did not pay: ")


def test_slow_fetch_with_a_fast_step_prefetches_after_a_short_inline_probe() -> None:
    decision = ModeDecision()
    # Helper processes may make the batches: the waits could be theirs, so inline is tried.
    modes = run(decision, lambda _: Workload(step=3.75 * MS, produce=15 * MS), 80)
    probe_end = 1 + PREFETCH_PROBE + INLINE_PROBE
    assert modes[1 + PREFETCH_PROBE : probe_end] == [INLINE] * INLINE_PROBE
    # Confirmed once it settled: its first window, then inline cycles made right after.
    confirmed = probe_end + CONFIRM_AFTER
    assert modes[probe_end:confirmed] == [PREFETCH] * CONFIRM_AFTER
    assert modes[confirmed : confirmed + INLINE_PROBE] == [INLINE] * INLINE_PROBE
    assert modes[confirmed + INLINE_PROBE :] == [PREFETCH] * (80 - confirmed - INLINE_PROBE)
    assert decision.decisions == 1
    assert decision.reason.startswith("prefetching paid: ")


def test_fast_step_with_workers_makes_batches_inline() -> None:
    decision = ModeDecision()
    workers = Workload(step=0.01 * MS, produce=0.2 * MS, produce_cpu=0.02 * MS, parallel=1.0)
    modes = run(decision, lambda _: workers, 500)
    # Short cycles are probed longer (3 ms' worth), which costs little at this size.
    assert PREFETCH_PROBE < modes.count(PREFETCH) <= PROBE_MAX
    assert modes[-400:] == [INLINE] * 400
    assert decision.decisions == 1
    assert decision.reason.startswith("prefetching did not pay: ")


def test_gil_bound_python_makes_batches_inline() -> None:
    decision = ModeDecision()
    python = Workload(step=5 * MS, produce=5 * MS, step_cpu=5 * MS, produce_cpu=5 * MS)
    modes = run(decision, lambda _: python, 60, spread=0.1)
    assert modes.count(PREFETCH) == PREFETCH_PROBE
    assert modes[-50:] == [INLINE] * 50


def test_gil_bound_python_with_bimodal_prefetched_cycles_makes_batches_inline() -> None:
    decision = ModeDecision()
    # Median prefetched cycle 3 ms, below the 6.3 ms inline one; the mean is 8.7 ms.
    convoy = GilConvoy(serial=6.3 * MS, short=3 * MS, long=20 * MS)
    modes = run(decision, lambda _: convoy, 200)
    assert modes[-150:] == [INLINE] * 150
    assert decision.decisions == 1
    assert decision.reason.startswith("prefetching did not pay: ")


def test_a_lucky_prefetch_probe_is_undone_once_the_loop_settles() -> None:
    decision = ModeDecision()
    convoy = GilConvoy(serial=6.3 * MS, short=3 * MS, long=25 * MS, lucky=PROBE_MAX)
    modes = run(decision, lambda _: convoy, 400)
    assert decision.decisions == 2  # prefetch after the probe, then inline, once
    assert decision.reason.startswith("prefetching did not pay once settled: ")
    assert modes.count(PREFETCH) <= PROBE_MAX + CONFIRM_AFTER
    settled = modes.index(INLINE, 1 + PREFETCH_PROBE + INLINE_PROBE)
    assert modes[settled:] == [INLINE] * (400 - settled)


def test_a_prefetch_decision_that_keeps_paying_is_confirmed() -> None:
    decision = ModeDecision()
    # Overlapping, but only a little: not a clear win, so compared with inline first.
    loop = GilConvoy(serial=6 * MS, short=4.5 * MS, long=4.5 * MS)
    modes = run(decision, lambda _: loop, 400, spread=0.1, seed=3)
    assert decision.decisions == 1
    assert decision.reason.startswith("prefetching paid: ")
    # Inline only to confirm it: after 16 settled batches, then once more 128 later.
    assert modes[-300:].count(INLINE) <= INLINE_PROBE_MORE
    assert modes[-40:] == [PREFETCH] * 40


def test_a_prefetch_decision_that_stops_paying_without_a_drift_is_undone() -> None:
    decision = ModeDecision()
    # A little faster prefetched for 300 batches, then 10% slower: too small a change
    # for the drift watch (2x), found by the next confirmation.
    paying = GilConvoy(serial=6 * MS, short=4.5 * MS, long=4.5 * MS)
    losing = GilConvoy(serial=6 * MS, short=6.6 * MS, long=6.6 * MS)
    modes = run(decision, lambda index: paying if index < 300 else losing, 1000)
    assert decision.rechecks == 0
    assert decision.decisions == 2
    assert decision.reason.startswith("prefetching did not pay once settled: ")
    undone = modes.index(INLINE, 300)
    assert undone < 300 + 2 * FIRST_RECHECK_GAP + DRIFT_WINDOW
    assert modes[undone:] == [INLINE] * (1000 - undone)


@dataclass
class PreemptedOnce(GilConvoy):
    """A :class:`GilConvoy` whose first inline cycle another process stretched."""

    _inline_made: int = field(default=0, init=False)

    def inline(self) -> Cycle:
        self._inline_made += 1
        cycle = super().inline()
        return cycle._replace(seconds=4 * cycle.seconds) if self._inline_made == 2 else cycle


def test_one_disturbed_inline_cycle_does_not_decide() -> None:
    decision = ModeDecision()
    # Prefetching is 3% slower on average; one inline cycle of the probe took 4x as long.
    loop = PreemptedOnce(serial=6 * MS, short=6.2 * MS, long=6.2 * MS)
    modes = run(decision, lambda _: loop, 100)
    probe_end = 1 + PREFETCH_PROBE + INLINE_PROBE_MORE
    assert modes[1 + PREFETCH_PROBE : probe_end] == [INLINE] * INLINE_PROBE_MORE
    assert modes[probe_end:] == [INLINE] * (100 - probe_end)
    assert decision.reason.startswith("prefetching did not pay: ")


def test_a_tie_goes_to_inline() -> None:
    decision = ModeDecision()
    # Prefetched or not, the cycle is the same: nothing to overlap.
    modes = run(decision, lambda _: Workload(step=2 * MS, produce=0.05 * MS, parallel=1.0), 40)
    assert modes[-20:] == [INLINE] * 20


def test_a_change_mid_run_is_re_decided_once() -> None:
    decision = ModeDecision()
    fast = Workload(step=0.01 * MS, produce=0.3 * MS, parallel=1.0)
    overlapping = Workload(step=20 * MS, produce=20 * MS)

    def workload(index: int) -> Workload:
        return fast if index < 300 else overlapping

    # As the adaptive stream hands cycles over: in bulk, and cut short when they grow.
    modes = run(decision, workload, 2000, spread=0.2, seed=1, bulk=True, cut_overruns=True)
    assert modes[250:300] == [INLINE] * 50
    assert decision.decisions == 2
    assert decision.rechecks == 1
    switched = modes.index(PREFETCH, 300)
    assert switched <= 300 + 2 * DRIFT_WINDOW  # noticed within two windows
    assert modes[switched:] == [PREFETCH] * (2000 - switched)  # and never flipped back


def test_a_re_check_stops_prefetching_that_is_clearly_slower_than_inline() -> None:
    decision = ModeDecision()
    before = Workload(step=0.01 * MS, produce=0.3 * MS, parallel=1.0)
    # After the change, a producer thread fights the workers for the cores: 3x slower.
    after = SlowerPrefetch(Workload(step=1 * MS, produce=0.3 * MS, parallel=1.0), factor=3.0)

    modes = run(decision, lambda index: before if index < 300 else after, 1000)
    assert decision.rechecks == 1
    recheck = modes.index(PREFETCH, 300)
    assert modes[recheck : recheck + CLEAR_LOSS_AFTER] == [PREFETCH] * CLEAR_LOSS_AFTER
    assert modes[recheck + CLEAR_LOSS_AFTER :] == [INLINE] * (1000 - recheck - CLEAR_LOSS_AFTER)
    assert decision.reason.startswith("prefetching was clearly slower: ")


@dataclass
class SlowerPrefetch:
    """``loop`` whose prefetched cycles take ``factor`` times its inline ones."""

    loop: Workload
    factor: float

    def inline(self) -> Cycle:
        return self.loop.inline()

    def prefetch(self) -> Cycle:
        seconds = self.factor * self.loop.inline().seconds
        return Cycle(PREFETCH, seconds, seconds - self.loop.step, produced=((seconds, 0.0),))


def test_noise_alone_never_triggers_a_re_check() -> None:
    decision = ModeDecision()
    python = Workload(step=5 * MS, produce=5 * MS, step_cpu=5 * MS, produce_cpu=5 * MS)
    run(decision, lambda _: python, 3000, spread=0.35, seed=2)
    assert decision.decisions == 1
    assert decision.rechecks == 0


def test_a_cost_that_keeps_changing_is_re_checked_less_and_less_often() -> None:
    decision = ModeDecision()
    cheap = Workload(step=1 * MS, produce=1 * MS, step_cpu=1 * MS, produce_cpu=1 * MS)
    dear = Workload(step=4 * MS, produce=4 * MS, step_cpu=4 * MS, produce_cpu=4 * MS)
    run(decision, lambda index: cheap if (index // 20) % 2 else dear, 2000)
    # A change every 20 batches could start 100 re-checks; each doubles the gap.
    assert decision.rechecks <= 7


def test_the_decision_carries_over_short_epochs() -> None:
    decision = ModeDecision()
    workers = Workload(step=0.01 * MS, produce=0.2 * MS, parallel=1.0)
    epochs = [run(decision, lambda _: workers, 3) for _ in range(40)]
    assert all(modes[0] == INLINE for modes in epochs)
    assert decision.decisions == 1
    assert epochs[-1] == [INLINE] * 3
    assert sum(modes.count(PREFETCH) for modes in epochs) <= PROBE_MAX


def test_a_new_epoch_keeps_prefetching_after_its_first_batch() -> None:
    decision = ModeDecision()
    io_bound = Workload(step=15 * MS, produce=15 * MS)
    run(decision, lambda _: io_bound, 10)
    assert run(decision, lambda _: io_bound, 10) == [INLINE] + [PREFETCH] * 9
    assert decision.decisions == 1


def test_cpu_figures_are_asked_for_only_while_probing_prefetch() -> None:
    decision = ModeDecision()
    verdict = decision.start_epoch(helper_processes=True)
    asked = []
    load = Workload(step=0.01 * MS, produce=2 * MS, parallel=1.0)
    for _ in range(30):
        asked.append(verdict.measure)
        cycle = load.prefetch() if verdict.mode == PREFETCH else load.inline()
        verdict = decision.observe(cycle.report())
    assert asked[0] is False  # the first batch is made inline, untimed
    assert asked[1 : 1 + PREFETCH_PROBE] == [True] * PREFETCH_PROBE
    assert not any(asked[1 + PREFETCH_PROBE :])


def test_cycles_in_another_mode_than_asked_are_not_counted() -> None:
    decision = ModeDecision()
    workers = Workload(step=0.01 * MS, produce=2 * MS, parallel=1.0)
    run(decision, lambda _: workers, 1 + PREFETCH_PROBE)
    assert decision.phase is Phase.COMPARE  # the prefetch probe is over; inline is measured
    for _ in range(10):
        verdict = decision.observe(Cycle(PREFETCH, 1.0, 0.0).report())
    assert decision.decisions == 0
    assert verdict.mode == INLINE


def decide_many_epochs(bulk: bool, workload: Callable[[int], Loop], epoch: int) -> object:
    decision = ModeDecision()
    modes = []
    for start in range(0, 1500, epoch):
        modes += run(decision, workload, epoch, start=start, spread=0.3, seed=start, bulk=bulk)
    return modes, decision.decisions, decision.rechecks, decision.reason, decision.verdict().mode


def test_cycles_handed_over_in_bulk_decide_exactly_as_one_by_one() -> None:
    paying = GilConvoy(serial=6 * MS, short=4.5 * MS, long=4.5 * MS)
    losing = GilConvoy(serial=6 * MS, short=6.6 * MS, long=6.6 * MS)
    fast = Workload(step=0.01 * MS, produce=0.3 * MS, parallel=1.0)
    overlapping = Workload(step=20 * MS, produce=20 * MS)
    slower = SlowerPrefetch(Workload(step=1 * MS, produce=0.3 * MS, parallel=1.0), factor=3.0)
    workloads: dict[str, Callable[[int], Loop]] = {
        # confirmations, then re-confirmations 128, 256 and 512 batches on
        "keeps paying": lambda _: paying,
        "stops paying": lambda index: paying if index < 300 else losing,
        "drifts to overlap": lambda index: fast if index < 300 else overlapping,
        "drifts, prefetching clearly slower": lambda index: fast if index < 300 else slower,
        "changes every 20 batches": lambda index: (fast, overlapping)[(index // 20) % 2],
    }
    for name, workload in workloads.items():
        # Epochs of 1500 (one), 37 and 5 batches: each new epoch empties the window.
        for epoch in (1500, 37, 5):
            one_by_one = decide_many_epochs(False, workload, epoch)
            assert decide_many_epochs(True, workload, epoch) == one_by_one, (name, epoch)


@pytest.mark.parametrize(
    ("cycle_ms", "check_gap"),
    [
        (5.0, DRIFT_WINDOW // 2),  # a half window: 80 ms of cycles
        (0.3, 166),  # 50 ms of cycles
        (0.01, CHECK_GAP_MAX),  # 50 ms would be 5000 cycles
    ],
)
def test_runs_end_where_a_check_could_change_the_mode(cycle_ms: float, check_gap: int) -> None:
    decision = ModeDecision()
    workload = Workload(step=0.0, produce=cycle_ms * MS, parallel=1.0)
    run(decision, lambda _: workload, 40)
    verdict = decision.verdict()
    assert verdict.mode == INLINE
    assert not verdict.measure
    runs = []
    for _ in range(20):
        runs.append(verdict.cycles)
        seconds = [workload.inline().seconds] * min(verdict.cycles, TAIL)
        verdict = decision.observe(Cycles(INLINE, verdict.cycles, seconds))
    # Up to the next drift check, then from check to check.
    assert 1 <= runs[0] <= DRIFT_WINDOW
    assert runs[1:] == [check_gap] * 19
    assert decision.rechecks == 0
    # The epoch's first batch is reported alone.
    assert decision.start_epoch(helper_processes=True).cycles == 1


def test_a_drift_of_tiny_cycles_is_seen_within_a_few_checks() -> None:
    # Batches of 10 microseconds: checks are CHECK_GAP_MAX cycles apart (long steady
    # runs), and a change of the cost still starts a re-check within three of them.
    tiny = Workload(step=0.0, produce=0.01 * MS, parallel=1.0)
    overlapping = Workload(step=0.2 * MS, produce=0.2 * MS)  # prefetching pays
    changed_at = 4000
    for bulk in (False, True):
        decision = ModeDecision()
        modes = run(
            decision,
            lambda index: tiny if index < changed_at else overlapping,
            8000,
            bulk=bulk,
        )
        assert modes[changed_at - 1] == INLINE
        first_prefetched = modes.index(PREFETCH, changed_at)
        assert first_prefetched <= changed_at + 3 * CHECK_GAP_MAX, bulk
        assert decision.rechecks == 1
        assert decision.verdict().mode == PREFETCH


def test_a_steady_run_whose_cycles_grow_is_cut_short_and_checked_soon() -> None:
    # Checks spaced for batches of 10 microseconds would come CHECK_GAP_MAX batches of
    # 20 ms later; cut at its time budget, the run ends within a few batches of the
    # change, and the next check comes within half a window.
    tiny = Workload(step=0.0, produce=0.01 * MS, parallel=1.0)
    slow = Workload(step=20 * MS, produce=20 * MS)  # prefetching halves the cycle
    changed_at = 3000

    def workload(index: int) -> Workload:
        return tiny if index < changed_at else slow

    cut = ModeDecision()
    modes = run(cut, workload, changed_at + 2 * CHECK_GAP_MAX, bulk=True, cut_overruns=True)
    assert cut.rechecks == 1
    assert modes.index(PREFETCH, changed_at) <= changed_at + 3 * DRIFT_WINDOW
    # Prefetching now: its time budget follows the cycles measured since.
    verdict = cut.verdict()
    expected = OVERRUN_FACTOR * verdict.cycles * slow.prefetch().seconds
    assert verdict.seconds == pytest.approx(expected)
    late = ModeDecision()
    modes = run(late, workload, changed_at + 2 * CHECK_GAP_MAX, bulk=True)
    assert modes.index(PREFETCH, changed_at) > changed_at + 3 * DRIFT_WINDOW


def test_a_compared_prefetch_decision_goes_through_every_phase_in_order() -> None:
    decision = ModeDecision()
    loop = GilConvoy(serial=6 * MS, short=4.5 * MS, long=4.5 * MS)
    verdict = decision.start_epoch(helper_processes=True)
    phases = [decision.phase]
    for _ in range(80):
        cycle = loop.prefetch() if verdict.mode == PREFETCH else loop.inline()
        verdict = decision.observe(cycle.report())
        if decision.phase is not phases[-1]:
            phases.append(decision.phase)
    assert phases == [Phase.PROBE, Phase.COMPARE, Phase.SETTLE, Phase.CONFIRM, Phase.STEADY]
    assert decision.decisions == 1
    assert verdict.mode == PREFETCH


def test_each_phase_asks_for_what_it_measures() -> None:
    decision = ModeDecision()
    assert decision.start_epoch(helper_processes=True) == (INLINE, 1, math.inf, False)
    probing = decision.observe(Cycles(INLINE, 0))  # the epoch's first batch: no cycle
    assert (decision.phase, probing.mode, probing.cycles, probing.measure) == (
        Phase.PROBE,
        PREFETCH,
        1,
        True,
    )
    tiny = Workload(step=0.0, produce=0.01 * MS, parallel=1.0)
    run(decision, lambda _: tiny, 40)
    steady = decision.verdict()
    assert decision.phase is Phase.STEADY
    assert (steady.mode, steady.measure) == (INLINE, False)
    assert steady.cycles > 1  # a run: the cycles that cannot reach a check


def test_a_change_of_the_workers_measures_both_modes_again() -> None:
    decision = ModeDecision()
    tiny = Workload(step=0.0, produce=0.01 * MS, parallel=1.0)
    run(decision, lambda _: tiny, 200)
    assert (decision.phase, decision.verdict().mode) == (Phase.STEADY, INLINE)
    # An elastic pool changed its count: the same cycles, no drift, but other workers.
    probing = decision.observe(Cycles(INLINE, 3, (0.01 * MS,) * 3, resized=True))
    assert (decision.phase, probing.mode, probing.measure) == (Phase.PROBE, PREFETCH, True)
    modes = run(decision, lambda _: tiny, 100, start=1)
    assert modes[1 : 1 + PREFETCH_PROBE] == [PREFETCH] * PREFETCH_PROBE
    assert modes[-50:] == [INLINE] * 50
    assert (decision.decisions, decision.rechecks, decision.resizes) == (2, 0, 1)
    assert decision.reason.endswith("; measured again once as the workers changed in number")


def test_a_change_of_the_workers_at_an_epochs_first_batch_is_not_lost() -> None:
    decision = ModeDecision()
    tiny = Workload(step=0.0, produce=0.01 * MS, parallel=1.0)
    run(decision, lambda _: tiny, 200)
    decision.start_epoch(helper_processes=True)
    # The pool changed between the epochs: told with the report of the first batch.
    probing = decision.observe(Cycles(INLINE, 0, resized=True))
    assert (decision.phase, probing.mode, decision.resizes) == (Phase.PROBE, PREFETCH, 1)


#: A loop after a change of the workers: both modes alike ...
ALIKE = Workload(step=2 * MS, produce=0.05 * MS, parallel=1.0)


def _inline_faster() -> Loop:
    """... or inline clearly faster."""
    return GilConvoy(serial=6 * MS, short=8 * MS, long=8 * MS)


@pytest.mark.parametrize(
    ("before", "after", "decided", "reason"),
    [
        (PREFETCH, lambda: ALIKE, PREFETCH, "prefetching went on, inline no faster: "),
        (PREFETCH, _inline_faster, INLINE, "prefetching did not pay: "),
        (INLINE, lambda: ALIKE, INLINE, "prefetching did not pay: "),
    ],
)
def test_a_change_of_the_workers_flips_the_mode_only_where_the_other_wins(
    before: Mode, after: Callable[[], Loop], decided: Mode, reason: str
) -> None:
    decision = ModeDecision()
    first = Workload(step=15 * MS, produce=15 * MS) if before == PREFETCH else ALIKE
    run(decision, lambda _: first, 60)
    assert decision.mode == before
    decision.observe(Cycles(before, 1, (2 * MS,), resized=True))
    loop = after()
    modes = run(decision, lambda _: loop, 120)
    assert decision.reason.startswith(reason), decision.reason
    assert decision.resizes == 1
    assert modes[-40:] == [decided] * 40
