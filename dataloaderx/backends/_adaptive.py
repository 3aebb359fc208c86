"""A stream that prefetches in a producer thread only while that pays.

:func:`start_adaptive_stream` is a drop-in for
:func:`~dataloaderx.backends._engine.start_thread_stream`: same source, same keyword hooks
(``prepare`` and ``on_start`` in the producer thread, ``handout`` in the consumer's
thread), same envelopes, errors, warnings and shutdown. A :class:`ModePolicy` (by default
the measured :class:`~dataloaderx.backends._mode_decision.ModeChooser`) says, batch by
batch, whether the next batch is made

* **prefetched**: by a producer thread from :func:`start_thread_stream`, unchanged; or
* **inline**: in the consumer's thread inside ``next()``: ``next(source)``, then
  ``inline_prepare``, then ``handout``, as ``DataLoader`` itself does.

``on_start`` runs at the start of every producer thread and never inline: it prepares a
thread (a CUDA backend selects its device there, which must not change the training
thread's current device). ``inline_prepare`` defaults to ``prepare``; a backend passes
its own where ``prepare`` relies on ``on_start`` or on its thread (for example a device
copy that must run with the right device selected and on a side stream).

Switching protocol (details and shutdown in ``docs/design.md``):

* **prefetch -> inline.** The source is wrapped in :class:`_PausableSource`, which the
  producer calls before each ``next(source)``. The consumer sets its ``pause`` flag; the
  producer finishes and delivers the batch it is making, then its next call raises
  :class:`_Paused`, which travels as the last envelope and ends the thread. The consumer
  hands out what was buffered before it, in order, then goes on inline from exactly the
  batch the producer did not start. No batch is lost or repeated.
* **inline -> prefetch.** A new producer thread is started on the same source.

Timing costs two ``perf_counter()`` calls per batch; CPU times and producer timings are
taken only while the policy probes, so the decision works with ``stats`` off too. In a
steady inline run (:meth:`ModePolicy.steady_cycles`) a batch costs one ``perf_counter()``:
the cycles go to the policy in bulk, at the points where they could change its decision
(the latest :data:`~dataloaderx.backends._mode_decision.STEADY_TAIL` of them, which is
all it needs, and how many), at the end of the epoch, and when the run takes longer
than :meth:`ModePolicy.steady_seconds` allows. The iterator may take such a run's
batches straight from the source (:meth:`AdaptiveStream.direct`), and this stream then
accounts for them when the run ends, as for batches it made itself.
"""

from __future__ import annotations

import enum
import math
import multiprocessing
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from itertools import chain
from operator import sub
from time import perf_counter, thread_time
from typing import Any, Final, Generic, TypeVar

from dataloaderx._direct import Direct, DirectRun, direct_of, narrowed
from dataloaderx.backends._depth_control import BufferUsage, fixed_usage
from dataloaderx.backends._depth_options import DepthSpec
from dataloaderx.backends._engine import ThreadedStream, start_thread_stream
from dataloaderx.backends._mode_decision import (
    INLINE,
    PREFETCH,
    STEADY_TAIL,
    Cycle,
    Mode,
    ModeChooser,
    ModePolicy,
)

__all__ = ["AdaptiveStream", "ModeLog", "new_policy", "start_adaptive_stream"]

T = TypeVar("T")


class _Default(enum.Enum):
    SAME_AS_PREPARE = enum.auto()


#: ``inline_prepare`` default: the same function as ``prepare``.
SAME_AS_PREPARE: Final = _Default.SAME_AS_PREPARE


def new_policy() -> ModePolicy:
    """The policy a backend creates once and keeps for its loader's life."""
    return ModeChooser()


class _Paused(BaseException):
    """Ends a producer thread at a batch boundary (never reaches the training loop)."""


class _PausableSource(Generic[T]):
    """The source as the producer thread sees it: it can be asked to stop between batches."""

    def __init__(self, source: Iterator[T]) -> None:
        self._source = source
        #: Set by the consumer; read by the producer before each ``next(source)``.
        self.pause = False
        #: Whether to time each ``next(source)`` into :attr:`produced`.
        self.timing = False
        self.produced: deque[tuple[float, float]] = deque()

    def __iter__(self) -> _PausableSource[T]:
        return self

    def __next__(self) -> T:
        if self.pause:
            raise _Paused
        if not self.timing:
            return next(self._source)
        start = perf_counter()
        cpu = thread_time()
        try:
            return next(self._source)
        finally:
            self.produced.append((perf_counter() - start, thread_time() - cpu))

    def take_produced(self) -> tuple[tuple[float, float], ...]:
        produced = self.produced
        taken = []
        while produced:
            taken.append(produced.popleft())
        return tuple(taken)


