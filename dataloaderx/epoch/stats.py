"""Stall statistics: is the training loop waiting for data?"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from threading import get_ident
from time import perf_counter
from typing import TYPE_CHECKING, Final, NamedTuple

from dataloaderx.contracts.backend import Backend
from dataloaderx.contracts.policy import INLINE, ModePolicy
from dataloaderx.engine.depth import fixed_usage

if TYPE_CHECKING:
    from dataloaderx.epoch.feed import Made
    from dataloaderx.epoch.position import Position
    from dataloaderx.epoch.slot import ProducerSlot

__all__ = ["INPUT_BOUND_FRACTION", "EpochStats", "LoaderStats", "StatsRecorder", "TraceEvent"]

#: The loop is "input-bound" when it waits for data at least this fraction of the time.
INPUT_BOUND_FRACTION: Final = 0.1
#: ``(kind, start, end)`` with ``kind`` "wait" (consumer in ``next()``) or "produce".
TraceEvent = tuple[str, float, float]


@dataclass(frozen=True)
class LoaderStats:
    """One epoch's figures; times in seconds, from :func:`time.perf_counter`.
    ``producer_blocked_seconds`` is ``None`` where no producer thread ran (backend ``sync``)."""

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
    # Buffer usage from backends that report it, else ``None``: depth over the epoch (per batch;
    # all equal for a fixed depth) and peak bytes of buffered tensors (device bytes for ``cuda``).
    depth_min: int | None = None
    depth_median: int | None = None
    depth_max: int | None = None
    peak_bytes: int | None = None
    #: Which mode ran and why, for adaptive backends (``thread``, ``auto`` on a CPU), e.g.
    #: ``"inline (prefetching did not pay: ...); 4 of 500 batches prefetched"``; else ``None``.
    mode: str | None = None
    #: With ``num_workers="auto"``: ``(time, workers, why)`` at the epoch's start and at
    #: each change of the worker count since; else empty.
    workers: tuple[tuple[float, int, str], ...] = field(default=(), repr=False)

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
        return sum(k * n for k, n in enumerate(self.occupancy)) / calls if calls else 0.0

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
        workers = f"num_workers>={max(2, 2 * self.num_workers)}"
        inline = self.mode is not None and self.mode.startswith(INLINE)
        blocked = None if inline else self.producer_blocked_seconds
        busy = self.produce_seconds / self.elapsed_seconds if self.elapsed_seconds > 0 else 1.0
        if blocked is None and not inline and self.backend != "thread":
            return f"try backend='thread' or {workers}"
        if busy < 0.5 and self.depth is not None and blocked:
            return f"try depth>={2 * self.depth}"
        why = "batches were made inline as prefetching did not pay: " if inline else ""
        return f"{why}try {workers} or make batches cheaper"

    def summary(self) -> str:
        """One line: is the loop input-bound or compute-bound, and what to try."""
        if self.bound == "no data":
            return "no data: no batch was delivered yet"
        percent = round(100 * self.wait_fraction)
        if self.bound == "input-bound":
            return f"input-bound: training waited {percent}% of the time for data; {self.advice()}"
        return f"compute-bound: data was ready {100 - percent}% of the time"


class Setup(NamedTuple):
    """What an epoch's figures are about."""

    backend: str
    depth: int | None
    num_workers: int
    started: float
    #: The loop's thread: reads made in another thread were made ahead by a producer.
    loop_thread: int
    #: The backend's mode policy, for backends that make batches inline while it pays.
    policy: ModePolicy | None


