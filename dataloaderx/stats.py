"""Stall statistics: is the training loop waiting for data?

A :class:`StatsRecorder` is filled while an epoch runs: the consumer's side by
:class:`~dataloaderx.PrefetchIterator` (time spent inside ``next()``, buffered batches seen
at each call), the producer's side by :class:`TimedSource`, which wraps the iterator a
backend reads from (time spent making batches, and time between batches, when the
producer is another thread: handing a batch over or waiting for room in a full buffer).
:meth:`StatsRecorder.snapshot` freezes the figures into a :class:`LoaderStats`.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from threading import get_ident
from time import perf_counter
from typing import TYPE_CHECKING, Final, Generic, Protocol, TypeVar

from dataloaderx._direct import Direct, DirectRun, direct_of

if TYPE_CHECKING:
    from dataloaderx.backends._depth_control import BufferUsage
    from dataloaderx.backends.base import Backend

__all__ = [
    "INPUT_BOUND_FRACTION",
    "EpochStats",
    "LoaderStats",
    "ModeReport",
    "StatsRecorder",
    "TimedSource",
    "TraceEvent",
]

T = TypeVar("T")

#: The loop is "input-bound" when it waits for data at least this fraction of the time.
INPUT_BOUND_FRACTION: Final = 0.1
#: ``(kind, start, end)`` with ``kind`` "wait" (consumer in ``next()``) or "produce".
TraceEvent = tuple[str, float, float]


# Prefetch mode: which mode made the batches, and why ----------------------------------


class ModeReport(Protocol):
    """What a stream that switches between prefetching and inline offers as ``mode_log``."""

    def line(self) -> str:
        """Which mode ran and why, in one line."""


@dataclass(frozen=True)
class LoaderStats:
    """One epoch's figures; times in seconds, from :func:`time.perf_counter`.

    ``producer_blocked_seconds`` is ``None`` when batches are made in the consumer's own
    thread (backend ``sync``), where there is no producer to block.
    """

    backend: str
    depth: int | None
    num_workers: int
    batches: int
    elapsed_seconds: float
    wait_seconds: float
    produce_seconds: float
    producer_blocked_seconds: float | None
    #: ``occupancy[k]``: how many ``next()`` calls found ``k`` batches already buffered.
    occupancy: tuple[int, ...]
    trace: tuple[TraceEvent, ...] = field(default=(), repr=False)
    # Buffer usage, from backends that report it (``None`` otherwise): the depth over the
    # epoch (smallest, median and largest, per batch; all equal for a fixed depth) and
    # the most bytes of tensors held in the buffer at once (device bytes for ``cuda``).
    depth_min: int | None = None
    depth_median: int | None = None
    depth_max: int | None = None
    peak_bytes: int | None = None
    #: Which mode ran and why, for adaptive backends (``thread``, ``auto`` on a CPU),
    #: for example ``"inline (prefetching did not pay: ...); 4 of 500 batches
    #: prefetched"``; ``None`` for backends that always work the same way.
    mode: str | None = None

    @property
    def wait_fraction(self) -> float:
        """Fraction of the epoch the consumer spent waiting inside ``next()``."""
        if self.elapsed_seconds <= 0:
            return 0.0
        return min(1.0, self.wait_seconds / self.elapsed_seconds)

    @property
    def mean_occupancy(self) -> float:
        """Mean number of batches already buffered when ``next()`` was called."""
        calls = sum(self.occupancy)
        if not calls:
            return 0.0
        return sum(k * n for k, n in enumerate(self.occupancy)) / calls

    @property
    def bound(self) -> str:
        """``"input-bound"``, ``"compute-bound"``, or ``"no data"`` before the first batch."""
        if self.batches == 0:
            return "no data"
        return "input-bound" if self.wait_fraction >= INPUT_BOUND_FRACTION else "compute-bound"

    def advice(self) -> str:
        """What to try next, in a few words ("" when nothing needs fixing)."""
        if self.bound != "input-bound":
            return ""
        more_workers = f"num_workers>={max(2, 2 * self.num_workers)}"
        if self.producer_blocked_seconds is None:
            return f"try backend='thread' or {more_workers}"
        busy = self.produce_seconds / self.elapsed_seconds if self.elapsed_seconds > 0 else 1.0
        if busy < 0.5 and self.depth is not None and self.producer_blocked_seconds > 0:
            return f"try depth>={2 * self.depth}"
        return f"try {more_workers} or make batches cheaper"

    def summary(self) -> str:
        """One line: is the loop input-bound or compute-bound, and what to try."""
        if self.bound == "no data":
            return "no data: no batch was delivered yet"
        percent = round(100 * self.wait_fraction)
        if self.bound == "input-bound":
            return f"input-bound: training waited {percent}% of the time for data; {self.advice()}"
        return f"compute-bound: data was ready {100 - percent}% of the time"


class StatsRecorder:
    """Mutable counters for one epoch; cheap enough to update on every batch."""

    __slots__ = (
        "_consumer",
        "_frozen_usage",
        "_last_end",
        "_started",
        "backend",
        "batches",
        "blocked_seconds",
        "depth",
        "ended",
        "mode_log",
        "num_workers",
        "occupancy",
        "pending",
        "produce_seconds",
        "threaded",
        "trace",
        "usage",
        "wait_seconds",
    )

    def __init__(
        self, *, backend: str, depth: int | None, num_workers: int, trace: bool = False
    ) -> None:
        self.backend = backend
        self.depth = depth
        self.num_workers = num_workers
        self.batches = 0
        self.wait_seconds = 0.0
        self.produce_seconds = 0.0
        self.blocked_seconds = 0.0
        self.occupancy: list[int] = [0]
        self.threaded: bool | None = None
        self.trace: list[TraceEvent] | None = [] if trace else None
        self._consumer = get_ident()
        self._started = perf_counter()
        self.ended = self._started
        self._last_end: float | None = None
        #: Reports the buffer's depths and peak bytes (set when the stream offers it);
        #: replaced by its last answer when the epoch's stream closes.
        self.usage: Callable[[], BufferUsage] | None = None
        self._frozen_usage: BufferUsage | None = None
        #: Set by the iterator when the backend's stream reports its prefetch mode.
        self.mode_log: ModeReport | None = None
        #: The iterator's direct run: its batches made and handed out are not yet
        #: recorded (see :mod:`dataloaderx._direct`).
        self.pending: DirectRun | None = None

    def record_next(self, start: float, end: float, buffered: int, delivered: bool) -> None:
        """Account for one ``next()`` call of the consumer."""
        self.wait_seconds += end - start
        self.ended = end
        if delivered:
            self.batches += 1
        occupancy = self.occupancy
        try:
            occupancy[buffered] += 1
        except IndexError:
            occupancy.extend([0] * (buffered + 1 - len(occupancy)))
            occupancy[buffered] += 1
        if self.trace is not None:
            self.trace.append(("wait", start, end))

    def record_produce(self, start: float, end: float) -> None:
        """Account for one ``next()`` call on the source (in the producer's thread)."""
        self.produce_seconds += end - start
        if get_ident() == self._consumer:
            # Made inline: no producer thread waited before this batch.
            self._last_end = None
        else:
            self.threaded = True
            if self._last_end is not None:
                self.blocked_seconds += start - self._last_end
            self._last_end = end
        if self.trace is not None:
            self.trace.append(("produce", start, end))

    def record_direct(self, run: DirectRun) -> None:
        """Account for a direct run's batches: made inline, each handed out as made."""
        count = run.taken()
        if not count:
            return
        seconds = run.seconds
        self.wait_seconds += seconds
        self.produce_seconds += seconds
        self.batches += count
        self.occupancy[0] += count
        latest = run.latest_ends()
        self.ended = latest[-1] if latest else perf_counter()
        self._last_end = None

    def _current_usage(self) -> BufferUsage | None:
        return self._frozen_usage if self.usage is None else self.usage()

    def freeze_usage(self) -> None:
        """Keep the buffer usage as it is now and drop the reference to the stream."""
        self._frozen_usage = self._current_usage()
        self.usage = None

    def __getstate__(self) -> dict[str, object]:
        state = {name: getattr(self, name) for name in self.__slots__}
        state.update(usage=None, _frozen_usage=self._current_usage())  # not the stream
        return state

    def __setstate__(self, state: dict[str, object]) -> None:
        for name, value in state.items():
            setattr(self, name, value)

    def snapshot(self) -> LoaderStats:
        """Return the figures so far as an immutable :class:`LoaderStats`."""
        if self.pending is not None and self.pending.taken():
            # A direct run is under way: count its batches in, on a copy.
            recorder = copy.copy(self)
            recorder.occupancy = list(self.occupancy)
            recorder.pending = None
            recorder.record_direct(self.pending)
            return recorder.snapshot()
        usage = self._current_usage()
        return LoaderStats(
            backend=self.backend,
            depth=self.depth,
            num_workers=self.num_workers,
            batches=self.batches,
            elapsed_seconds=self.ended - self._started,
            wait_seconds=self.wait_seconds,
            produce_seconds=self.produce_seconds,
            producer_blocked_seconds=self.blocked_seconds if self.threaded else None,
            occupancy=tuple(self.occupancy),
            trace=tuple(self.trace) if self.trace is not None else (),
            depth_min=None if usage is None else usage.depth_min,
            depth_median=None if usage is None else usage.depth_median,
            depth_max=None if usage is None else usage.depth_max,
            peak_bytes=None if usage is None else usage.peak_bytes,
            mode=None if self.mode_log is None else self.mode_log.line(),
        )


class TimedSource(Generic[T]):
    """An iterator that times each ``next()`` of ``source`` into a :class:`StatsRecorder`."""

    def __init__(self, source: Iterator[T], recorder: StatsRecorder) -> None:
        self._source = source
        self._recorder = recorder

    def __iter__(self) -> TimedSource[T]:
        return self

    def __next__(self) -> T:
        start = perf_counter()
        try:
            return next(self._source)
        finally:
            self._recorder.record_produce(start, perf_counter())

    def direct(self, run: DirectRun) -> Direct | None:
        """The source's direct runs, unchanged: the iterator that takes a direct run's
        batches records them, made inline, with :meth:`StatsRecorder.record_direct`.
        None while every batch is traced (a run times its batches only in bulk)."""
        return None if self._recorder.trace is not None else direct_of(self._source, run)


class EpochStats:
    """Starts one :class:`StatsRecorder` per epoch (unless stats are off); keeps the latest.

    ``setting`` is the ``stats`` option: ``True``, ``False`` or ``"trace"``.
    """

    def __init__(self, setting: bool | str) -> None:
        self.setting = setting
        self._latest: StatsRecorder | None = None

    def start(self, backend: Backend, num_workers: object) -> StatsRecorder | None:
        """Return the recorder for a new epoch of ``backend``, or ``None`` when stats are off."""
        if self.setting is False:
            return None
        depth = getattr(backend, "depth", None)
        recorder = StatsRecorder(
            backend=backend.name,
            depth=depth if isinstance(depth, int) else None,
            num_workers=num_workers if isinstance(num_workers, int) else 0,
            trace=self.setting == "trace",
        )
        self._latest = recorder
        return recorder

    def latest(self) -> LoaderStats | None:
        """The latest (or current) epoch's figures, or ``None`` before the first one."""
        return None if self._latest is None else self._latest.snapshot()
