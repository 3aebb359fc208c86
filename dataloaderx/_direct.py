"""Direct runs: batches the loop takes straight from the source, accounted for in bulk.

Every batch handed to the loop passes through layers, each with one job: the source's
guard, the stats timer, the read-ahead bound, the resume counter and the backend's
stream. Each layer is one Python call per batch, and together they cost more than
``DataLoader``'s own ``next()`` on a batch of a few tiny tensors. Where batches are made
inline (``sync``, and an adaptive backend in a steady inline run) none of them does
anything per batch that could not be done afterwards for many batches at once.

So the iterator asks its stream for a :class:`Direct` run: each layer that can take part
answers by asking the layer below and narrowing the answer (a limit it may not exceed,
and a ``settle`` of its own), down to the guarded source, which offers its own
``next``. A layer that cannot take part (a producer thread is running, a snapshot is
taken per batch, a third-party stream) answers ``None``, and so does every layer above
it. The iterator then calls ``take()`` at most ``limit`` times, appending each batch's
start and end time (``perf_counter``) to ``marks``, and calls ``settle()`` once at the
end of the run, after which it clears ``marks``: each layer then accounts for
``taken(marks)`` batches as if they had passed through it. A layer whose figures must be
exact between two batches (the resume position) keeps a reference to ``marks`` and
counts them in.

A ``take()`` that raises ends the run before its batch is counted: the source replays
the same exception to the next call, and the iterator makes that call through every
layer, so each handles the failed batch (or the end of the epoch) as it always does.
"""

from __future__ import annotations

from collections.abc import Callable
from math import fsum
from operator import sub
from typing import Any, Final, NamedTuple

__all__ = [
    "RUN_MAX",
    "Direct",
    "direct_of",
    "durations",
    "ends",
    "narrowed",
    "settle_nothing",
    "taken",
]

#: The longest run a layer with no reason of its own to stop earlier offers: a run's
#: ``marks`` are settled at its end, and this keeps them short.
RUN_MAX: Final = 256


class Direct(NamedTuple):
    """The next ``limit`` batches may be made by ``take()``; then call ``settle()``."""

    limit: int
    take: Callable[[], Any]
    settle: Callable[[], None]


def settle_nothing() -> None:
    """The ``settle`` of a layer that counts nothing (and of no run at all)."""


def direct_of(layer: object, marks: list[float]) -> Direct | None:
    """``layer.direct(marks)`` where ``layer`` offers direct runs, else ``None``."""
    offer: Callable[[list[float]], Direct | None] | None = getattr(layer, "direct", None)
    return None if offer is None else offer(marks)


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


def taken(marks: list[float]) -> int:
    """How many batches a run's ``marks`` describe."""
    return len(marks) // 2


def ends(marks: list[float]) -> list[float]:
    """When each batch of the run was in hand."""
    return marks[1::2]


def durations(marks: list[float]) -> float:
    """Seconds spent making the run's batches."""
    return fsum(map(sub, marks[1::2], marks[0::2]))
