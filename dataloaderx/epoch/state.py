"""One epoch's state: its counts, its producer (if one runs), and the mode it follows."""

from __future__ import annotations

import math
import multiprocessing
from collections.abc import Callable, Iterator, Sequence
from time import perf_counter, thread_time
from typing import Any, Final, Generic, TypeVar

from dataloaderx.contracts.backend import Backend
from dataloaderx.contracts.policy import INLINE, PREFETCH, Verdict
from dataloaderx.engine.stream import EMPTY, Stream, as_stream
from dataloaderx.epoch.feed import Feed, Skipping, Stop, read_ahead_limit
from dataloaderx.epoch.position import Position, Tracking
from dataloaderx.epoch.run import ENDLESS, TAIL
from dataloaderx.epoch.slot import ProducerSlot
from dataloaderx.epoch.stats import EpochStats, StatsRecorder

T = TypeVar("T")

#: The verdict of an epoch without a mode policy: its backend always prefetches.
_ALWAYS_PREFETCH: Final = Verdict(PREFETCH, ENDLESS, math.inf, measure=False)
#: ... or always makes batches inline; and the reads past an epoch's last batch.
_ON_DEMAND: Final = Verdict(INLINE, ENDLESS, math.inf, measure=False)


class _Switched:
    """Returned by :meth:`EpochState.next_prefetched` when the producer stopped between
    batches: the same ``next()`` goes on another way (inline, or a new producer)."""


SWITCHED: Final = _Switched()


def _reader(
    feed: Feed[T], prepare: Callable[[Any], Any] | None, position: Position, stats: StatsRecorder
) -> Callable[[], T]:
    """How the loop's thread makes a batch: PyTorch's own ``next``, or, where a batch is
    also prepared, snapshot or traced, that ``next`` and those steps."""
    read = feed.iterator.__next__
    snapshots, trace = feed.snapshots, stats.trace
    if prepare is None and snapshots is None and trace is None:
        return read

    def made() -> T:
        start = perf_counter()
        try:
            batch: T = read()
            if prepare is not None:
                batch = prepare(batch)
        except StopIteration:
            raise
        except Exception:
            if snapshots is not None:  # a failed batch is consumed too
                position.state = snapshots.take()
            raise
        if snapshots is not None:
            position.state = snapshots.take()
        if trace is not None:  # (a failed read is traced as the loop's call)
            end = perf_counter()
            trace.extend((("produce", start, end), ("wait", start, end)))
        return batch

    return made