class ModeLog:
    """Which mode made how many batches this epoch, and why the policy chose it."""

    __slots__ = ("counts", "mode", "policy")

    def __init__(self, policy: ModePolicy) -> None:
        self.counts: dict[str, int] = {PREFETCH: 0, INLINE: 0}
        self.mode: str | None = None
        self.policy = policy

    def line(self) -> str:
        """One line, for example ``inline (prefetching did not pay: ...); 6 of 500 ...``."""
        if self.mode is None:
            return "no batch made yet"
        total = sum(self.counts.values())
        prefetched = self.counts[PREFETCH]
        return f"{self.mode} ({self.policy.reason}); {prefetched} of {total} batches prefetched"


class AdaptiveStream(Generic[T]):
    """One epoch whose batches are prefetched or made inline, as the policy says."""

    def __init__(
        self,
        source: Iterator[Any],
        *,
        policy: ModePolicy,
        start_thread: Callable[[Iterator[Any]], ThreadedStream[T]],
        inline_prepare: Callable[[Any], Any] | None,
        handout: Callable[[Any], T] | None,
    ) -> None:
        self._source: _PausableSource[Any] = _PausableSource(source)
        self._policy = policy
        self._start_thread = start_thread
        self._inline_prepare = inline_prepare
        self._handout = handout
        self._threaded: ThreadedStream[T] | None = None
        self._finished = False
        self._closed = False
        self._last_end: float | None = None
        self._last_cpu = 0.0
        self._first = True
        self._latest_usage: Callable[[], BufferUsage] | None = None
        #: The policy's ``probing`` as of the last batch (the source is timed while true).
        self._probing = False
        #: Cycles left in the current steady inline run (0: none runs) ...
        self._steady_left = 0
        #: ... and how many of its cycles were not yet handed to the policy, the latest of
        #: them kept (all the policy needs of them).
        self._steady_count = 0
        self._steady: deque[float] = deque(maxlen=STEADY_TAIL)
        #: When the steady run should be over by (``perf_counter``), at the latest.
        self._steady_deadline = math.inf
        #: The source without the pause check, which only a producer thread needs.
        self._direct = source
        self.mode_log = ModeLog(policy)
        # Worker processes already exist here: the iterator this reads from was made.
        policy.start_epoch(helper_processes=bool(multiprocessing.active_children()))
        self._follow_policy()

    def __iter__(self) -> AdaptiveStream[T]:
        return self

    @property
    def mode(self) -> Mode:
        """How the next batch will be made (``"prefetch"`` while a producer runs)."""
        return INLINE if self._threaded is None else PREFETCH

    def buffered(self) -> int:
        """Batches ready in the producer's buffer (0 inline)."""
        threaded = self._threaded
        return 0 if threaded is None else threaded.buffered()

    def buffer_usage(self) -> BufferUsage:
        """The latest producer's buffer depths and peak bytes (all 0 while only inline)."""
        usage = self._latest_usage
        return fixed_usage(0, 0) if usage is None else usage()

    def __next__(self) -> T:
        if self._steady_left:
            return self._next_steady()
        if self._finished:
            raise StopIteration
        start = perf_counter()
        try:
            batch, mode = self._next_batch()
        except StopIteration:
            self._finished = True
            self.close()
            raise
        except BaseException:
            # A failed batch ends no cycle. Nothing is closed here: after an error the
            # loop may go on, and a KeyboardInterrupt must reach it without waiting.
            self._last_end = None
            raise
        end = perf_counter()
        self._account(mode, start, end)
        return batch

    def _next_steady(self) -> T:
        """A batch of a steady inline run: made as inline, its cycle kept for the policy."""
        try:
            item = next(self._direct)
            if self._inline_prepare is not None:
                item = self._inline_prepare(item)
            batch = item if self._handout is None else self._handout(item)
        except StopIteration:
            self._finished = True
            self._hand_over_steady()
            self.close()
            raise
        except BaseException:
            self._last_end = None  # as in __next__: a failed batch ends no cycle
            raise
        self._made_steady(1, (perf_counter(),))
        return batch

    def direct(self, run: DirectRun) -> Direct | None:
        """The rest of a steady inline run, for the loop to take straight from the
        source (see :mod:`dataloaderx._direct`); none while anything else runs."""
        if not self._steady_left or self._inline_prepare is not None or self._handout is not None:
            return None

        def settle() -> None:
            self._made_steady(run.taken(), run.latest_ends())

        found = narrowed(direct_of(self._direct, run), self._steady_left, settle)
        if found is not None:
            run.deadline = min(run.deadline, self._steady_deadline)
        return found

    def _made_steady(self, count: int, ends: Sequence[float]) -> None:
        """Account for ``count`` batches of a steady inline run, the last of them in hand
        at the times ``ends`` (all of them, or at least the last ``STEADY_TAIL + 1``): each
        ends a cycle (but the first after a failure), kept for the policy until the run
        is over."""
        self.mode_log.counts[INLINE] += count
        if self._closed or not count:
            return  # as in close(): the cycles of an unfinished run are dropped
        last = self._last_end
        if last is not None and len(ends) == count:  # the first cycle starts at ``last``
            self._steady.extend(map(sub, ends, chain((last,), ends)))
        else:
            self._steady.extend(map(sub, ends[1:], ends))
        cycles = count if last is not None else count - 1
        self._steady_count += cycles
        self._steady_left -= cycles
        # Unknown when a run stopped before its last batches (an error, or close()).
        last = self._last_end = ends[-1] if ends else None
        overran = last is not None and last > self._steady_deadline
        if not self._steady_left or overran:
            self._hand_over_steady()
            if overran:
                self._policy.steady_overran()
            self._follow_policy()

    def _hand_over_steady(self) -> None:
        self._steady_left = 0
        count = self._steady_count
        if count:
            self._steady_count = 0
            latest = list(self._steady)
            self._steady.clear()
            self._policy.observe_steady(count, latest)

    def _next_batch(self) -> tuple[T, Mode | None]:
        threaded = self._threaded
        if threaded is not None:
            draining = self._source.pause
            try:
                batch = next(threaded)
            except _Paused:
                self._threaded = None
                self._source.pause = False
            else:
                return batch, (None if draining else PREFETCH)
        item = next(self._source)
        if self._inline_prepare is not None:
            item = self._inline_prepare(item)
        return (item if self._handout is None else self._handout(item)), INLINE

    def _account(self, mode: Mode | None, start: float, end: float) -> None:
        policy = self._policy
        log = self.mode_log
        made = PREFETCH if mode is None else mode
        log.counts[made] += 1
        log.mode = made
        last = self._last_end
        self._last_end = end
        probing = self._probing
        if probing:
            cpu = thread_time() - self._last_cpu
            produced = self._source.take_produced()
        else:
            cpu, produced = 0.0, ()
        if self._first:
            self._first = False
            policy.observe(Cycle(mode, 0.0, end - start))
        elif last is not None:
            policy.observe(Cycle(mode, end - last, end - start, cpu, produced))
        self._follow_policy()

    def _follow_policy(self) -> None:
        """Start or stop the producer thread, or start a steady run, to match the policy."""
        policy = self._policy
        probing = policy.probing
        if probing is not self._probing:
            self._probing = probing
            source = self._source
            source.timing = probing
            if not probing:
                source.produced.clear()
        wanted = policy.wanted
        threaded = self._threaded
        if threaded is None:
            if wanted == PREFETCH:
                self._threaded = threaded = self._start_thread(self._source)
                self._latest_usage = getattr(threaded, "buffer_usage", None)
        elif wanted == INLINE:
            self._source.pause = True  # the producer stops after the batch it is making
        if probing:
            self._last_cpu = thread_time()
        elif threaded is None and wanted == INLINE and not self._first:
            cycles = self._steady_left = policy.steady_cycles()
            if cycles:
                start = perf_counter() if self._last_end is None else self._last_end
                self._steady_deadline = start + policy.steady_seconds(cycles)

    def close(self) -> None:
        """Stop the producer thread, if one runs; safe to call twice."""
        if self._closed:
            return
        self._closed = True
        self._finished = True
        # Cycles of a run the loop left unfinished are dropped: this may run in another
        # thread (garbage collection), after the loader's next epoch started.
        self._steady_left = 0
        threaded = self._threaded
        self._threaded = None
        if threaded is not None:
            threaded.close()