class StatsRecorder:
    """One epoch's figures, written by the loop's thread only; cheap to update on every batch.

    It records the time inside ``next()`` (waiting for a prefetched batch, or making one
    inline), the batches ready at each call, and the producer's reads, collected from the
    epoch's feed as batches are handed out. The count of batches handed out and the inline
    ones' time are kept in the epoch's :class:`~dataloaderx.epoch.position.Position`.
    """

    __slots__ = (
        "_made_end",
        "blocked_seconds",
        "ended",
        "occupancy",
        "position",
        "prefetched_batches",
        "produce_seconds",
        "setup",
        "slot",
        "trace",
        "wait_seconds",
    )

    def __init__(
        self, setup: Setup, position: Position, slot: ProducerSlot, *, trace: bool = False
    ) -> None:
        self.setup = setup
        self.position = position
        self.slot = slot
        #: When the epoch ended or was closed (``None``: it runs).
        self.ended: float | None = None
        self.wait_seconds = 0.0
        self.produce_seconds = 0.0
        #: Gaps between a producer thread's reads (``None``: no producer thread read).
        self.blocked_seconds: float | None = None
        self._made_end: float | None = None
        #: ``occupancy[k]``: calls that found ``k`` batches ready (inline ones added in snapshot).
        self.occupancy: list[int] = [0]
        self.prefetched_batches = 0
        self.trace: list[TraceEvent] | None = [] if trace else None

    def prefetched(
        self, start: float, end: float, buffered: int, made: deque[Made], measure: bool
    ) -> Sequence[tuple[float, float]]:
        """A prefetched batch was handed out; collect the producer's reads (their
        ``(wall, cpu)`` when ``measure``)."""
        self.prefetched_batches += 1
        self.call(start, end, buffered)
        return self.collect(made, measure)

    def call(self, start: float, end: float, buffered: int, *, inline: bool = False) -> None:
        """Account for a ``next()`` (other than an inline batch handed out) of the loop."""
        if inline:
            self.position.run.seconds += end - start
            if self.trace is not None:
                self.trace.append(("produce", start, end))
        else:
            self.wait_seconds += end - start
        occupancy = self.occupancy
        if buffered >= len(occupancy):
            occupancy.extend([0] * (buffered + 1 - len(occupancy)))
        occupancy[buffered] += 1
        if self.trace is not None:
            self.trace.append(("wait", start, end))

    def stop(self, at: float) -> None:
        """The epoch ended, or was closed, at ``at`` (the first call counts)."""
        if self.ended is None:
            self.ended = at

    def collect(self, made: deque[Made], measure: bool) -> Sequence[tuple[float, float]]:
        """Take the producer's reads from ``made`` (a thread-safe queue)."""
        produced = []
        loop = self.setup.loop_thread
        while made:
            start, end, cpu, thread = made.popleft()
            self.produce_seconds += end - start
            if thread == loop:
                self._made_end = None
            else:
                last = self._made_end
                blocked = self.blocked_seconds or 0.0
                self.blocked_seconds = blocked if last is None else blocked + start - last
                self._made_end = end
            if self.trace is not None:
                self.trace.append(("produce", start, end))
            if measure:
                produced.append((end - start, cpu))
        return produced

    def snapshot(self) -> LoaderStats:
        """Return the figures so far as an immutable :class:`LoaderStats`."""
        setup = self.setup
        handed = self.position.handed
        inline = self.position.run.seconds
        occupancy = list(self.occupancy)
        occupancy[0] += handed - self.prefetched_batches
        usage = self.slot.current_usage()
        mode = None
        if setup.policy is not None:
            usage = usage or fixed_usage(0, 0)
            mode = "no batch made yet"
            if handed:
                prefetched = f"{self.prefetched_batches} of {handed} batches prefetched"
                mode = f"{self.slot.mode} ({setup.policy.reason}); {prefetched}"
        return LoaderStats(
            backend=setup.backend,
            depth=setup.depth,
            num_workers=setup.num_workers,
            batches=handed,
            elapsed_seconds=(perf_counter() if self.ended is None else self.ended) - setup.started,
            wait_seconds=self.wait_seconds + inline,
            produce_seconds=self.produce_seconds + inline,
            producer_blocked_seconds=self.blocked_seconds,
            occupancy=tuple(occupancy),
            trace=() if self.trace is None else tuple(self.trace),
            mode=mode,
            **({} if usage is None else usage._asdict()),
        )


class EpochStats:
    """Starts one :class:`StatsRecorder` per epoch and keeps the latest unless ``setting`` (the
    ``stats`` option: ``True``, ``False`` or ``"trace"``) is ``False``."""

    def __init__(self, setting: bool | str) -> None:
        self.setting = setting
        self._latest: StatsRecorder | None = None

    def start(
        self,
        backend: Backend,
        num_workers: int,
        position: Position,
        slot: ProducerSlot,
        policy: ModePolicy | None,
    ) -> StatsRecorder:
        """The recorder of a new epoch of ``backend`` (kept unless stats are off)."""
        depth = backend.describe().get("depth")
        depth = depth if isinstance(depth, int) and not isinstance(depth, bool) else None
        setup = Setup(backend.name, depth, num_workers, perf_counter(), get_ident(), policy)
        recorder = StatsRecorder(setup, position, slot, trace=self.setting == "trace")
        if self.setting is not False:
            self._latest = recorder
        return recorder

    def latest(self) -> LoaderStats | None:
        """The latest (or current) epoch's figures, or ``None`` before the first one."""
        return None if self._latest is None else self._latest.snapshot()