class EpochState(Generic[T]):
    """Everything one epoch owns; read and written by the loop's thread.

    The inline path lives in :meth:`dataloaderx.PrefetchIterator.__next__` and reads
    ``stream``, ``closing``, ``take`` and ``run``; the rest is here: batches from the
    producer, the runs reported to the mode policy, switches, and failures and the end.
    ``close`` is the iterator's (idempotent) shutdown.
    """

    __slots__ = (
        "backend",
        "close",
        "closing",
        "feed",
        "inline",
        "policy",
        "position",
        "resized",
        "run",
        "slot",
        "stats",
        "stream",
        "take",
    )

    def __init__(
        self,
        inner: Iterator[T],
        backend: Backend,
        release: Callable[[], None] | None,
        stats: EpochStats,
        tracking: Tracking,
        num_workers: int,
        resized: Callable[[], bool] | None = None,
    ) -> None:
        source = inner if not tracking.skip else Skipping(inner, tracking.skip)
        self.feed: Feed[T] = Feed(source, release, snapshot=tracking.snapshot)
        self.closing = self.feed.closing
        self.position = tracking.position
        self.position.limit = read_ahead_limit(inner)
        self.run = self.position.run
        self.backend = backend
        self.inline = backend.inline_mode()
        self.policy = None if self.inline is None else self.inline.policy
        self.stream: Stream[T] | None = None
        self.slot = ProducerSlot()
        self.stats = stats.start(backend, num_workers, self.position, self.slot, self.policy)
        prepare = None if self.inline is None else self.inline.prepare
        self.take = _reader(self.feed, prepare, self.position, self.stats)
        self.close: Callable[[], None] = _not_yet
        #: Whether the workers changed in number since it was asked before (an elastic pool).
        self.resized = resized

    def start(self, close: Callable[[], None], *, helpers: bool) -> None:
        """Begin the epoch (``close`` shuts it down); a producer may start here. ``helpers``:
        whether the source has workers (processes or threads) making batches meanwhile."""
        self.close = close
        if self.inline is None:
            self.follow(_ALWAYS_PREFETCH, None)
        elif self.policy is None:
            self.follow(_ON_DEMAND, None)
        else:
            # Worker processes already exist here (the iterator this reads from was made),
            # whoever made them.
            helpers = helpers or bool(multiprocessing.active_children())
            self.follow(self.policy.start_epoch(helper_processes=helpers), None)

    def request_close(self) -> None:
        """End the epoch from any thread: no read from now on, and no producer."""
        self.feed.request_close()
        self.slot.stop()

    def next_prefetched(self, stream: Stream[T]) -> T | _Switched:
        buffered = stream.buffered()
        start = perf_counter()
        try:
            batch = next(stream)
        except StopIteration:
            return self._producer_stopped(start, buffered)
        except BaseException as error:
            self.failed(error, start, buffered)
            raise
        end = perf_counter()
        run = self.run
        produced = self.stats.prefetched(start, end, buffered, self.feed.made, run.measure)
        left = run.left = run.left - 1
        if self.feed.snapshots is not None:
            self.position.state = self.feed.snapshots.queue.popleft()
        self.slot.mode = PREFETCH
        if run.pending is not None:
            run.first = end  # made ahead before the producer was asked to stop: no cycle
            return batch
        if left <= TAIL:
            run.ends.append(end)
        if not left or end > run.deadline:
            self.run_over(end, end - start, produced)
        return batch

    def _producer_stopped(self, start: float, buffered: int) -> _Switched:
        why = self.feed.why_stopped()
        self.slot.stop()
        self.stream = None
        # A producer stops at a batch's error (it does not read past one); the loop asks on.
        at_error = why is None and self.position.last_failed and not self.closing.locked()
        pending = self.run.pending
        if pending is not None and (why is Stop.PAUSED or at_error):
            self.follow(pending, self.run.first)
            return SWITCHED
        if at_error:
            self._start_producer()
            return SWITCHED
        if why is Stop.BOUND:
            # The loop asks past the epoch's last batch: the rest is read on demand.
            self._report()
            self.policy = None
            self.position.limit = None
            self.follow(_ON_DEMAND if self.inline is not None else _ALWAYS_PREFETCH, None)
            return SWITCHED
        self.end_epoch(start, buffered)
        raise StopIteration

    def _start_producer(self) -> None:
        left = self.position.unread()
        self.feed.resume(left)
        # With nothing left, nothing starts until the loop asks past the last batch.
        stream = EMPTY if left == 0 else as_stream(self.backend.open(self.feed))
        self.slot.hold(stream)
        self.stream = stream

    def run_over(
        self, end: float, wait: float = 0.0, produced: Sequence[tuple[float, float]] = ()
    ) -> None:
        """The run's batches are all made, or it overran its time: report it."""
        run = self.run
        if self.policy is None:  # an endless run ended: another one
            run.start(Verdict(run.mode, ENDLESS, math.inf, measure=False), None, ENDLESS)
            return
        cpu = thread_time() - run.cpu if run.measure else 0.0
        resized = self.resized is not None and self.resized()
        cycles = run.cycles(
            wait=wait, cpu=cpu, produced=produced, overran=run.left > 0, resized=resized
        )
        self.follow(self.policy.observe(cycles), end)

    def _report(self) -> None:
        """Tell the policy of the cycles of a run cut short by the epoch's end."""
        if self.policy is not None and self.run.pending is None and self.run.made:
            self.policy.observe(self.run.cycles())

    def follow(self, verdict: Verdict, first: float | None) -> None:
        """Make the coming batches as ``verdict`` says, after a batch in hand at ``first``."""
        run = self.run
        if verdict.mode == INLINE and self.stream is not None:
            self.feed.pause()  # the producer stops after the batch it is making
            run.drain(verdict, first)
            return
        run.start(verdict, first, verdict.cycles if self.policy is not None else ENDLESS)
        if verdict.measure:
            run.cpu = thread_time()
            self.feed.measure.set()
        else:
            self.feed.measure.clear()
        if verdict.mode == PREFETCH:
            if self.stream is None:
                self._start_producer()
        elif self.policy is not None:  # the next batch is made inline (not past the end)
            self.slot.mode = INLINE

    def inline_failed(self, error: BaseException, start: float) -> None:
        """A read in the loop's thread raised ``error`` (which the caller raises again)."""
        if isinstance(error, StopIteration):
            self.end_epoch(start, 0, inline=True)
        else:
            if not isinstance(error, Exception) and self.position.limit is not None:
                self.position.limit -= 1  # an interrupted read used up its batch of indices
            self.failed(error, start, 0, inline=True)

    def failed(
        self, error: BaseException, start: float, buffered: int, *, inline: bool = False
    ) -> None:
        """A batch's error (or an interrupt) ends its ``next()``; it ends no cycle."""
        self.stats.call(start, perf_counter(), buffered, inline=inline)
        self.stats.collect(self.feed.made, measure=False)
        if isinstance(error, Exception):
            self.position.fail()
            if not inline and self.feed.snapshots is not None:
                self.position.state = self.feed.snapshots.queue.popleft()
        run = self.run
        if run.pending is not None or self.policy is None or not run.made:
            run.first = None  # the next batch ends no cycle
            return
        self.follow(self.policy.observe(run.cycles()), None)

    def end_epoch(self, start: float, buffered: int, *, inline: bool = False) -> None:
        """The ``next()`` that began at ``start`` found the epoch over."""
        end = perf_counter()
        self.stats.call(start, end, buffered, inline=inline)
        self.stats.collect(self.feed.made, measure=False)
        self.stats.stop(end)
        if not self.closing.locked():  # a run the loop closed early is dropped
            self._report()
        self.position.finished = True
        self.close()


def _not_yet() -> None:
    """``close`` before the epoch started."""
