"""When does a producer thread pay? The decision, from measured batch cycles only.

Pure logic, no clock and no thread: :class:`ModeChooser` is fed one :class:`Cycle` per
batch handed out (the consumer's time from one ``next()`` return to the next, measured by
the adaptive stream) and says which mode the next batch should be made in:

* ``"prefetch"``: a producer thread makes batches ahead, as the ``thread`` backend does;
* ``"inline"``: the consumer makes each batch itself, inside ``next()``, as ``DataLoader``.

How it decides, for a fresh loader:

1. The epoch's first batch is made inline: nothing could overlap it, and no thread is
   started before anything is known.
2. **Prefetch probe.** The next :data:`PREFETCH_PROBE` batches (more while their cycles
   add up to less than :data:`PROBE_SECONDS`, at most :data:`PROBE_MAX`) are prefetched.
   Each cycle is split into the consumer's wait inside ``next()`` and its step (the
   rest), and the producer reports the wall and CPU time of each ``next(source)``. If the
   mean cycle is clearly shorter than a lower bound of the inline cycle, prefetching wins
   without trying inline. The lower bound is ``step + produce - (CPU time of both
   threads)``: run one after the other, the two take at least their wall times, except
   for the time each spent waiting for the other to release the GIL, and that is at most
   the other's CPU time (unless another process preempts the thread holding the GIL).
   The bound is trusted when the consumer hardly waited (:data:`KEPT_UP`: the producer
   kept up), or when no helper process (DataLoader worker) can be making batches and
   both threads were mostly idle (:data:`MOSTLY_IDLE`: waiting on I/O, sleeps or a
   device, which a thread does overlap). Where workers may make batches, ``produce`` can
   be a wait for work they do during the step in either mode.
3. **Inline probe**, only otherwise. A batch made inline costs a little at most here,
   because prefetching did not clearly win. After :data:`INLINE_PROBE` inline cycles
   (:data:`INLINE_PROBE_MORE` when those differ by more than :data:`STEADY_SPREAD` or
   prefetching does not beat them by :data:`CLOSE_CALL`; more, by the rule above, when
   they are short), prefetching is kept only if its mean cycle beats the median inline
   cycle by more than :data:`TIE_MARGIN` and by more than the inline cycles' own spread
   (their interquartile range); otherwise inline, which is exactly ``DataLoader``.
4. **Confirmation**, only after step 3 chose prefetching: the mean of the first
   :data:`CONFIRM_AFTER` prefetched cycles is compared, as in step 3, with
   inline cycles made right after it; if it no longer wins, the loader goes inline.
   Both sides of this comparison are measured within a few batches of each other, so
   that a machine whose speed drifts (other jobs on it) moves both. Once confirmed, it
   is confirmed again, with the mean of the latest :data:`DRIFT_WINDOW` cycles, after
   :data:`FIRST_RECHECK_GAP` batches, then twice as many each time: the drift watch
   below only notices a change of 2x, and a decision that two noisy comparisons got
   wrong would otherwise stand as long as the cost holds.

Why the mean for prefetched cycles and the median for inline ones: throughput is the
mean, and two threads fighting for the GIL make prefetched cycles bimodal (a few
milliseconds while the buffer holds a batch, then one long wait for the GIL's switch
interval), so their median can be half their mean. Inline cycles are steady; their median
ignores the odd preemption by another process. Both choices lean towards inline, the
side on which the loader can never be slower than ``DataLoader``.

The decision is kept across epochs (a backend instance lives as long as its loader), and
re-checked when the cycle drifts: when the median of the last :data:`DRIFT_WINDOW` cycles
moves by more than :data:`DRIFT_FACTOR` (and :data:`DRIFT_MIN_SECONDS`), at two checks in
a row, from the median of the first full window after the decision (a new epoch with a
different cost, a change of step time). Checks are half a window apart, or
:data:`CHECK_SECONDS` of cycles apart where that is more (up to :data:`CHECK_GAP_MAX`
cycles, at the latest check's median): a drift is still seen within a fraction of a
second, and the cycles between two checks can be handed over at once. Should the cycles
grow meanwhile, a steady run that takes :data:`OVERRUN_FACTOR` times longer than that
median allows is cut short, and the next check comes within half a window. A re-check
runs steps 2-4 again, so that the two modes are measured next to each other in time: a
machine whose speed drifts (other jobs on it) then moves both alike.
Each re-check doubles the number of batches that must pass before the next one may
start, so a cost that keeps changing cannot make the modes oscillate. A re-check of an
inline decision already knows the new inline cycle (the window that drifted): its
prefetch probe stops after :data:`CLEAR_LOSS_AFTER` batches, and the loader stays
inline, when prefetching is :data:`CLEAR_LOSS` times slower than that.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Sequence
from typing import Final, Literal, NamedTuple, Protocol

__all__ = [
    "CHECK_GAP_MAX",
    "CHECK_SECONDS",
    "CLEAR_LOSS",
    "CLEAR_LOSS_AFTER",
    "CONFIRM_AFTER",
    "DRIFT_FACTOR",
    "DRIFT_WINDOW",
    "FIRST_RECHECK_GAP",
    "INLINE",
    "INLINE_PROBE",
    "INLINE_PROBE_MORE",
    "OVERRUN_FACTOR",
    "PREFETCH",
    "PREFETCH_PROBE",
    "STEADY_TAIL",
    "Cycle",
    "Mode",
    "ModeChooser",
    "ModePolicy",
]

Mode = Literal["prefetch", "inline"]
PREFETCH: Final = "prefetch"
INLINE: Final = "inline"

#: Prefetched cycles measured before deciding (at least): enough for their mean to span
#: a few rounds of the GIL's switch interval.
PREFETCH_PROBE: Final = 8
#: Inline cycles measured when prefetching did not clearly win (at least) ...
INLINE_PROBE: Final = 2
#: ... or this many when the comparison is close or those first ones were not steady:
#: a batch made inline costs nothing next to ``DataLoader``, and a close call needs more.
INLINE_PROBE_MORE: Final = 8
#: Inline cycles are steady when the longest is at most this fraction above the shortest.
STEADY_SPREAD: Final = 0.1
#: The comparison is close unless prefetching's mean cycle is this fraction shorter.
CLOSE_CALL: Final = 0.15
#: A probe also goes on until its cycles add up to this many seconds, so that short,
#: noisy cycles are judged on more of them; a batch costs little there ...
PROBE_SECONDS: Final = 0.003
#: ... up to this many cycles (for batches of microseconds, the probe's cost is the
#: hand-off of these few batches).
PROBE_MAX: Final = 16
#: Prefetching clearly wins when its cycle is at most this fraction of the inline bound.
CLEAR_WIN: Final = 0.9
#: ... and the consumer waited at most this fraction of the cycle (the producer kept up)
#: ...
KEPT_UP: Final = 0.25
#: ... or, where no helper process can make batches, both threads together used the CPU
#: for at most this fraction of the cycle: the rest was I/O, sleeps or device waits.
#: (Another process that preempts a thread holding the GIL stretches the other
#: thread's wait for it beyond that CPU time, so a busy GIL-bound loop on a loaded
#: machine could otherwise pass for an overlap.)
MOSTLY_IDLE: Final = 0.5
#: Prefetching must beat a measured inline cycle by this fraction; ties go to inline.
TIE_MARGIN: Final = 0.03
#: Cycles in the window whose median is watched for drift (checked every half window):
#: enough that batches from worker processes, which arrive in bursts, keep a steady median.
DRIFT_WINDOW: Final = 32
#: The latest cycles of a steady run the policy needs (see ``ModePolicy.observe_steady``).
STEADY_TAIL: Final = DRIFT_WINDOW
#: The window's median is checked every half window, or less often where cycles are short:
#: every this many seconds of cycles (at the median of the check before) ...
CHECK_SECONDS: Final = 0.05
#: ... but at least every this many cycles. Long steady inline runs are what make a
#: batch of microseconds cost no more than ``DataLoader``'s: the cycles between two
#: checks can reach the policy in one bulk (see :meth:`ModePolicy.steady_cycles`).
CHECK_GAP_MAX: Final = 1024
#: A steady run of ``n`` cycles is cut short once it took this many times ``n`` cycles of
#: the latest check's median: checks spaced for short cycles would otherwise come late
#: after the cost per batch went up. (Generous: a burst of batches from worker
#: processes makes the mean cycle several times the median.)
OVERRUN_FACTOR: Final = 4.0
#: A re-check starts when the window's median changes by more than this factor, at two
#: checks in a row: worker processes deliver batches in bursts.
DRIFT_FACTOR: Final = 2.0
#: ... and by more than this many seconds: about what starting and stopping a producer
#: thread costs, so a smaller drift cannot pay for a re-check.
DRIFT_MIN_SECONDS: Final = 0.0002
#: Prefetched cycles whose mean a compared prefetch decision is confirmed with.
CONFIRM_AFTER: Final = 16
#: Batches that must pass after the first decision before a re-check may start.
FIRST_RECHECK_GAP: Final = 4 * DRIFT_WINDOW
#: A re-check of an inline decision stops prefetching after this many prefetched cycles
#: ...
CLEAR_LOSS_AFTER: Final = 4
#: ... when their mean is this many times the inline cycle that drifted: no margin of
#: the comparison could make up for it, and every further prefetched batch costs that.
CLEAR_LOSS: Final = 1.5


class Cycle(NamedTuple):
    """One batch as the consumer saw it; seconds.

    ``mode`` is how the batch was made, or ``None`` for a batch left in the buffer by a
    producer that was asked to stop (it says nothing about either mode). ``cpu`` is the
    consumer thread's CPU time in the cycle and ``produced`` the ``(wall, cpu)`` of each
    ``next(source)`` the producer thread finished since the previous cycle; both are only
    required while :attr:`ModePolicy.probing`.
    """

    mode: Mode | None
    seconds: float
    wait: float
    cpu: float = 0.0
    produced: Sequence[tuple[float, float]] = ()


class ModePolicy(Protocol):
    """What the adaptive stream asks of a decision policy."""

    @property
    def wanted(self) -> Mode:
        """The mode the next batch should be made in."""

    @property
    def probing(self) -> bool:
        """Whether CPU times and producer timings are needed for the coming cycles."""

    @property
    def reason(self) -> str:
        """Why the current mode was chosen, in a few words."""

    def start_epoch(self, *, helper_processes: bool = True) -> None:
        """A new epoch starts (its first batch is requested next).

        ``helper_processes``: whether other processes (DataLoader workers) may be making
        batches while the consumer steps, as they do in either mode.
        """

    def observe(self, cycle: Cycle) -> None:
        """Account for one batch handed out."""

    def steady_cycles(self) -> int:
        """How many coming cycles :meth:`observe_steady` may take at once (0: none).

        Only asked while the mode is ``wanted`` and nothing is probed. If the next ``n``
        cycles are all made in that mode, the first ``n - 1`` of them cannot change
        ``wanted``, ``probing`` or this answer, so they may be handed over in bulk.
        """

    def observe_steady(self, count: int, latest: Sequence[float]) -> None:
        """Account for ``count`` cycles made in the wanted mode, at most
        :meth:`steady_cycles`; ``latest`` are the seconds of the last of them (all of
        them, or at least the last :data:`STEADY_TAIL`).

        The effect is that of :meth:`observe` with a ``Cycle(wanted, s, ...)`` for each.
        """

    def steady_seconds(self, cycles: int) -> float:
        """The most seconds ``cycles`` steady cycles should take (``math.inf``: no bound).

        A steady run that takes longer is cut short there, its cycles handed over, and
        :meth:`steady_overran` called: the cost per batch went up while the run lasted.
        """

    def steady_overran(self) -> None:
        """A steady run took longer than :meth:`steady_seconds` allowed."""


def _enough(cycles: Sequence[object], least: int, seconds: float) -> bool:
    count = len(cycles)
    return count >= PROBE_MAX or (count >= least and seconds >= PROBE_SECONDS)


def _spread(cycles: Sequence[float]) -> float:
    """How far apart the middle half of ``cycles`` lies, as a fraction of their median."""
    ordered = sorted(cycles)
    quarter = len(ordered) // 4
    middle = ordered[quarter : len(ordered) - quarter]
    return (middle[-1] - middle[0]) / statistics.median(ordered)


def _check_gap(median: float) -> int:
    """Cycles from one drift check to the next, after one that found ``median``."""
    half = DRIFT_WINDOW // 2
    if median <= CHECK_SECONDS / CHECK_GAP_MAX:
        return CHECK_GAP_MAX
    return max(half, min(CHECK_GAP_MAX, int(CHECK_SECONDS / median)))


def _ms(seconds: float) -> str:
    return f"{1000 * seconds:.3g} ms"


class ModeChooser:
    """The measured decision described in this module's docstring."""

    def __init__(self) -> None:
        self._mode: Mode = INLINE
        self._decided = False
        self._reason = "deciding: measuring the first batches"
        #: "prefetch" or "inline" while probing that mode, None once decided.
        self._probe: Mode | None = None
        self._first_of_epoch = True
        self._prefetched: list[Cycle] = []
        self._prefetch_seconds = 0.0
        self._produced: list[tuple[float, float]] = []
        self._inline: list[float] = []
        self._window: deque[float] = deque(maxlen=DRIFT_WINDOW)
        #: Median cycle of the first full window after a decision: the steady state.
        self._reference: float | None = None
        #: Mean prefetched cycle the inline probe is compared with.
        self._prefetch_mean = 0.0
        #: A compared prefetch decision whose first settled window is still to be
        #: confirmed against inline cycles made right after it ...
        self._unconfirmed = False
        #: ... and the inline probe of that confirmation is running.
        self._confirming = False
        #: Once confirmed, it is confirmed again when this many batches have passed since
        #: (each time twice as many): the drift watch only notices a change of 2x.
        self._reconfirm_at: int | None = None
        self._reconfirm_gap = FIRST_RECHECK_GAP
        #: During a re-check of an inline decision: the median inline cycle that drifted.
        self._drifted_inline: float | None = None
        self._gap = FIRST_RECHECK_GAP
        #: The drift window's median is checked once ``_since_decision`` reaches this ...
        self._next_check = DRIFT_WINDOW // 2
        #: ... and was this at the latest check (in the mode decided).
        self._check_median: float | None = None
        #: Whether worker processes may make this epoch's batches (see ``start_epoch``).
        self._helper_processes = True
        self._drifted = False
        self._since_decision = 0
        #: How many decisions were taken (the first one included).
        self.decisions = 0
        #: How many re-checks drift started.
        self.rechecks = 0

    @property
    def wanted(self) -> Mode:
        if self._first_of_epoch:
            return INLINE
        if self._probe is not None:
            return self._probe
        return self._mode

    @property
    def probing(self) -> bool:
        return self._probe == PREFETCH and not self._first_of_epoch

    @property
    def reason(self) -> str:
        if not self.rechecks:
            return self._reason
        times = "once" if self.rechecks == 1 else f"{self.rechecks} times"
        return f"{self._reason}; re-checked {times} as the cost per batch drifted"

    def start_epoch(self, *, helper_processes: bool = True) -> None:
        self._helper_processes = helper_processes
        self._first_of_epoch = True
        self._window.clear()
        if not self._decided and self._probe is None:
            self._probe = PREFETCH

    def observe(self, cycle: Cycle) -> None:
        if self._first_of_epoch:
            # The epoch's first batch was made inline; no cycle ends with it.
            self._first_of_epoch = False
            if not self._decided and self._probe is None:
                self._probe = PREFETCH
            return
        if cycle.mode is None:
            return
        if self._probe is not None:
            self._observe_probe(cycle)
        elif cycle.mode == self._mode:
            self._watch_drift(cycle.seconds)

    def steady_cycles(self) -> int:
        if self._first_of_epoch or self._probe is not None:
            return 0
        since = self._since_decision
        if self._unconfirmed:
            return CONFIRM_AFTER - since
        # The next drift check, or the next re-confirmation if that comes first.
        quiet = max(self._next_check - since, DRIFT_WINDOW - len(self._window), 1)
        again = self._reconfirm_at
        if again is not None:
            quiet = min(quiet, max(again - since, DRIFT_WINDOW - len(self._window)))
        return quiet

    def steady_seconds(self, cycles: int) -> float:
        median = self._check_median
        return math.inf if median is None else OVERRUN_FACTOR * cycles * median

    def steady_overran(self) -> None:
        # Checks were spaced for the short cycles of before: look again soon.
        self._next_check = min(self._next_check, self._since_decision + DRIFT_WINDOW // 2)

    def observe_steady(self, count: int, latest: Sequence[float]) -> None:
        if not latest:
            # Cycles whose times are unknown (a run cut short): counted, not watched.
            self._since_decision += count
            return
        # None of these but the last can reach a check (see ``steady_cycles``), and the
        # window only keeps the latest.
        self._since_decision += count - 1
        self._window.extend(latest[:-1])
        self._watch_drift(latest[-1])

    def _observe_probe(self, cycle: Cycle) -> None:
        if cycle.mode != self._probe:
            return
        if cycle.mode == PREFETCH:
            self._prefetched.append(cycle)
            self._produced.extend(cycle.produced)
            self._prefetch_seconds += cycle.seconds
            if self._clearly_lost():
                return
            if _enough(self._prefetched, PREFETCH_PROBE, self._prefetch_seconds):
                self._after_prefetch_probe()
        else:
            inline = self._inline
            inline.append(cycle.seconds)
            median = statistics.median(inline)
            clear = max(inline) <= (1 + STEADY_SPREAD) * min(inline) and (
                self._prefetch_mean <= (1 - CLOSE_CALL) * median
            )
            least = INLINE_PROBE if clear else INLINE_PROBE_MORE
            if _enough(inline, least, sum(inline)):
                self._compare(median, _spread(inline))

    def _clearly_lost(self) -> bool:
        """End a re-check's prefetch probe early if it is far slower than inline was."""
        inline = self._drifted_inline
        count = len(self._prefetched)
        if inline is None or count < CLEAR_LOSS_AFTER:
            return False
        prefetch = self._prefetch_seconds / count
        if prefetch <= CLEAR_LOSS * inline:
            return False
        self._decide(
            INLINE,
            f"prefetching was clearly slower: {_ms(prefetch)} per batch with a producer "
            f"thread, {_ms(inline)} made inline",
        )
        return True

    def _after_prefetch_probe(self) -> None:
        cycles = self._prefetched
        seconds = self._prefetch_seconds / len(cycles)
        wait = statistics.fmean(c.wait for c in cycles)
        if self._produced:
            step = seconds - wait
            step_cpu = statistics.fmean(c.cpu for c in cycles)
            produce = statistics.fmean(wall for wall, _ in self._produced)
            produce_cpu = statistics.fmean(cpu for _, cpu in self._produced)
            bound = step + produce - step_cpu - produce_cpu
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
        self._prefetch_mean = seconds
        self._probe = INLINE

    def _compare(self, inline: float, spread: float) -> None:
        prefetch = self._prefetch_mean
        pays = prefetch < (1 - max(TIE_MARGIN, spread)) * inline
        if self._confirming:
            self._confirming = False
            if pays:  # confirmed: prefetching goes on, as decided
                self._probe = None
                self._inline = []
                self._reconfirm_at = self._reconfirm_gap
                self._reconfirm_gap *= 2
            else:
                self._decide(
                    INLINE,
                    f"prefetching did not pay once settled: {_ms(prefetch)} per batch "
                    f"with a producer thread, {_ms(inline)} made inline",
                )
        elif pays:
            self._decide(
                PREFETCH,
                f"prefetching paid: {_ms(prefetch)} per batch, {_ms(inline)} made inline",
            )
            self._unconfirmed = True
        else:
            self._decide(
                INLINE,
                f"prefetching did not pay: {_ms(prefetch)} per batch with a producer "
                f"thread, {_ms(inline)} made inline",
            )

    def _decide(self, mode: Mode, reason: str) -> None:
        self._mode = mode
        self._reason = reason
        self._reference = None
        self._unconfirmed = False
        self._confirming = False
        self._reconfirm_at = None
        self._prefetch_seconds = 0.0
        self._decided = True
        self._probe = None
        self._prefetched = []
        self._produced = []
        self._inline = []
        self._window.clear()
        self._since_decision = 0
        self._next_check = DRIFT_WINDOW // 2
        self._check_median = None
        self._drifted = False
        self._drifted_inline = None
        self.decisions += 1

    def _start_confirmation(self, settled: float) -> None:
        """Compare the settled prefetched cycle with inline cycles made right now."""
        self._unconfirmed = False
        self._confirming = True
        self._prefetch_mean = settled
        self._inline = []
        self._window.clear()
        self._since_decision = 0
        self._next_check = DRIFT_WINDOW // 2
        self._check_median = None
        self._probe = INLINE

    def _watch_drift(self, seconds: float) -> None:
        self._since_decision += 1
        window = self._window
        window.append(seconds)
        since = self._since_decision
        if self._unconfirmed:
            # Measured once it settled, not during the probe; confirmed soon, since until
            # then a wrong decision costs every batch.
            if since == CONFIRM_AFTER:
                self._start_confirmation(statistics.fmean(window))
            return
        again = self._reconfirm_at
        if again is not None and since >= again and len(window) == DRIFT_WINDOW:
            self._reconfirm_at = None
            self._start_confirmation(statistics.fmean(window))
            return
        if since < self._next_check or len(window) < DRIFT_WINDOW:
            return
        median = statistics.median(window)
        self._next_check = since + _check_gap(median)
        self._check_median = median
        reference = self._reference
        if reference is None:
            # Measured in the chosen mode once it settled, not during the probe (a
            # worker queue filled while prefetching makes the first inline batches fast).
            self._reference = median
            return
        if since < self._gap:
            return
        if abs(median - reference) <= DRIFT_MIN_SECONDS or (
            reference / DRIFT_FACTOR <= median <= reference * DRIFT_FACTOR
        ):
            self._drifted = False
            return
        if not self._drifted:
            self._drifted = True  # confirmed, or not, at the next check
            return
        self._drifted = False
        self._gap *= 2
        self.rechecks += 1
        self._drifted_inline = median if self._mode == INLINE else None
        self._window.clear()
        self._probe = PREFETCH
