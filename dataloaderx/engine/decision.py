"""When does a producer thread pay? Decided from measured cycles only, with no clock or thread
(``docs/design.md``, *The mode decision*); each constant below says what it weighs."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import Final

from dataloaderx.contracts.policy import INLINE, PREFETCH, Cycles, Mode, Verdict
from dataloaderx.engine.phases import (
    CONFIRM_AFTER,
    DRIFT_WINDOW,
    Compare,
    Phase,
    Probe,
    Watch,
    enough,
    spread,
)

#: Prefetched cycles measured before deciding (at least): their mean spans a few GIL switches.
PREFETCH_PROBE: Final = 8
#: Inline cycles measured when prefetching did not clearly win (at least) ...
INLINE_PROBE: Final = 2
#: ... or this many when the comparison is close or those first ones were not steady.
INLINE_PROBE_MORE: Final = 8
#: Inline cycles are steady when the longest is at most this fraction above the shortest.
STEADY_SPREAD: Final = 0.1
#: The comparison is close unless prefetching's mean cycle is this fraction shorter.
CLOSE_CALL: Final = 0.15
#: Prefetching clearly wins when its cycle is at most this fraction of the inline bound ...
CLEAR_WIN: Final = 0.9
#: ... and the loop waited at most this fraction of the cycle, or ...
KEPT_UP: Final = 0.25
#: ... without helper processes, both threads used the CPU for at most this fraction.
MOSTLY_IDLE: Final = 0.5
#: Prefetching must beat a measured inline cycle by this fraction; ties go to inline.
TIE_MARGIN: Final = 0.03
#: A run is reported early once it took this many times its cycles at the latest check's
#: median (generous: a burst of batches from workers lifts the mean well above it).
OVERRUN_FACTOR: Final = 4.0
#: A re-check starts when the window's median moves by more than this factor at two checks
#: in a row (workers deliver batches in bursts) ...
DRIFT_FACTOR: Final = 2.0
#: ... and by more than this many seconds: about what starting and stopping a producer costs.
DRIFT_MIN_SECONDS: Final = 0.0002
#: Batches that must pass after the first decision before a re-check (or re-confirmation).
FIRST_RECHECK_GAP: Final = 4 * DRIFT_WINDOW
#: A re-check of an inline decision stops prefetching after this many prefetched cycles if
#: their mean is ``CLEAR_LOSS`` times the inline cycle that drifted.
CLEAR_LOSS_AFTER: Final = 4
CLEAR_LOSS: Final = 1.5

_FIRST_BATCH: Final = Verdict(INLINE, 1, math.inf, measure=False)
_PROBING: Final = Verdict(PREFETCH, 1, math.inf, measure=True)
_COMPARING: Final = Verdict(INLINE, 1, math.inf, measure=False)


def _ms(seconds: float) -> str:
    return f"{1000 * seconds:.3g} ms"


def _times(count: int) -> str:
    return "once" if count == 1 else f"{count} times"


def new_policy() -> ModeDecision:
    """The policy a backend creates once and keeps for its loader's life."""
    return ModeDecision()


