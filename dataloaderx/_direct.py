"""Direct runs: batches the loop takes straight from the source, accounted for in bulk.

Every batch handed to the loop passes through layers, each with one job: the source's
guard, the stats timer, the read-ahead bound, the resume counter and the backend's
stream. Each layer is one Python call per batch, and together they cost more than
``DataLoader``'s own ``next()`` on a batch of a few tiny tensors. Where batches are made
inline (``sync``, and an adaptive backend in a steady inline run) none of them does
anything per batch that could not be done afterwards for many batches at once.

So the iterator asks its stream for a :class:`Direct` run: each layer that can take part
answers by asking the layer below and narrowing the answer (a limit it may not exceed,
and a ``settle`` of its own), down to the guarded source, which offers the wrapped
iterator's own ``next``. A layer that cannot take part (a producer thread is running, a
snapshot is taken per batch, a third-party stream) answers ``None``, and so does every
layer above it. The iterator then calls ``take()`` at most ``limit`` times, timing each
batch (``perf_counter``) into the :class:`DirectRun`, and calls ``settle()`` once at the
end of the run: each layer then accounts for :meth:`DirectRun.taken` batches as if they
had passed through it. A layer whose figures must be exact between two batches (the
resume position) keeps a reference to the run and counts its batches in.

A ``take()`` that raises ends the run before its batch is counted: the source replays
the same exception to the next call, and the iterator makes that call through every
layer, so each handles the failed batch (or the end of the epoch) as it always does.

The per-batch work is a few reads and writes of the run's slots: no call but ``take()``
and the two clock reads, no lock, no list that grows, and no time kept but those of the
run's last batches. Right after a batch of a few tiny tensors has been collated, a
list's ``append``, a lock, or a float object made a few hundred batches earlier and read
back now each cost more than all the rest. The guarded source keeps its promise
without its lock through the run's ``busy`` and ``closing`` flags (see
:class:`~dataloaderx._source.GuardedSource`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, Final, NamedTuple

__all__ = [
    "RUN_MAX",
    "TIMED_TAIL",
    "Direct",
    "DirectRun",
    "direct_of",
    "narrowed",
    "no_take",
    "settle_nothing",
]

#: The longest run a layer with no reason of its own to stop earlier offers: every
#: layer's figures catch up at least this often.
RUN_MAX: Final = 1024
#: How many of a run's last batches have their end times noted one by one.
TIMED_TAIL: Final = 64
_NO_ENDS: Final = [0.0] * TIMED_TAIL


class Direct(NamedTuple):
    """The next ``limit`` batches may be made by ``take()``; then call ``settle()``."""

    limit: int
    take: Callable[[], Any]
    settle: Callable[[], None]


def settle_nothing() -> None:
    """The ``settle`` of a layer that counts nothing (and of no run at all)."""


def no_take() -> Any:
    """A run's ``take`` while none is under way."""
    raise RuntimeError("no direct run is under way")


class DirectRun:
    """The direct run under way, read and written on every batch it hands out.

    Batch ``i`` of the run (``i`` from 0) is taken when ``left`` is ``limit - i``; its
    duration is added to ``seconds``, ``left`` drops by one once it is in hand, and the
    time it was in hand goes to ``ends[left]`` when ``left < TIMED_TAIL``: only the
    run's last batches are noted one by one (what an adaptive policy's window needs).
    A time kept for later costs a cache miss when it is read back or replaced, once a
    few batches were collated since; one added up at once costs nothing. The run also
    ends with the first batch in hand after ``deadline`` (``perf_counter``), which a
    layer may set when it offers the run.

    ``busy`` is set around each ``take()`` by the thread taking the run (``thread``),
    which then checks ``closing``; the guarded source sets ``closing`` when it is
    closed, then checks ``busy``.

    It holds no ``settle``: layers that count a run's batches while it is under way keep
    a reference to it, and their ``settle`` functions refer to them (a cycle, which
    would keep the iterator's worker processes until the garbage collector ran).
    ``take`` is :func:`no_take` between runs, for the same reason.
    """

    __slots__ = (
        "busy",
        "closing",
        "deadline",
        "ends",
        "left",
        "limit",
        "seconds",
        "take",
        "thread",
    )

    def __init__(self) -> None:
        self.left = 0
        self.limit = 0
        self.take: Callable[[], Any] = no_take
        self.seconds = 0.0
        self.deadline = math.inf
        self.ends = [0.0] * TIMED_TAIL
        self.busy = False
        self.closing = False
        self.thread = 0

    def taken(self) -> int:
        """How many batches of the run are in the loop's hands."""
        return self.limit - self.left

    def latest_ends(self) -> list[float]:
        """When each batch taken among the run's last ``TIMED_TAIL`` (of ``limit``) was
        in hand, in order: every batch taken, for a run no longer than that."""
        return self.ends[self.left : min(self.limit, TIMED_TAIL)][::-1]

    def forget_ends(self) -> None:
        """Let go of the noted times while they are in the cache: each would otherwise
        cost a cache miss when it is replaced, in a later run."""
        self.ends[:] = _NO_ENDS


def direct_of(layer: object, run: DirectRun) -> Direct | None:
    """``layer.direct(run)`` where ``layer`` offers direct runs, else ``None``."""
    offer: Callable[[DirectRun], Direct | None] | None = getattr(layer, "direct", None)
    return None if offer is None else offer(run)


def narrowed(
    inner: Direct | None, limit: int | None, settle: Callable[[], None] | None = None
) -> Direct | None:
    """``inner`` limited to ``limit`` batches (``None``: no limit of its own), with
    ``settle`` run after its own settle; ``None`` when no batch is left."""
    if inner is None:
        return None
    if limit is not None and limit < inner.limit:
        inner = inner._replace(limit=limit)
    if inner.limit <= 0:
        return None
    if settle is None:
        return inner
    settle_inner = inner.settle

    def settle_both() -> None:
        settle_inner()
        settle()

    return inner._replace(settle=settle_both)