def start_adaptive_stream(
    source: Iterator[Any],
    *,
    backend: str,
    depth: DepthSpec,
    prepare: Callable[[Any], Any] | None = None,
    on_start: Callable[[], None] | None = None,
    handout: Callable[[Any], T] | None = None,
    inline_prepare: Callable[[Any], Any] | _Default | None = SAME_AS_PREPARE,
    policy: ModePolicy | None = None,
    **buffer_options: Any,
) -> AdaptiveStream[T]:
    """Like :func:`start_thread_stream`, but prefetching only while ``policy`` says it pays.

    ``policy`` should be created once per loader (:func:`new_policy`) so that the decision
    carries over from one epoch to the next; ``None`` makes a fresh one.
    ``buffer_options`` (``max_depth``, ``max_bytes``, ``measure``) go to every producer
    thread's buffer.
    """

    def start_thread(pausable: Iterator[Any]) -> ThreadedStream[T]:
        return start_thread_stream(
            pausable,
            backend=backend,
            depth=depth,
            prepare=prepare,
            on_start=on_start,
            handout=handout,
            **buffer_options,
        )

    inline = prepare if isinstance(inline_prepare, _Default) else inline_prepare
    return AdaptiveStream(
        source,
        policy=new_policy() if policy is None else policy,
        start_thread=start_thread,
        inline_prepare=inline,
        handout=handout,
    )