class ModeDecision:
    """Told of the loop's cycles, answers each with a ``Verdict``, moving through the phases."""

    def __init__(self) -> None:
        #: The mode decided (inline until the first decision).
        self.mode: Mode = INLINE
        self._reason = "deciding: measuring the first batches"
        self._state: Probe | Compare | Watch = Probe()
        #: The epoch's first batch is next (it ends no cycle).
        self._first = True
        self._helper_processes = True
        #: Batches that must pass after a decision before a drift may start a re-check,
        #: and before a confirmed prefetch decision is confirmed again; each doubles.
        self._recheck_gap = FIRST_RECHECK_GAP
        self._reconfirm_gap = FIRST_RECHECK_GAP
        #: How many decisions were taken (the first one included), re-checks started, and
        #: decisions started over as the workers changed in number.
        self.decisions = 0
        self.rechecks = 0
        self.resizes = 0

    @property
    def phase(self) -> Phase:
        return self._state.phase

    @property
    def reason(self) -> str:
        reason = self._reason
        if self.rechecks:
            reason += f"; re-checked {_times(self.rechecks)} as the cost per batch drifted"
        if self.resizes:
            reason += f"; measured again {_times(self.resizes)} as the workers changed in number"
        return reason

    def start_epoch(self, *, helper_processes: bool) -> Verdict:
        self._helper_processes = helper_processes
        self._first = True
        if isinstance(self._state, Watch):
            self._state.window.clear()
        return _FIRST_BATCH

    def verdict(self) -> Verdict:
        """The coming cycles' verdict: the one place that says when the next check falls due."""
        state = self._state
        if self._first:
            return _FIRST_BATCH
        if isinstance(state, Probe):
            return _PROBING
        if isinstance(state, Compare):
            return _COMPARING
        cycles = state.quiet()
        seconds = math.inf if state.median is None else OVERRUN_FACTOR * cycles * state.median
        return Verdict(self.mode, cycles, seconds, measure=False)

    def observe(self, cycles: Cycles) -> Verdict:
        first, self._first = self._first, False
        if cycles.resized:
            # Both modes were measured, or watched, on other workers: measure them again.
            self.resizes += 1
            self._state = Probe(prefetching=self.mode == PREFETCH)
        elif not first and cycles.mode == self.verdict().mode:
            state = self._state
            if isinstance(state, Probe):
                self._probed(state, cycles)
            elif isinstance(state, Compare):
                self._compared(state, cycles.seconds)
            else:
                self._watched(state, cycles)
        return self.verdict()

    def _probed(self, state: Probe, cycles: Cycles) -> None:
        if not cycles.seconds:
            return
        state.seconds.extend(cycles.seconds)
        state.wait += cycles.wait
        state.cpu += cycles.cpu
        state.produced.extend(cycles.produced)
        count = len(state.seconds)
        mean = sum(state.seconds) / count
        inline = state.drifted_inline
        if inline is not None and count >= CLEAR_LOSS_AFTER and mean > CLEAR_LOSS * inline:
            self._decide(
                INLINE,
                f"prefetching was clearly slower: {_ms(mean)} per batch with a producer "
                f"thread, {_ms(inline)} made inline",
            )
        elif enough(state.seconds, PREFETCH_PROBE):
            self._after_probe(state, mean)

    def _after_probe(self, state: Probe, seconds: float) -> None:
        count = len(state.seconds)
        wait = state.wait / count
        if state.produced:
            step_cpu = state.cpu / count
            produce = statistics.fmean(wall for wall, _ in state.produced)
            produce_cpu = statistics.fmean(cpu for _, cpu in state.produced)
            bound = seconds - wait + produce - step_cpu - produce_cpu
            trusted = wait <= KEPT_UP * seconds or (
                not self._helper_processes and step_cpu + produce_cpu <= MOSTLY_IDLE * seconds
            )
            if trusted and seconds <= CLEAR_WIN * bound:
                self._decide(
                    PREFETCH,
                    f"making batches overlapped the step: {_ms(seconds)} per batch, "
                    f"at least {_ms(bound)} one after the other",
                )
                return
        self._state = Compare(Phase.COMPARE, prefetch=seconds, prefetching=state.prefetching)

    def _compared(self, state: Compare, seconds: Sequence[float]) -> None:
        inline = state.inline
        inline.extend(seconds)
        if not inline:
            return
        median = statistics.median(inline)
        clear = max(inline) <= (1 + STEADY_SPREAD) * min(inline) and (
            state.prefetch <= (1 - CLOSE_CALL) * median
        )
        if not enough(inline, INLINE_PROBE if clear else INLINE_PROBE_MORE):
            return
        prefetch = state.prefetch
        margin = 1 - max(TIE_MARGIN, spread(inline))
        pays = prefetch < margin * median
        figures = f"{_ms(prefetch)} per batch with a producer thread, {_ms(median)} made inline"
        if state.phase is Phase.CONFIRM:
            if pays:  # confirmed: prefetching goes on, as decided
                self._state = Watch(
                    Phase.STEADY, reference=state.reference, reconfirm_at=self._reconfirm_gap
                )
                self._reconfirm_gap *= 2
            else:
                self._decide(INLINE, f"prefetching did not pay once settled: {figures}")
        elif pays:
            self._decide(
                PREFETCH,
                f"prefetching paid: {_ms(prefetch)} per batch, {_ms(median)} made inline",
                settle=True,
            )
        elif state.prefetching and median >= margin * prefetch:
            # Measured alike: a change of the workers does not flip the mode on noise.
            self._decide(PREFETCH, f"prefetching went on, inline no faster: {figures}")
        else:
            self._decide(INLINE, f"prefetching did not pay: {figures}")

    def _decide(self, mode: Mode, reason: str, *, settle: bool = False) -> None:
        self.mode = mode
        self._reason = reason
        self.decisions += 1
        self._state = Watch(Phase.SETTLE if settle else Phase.STEADY)

    def _watched(self, state: Watch, cycles: Cycles) -> None:
        seconds = cycles.seconds
        if not seconds:
            # Cycles whose times are unknown (a run cut short): counted, not watched.
            state.since += cycles.number
            return
        # Only the last can reach a check (see ``Watch.quiet``); the window keeps the latest.
        state.since += cycles.number - 1
        state.window.extend(seconds[:-1])
        self._watch(state, seconds[-1])
        if cycles.overran and self._state is state:
            # Checks were spaced for the shorter cycles of before: look again soon.
            state.next_check = min(state.next_check, state.since + DRIFT_WINDOW // 2)

    def _watch(self, state: Watch, seconds: float) -> None:
        state.since += 1
        window = state.window
        window.append(seconds)
        since = state.since
        if state.phase is Phase.SETTLE:
            # Measured once settled, not in the probe; confirmed soon, as a wrong decision
            # costs every batch until then.
            if since >= CONFIRM_AFTER:
                self._state = Compare(Phase.CONFIRM, statistics.fmean(window))
            return
        again = state.reconfirm_at
        if again is not None and since >= again and len(window) == DRIFT_WINDOW:
            self._state = Compare(Phase.CONFIRM, statistics.fmean(window), state.reference)
            return
        if since < state.next_check or len(window) < DRIFT_WINDOW:
            return
        median = statistics.median(window)
        state.schedule_check(median)
        reference = state.reference
        if reference is None:
            # Measured in the chosen mode once settled, not in the probe (a worker queue
            # filled while prefetching makes the first inline batches fast).
            state.reference = median
            return
        if since < self._recheck_gap:
            return
        if abs(median - reference) <= DRIFT_MIN_SECONDS or (
            reference / DRIFT_FACTOR <= median <= reference * DRIFT_FACTOR
        ):
            state.drifted = False
        elif not state.drifted:
            state.drifted = True  # confirmed, or not, at the next check
        else:
            self._recheck_gap *= 2
            self.rechecks += 1
            self._state = Probe(drifted_inline=median if self.mode == INLINE else None)
