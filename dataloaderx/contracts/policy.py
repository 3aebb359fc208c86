"""The mode policy: how a batch is made, and what a policy answers about the cycles it saw."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final, Literal, NamedTuple, Protocol

__all__ = ["INLINE", "PREFETCH", "Cycles", "Mode", "ModePolicy", "Verdict"]

#: How a batch is made: by a producer thread ahead of the loop, or by the loop's own
#: thread inside ``next()``, as ``DataLoader`` does.
Mode = Literal["prefetch", "inline"]
PREFETCH: Final = "prefetch"
INLINE: Final = "inline"


class Verdict(NamedTuple):
    """What a :class:`ModePolicy` asks for until it is told of the cycles it asked for."""

    mode: Mode
    #: Cycles to make in ``mode`` before the next report; none but the last of them can
    #: change the verdict, so they may be reported together.
    cycles: int
    #: The most seconds those cycles should take; a run that takes longer is reported
    #: at once, with ``overran`` set (the cost per batch went up meanwhile).
    seconds: float
    #: Whether the report needs the CPU and producer times of each cycle.
    measure: bool


class Cycles(NamedTuple):
    """Cycles of the loop made in a verdict's mode; seconds.

    A cycle runs from one ``next()`` return to the next. ``seconds`` holds the latest, in
    order: all, or at least the last 32. ``number`` may be 0 (the epoch's first batch, or a
    batch after a failed one, ends no cycle).
    """

    mode: Mode
    number: int
    seconds: Sequence[float] = ()
    #: For a measured cycle (``number`` 1): the loop's wait in ``next()``, its thread's CPU
    #: time, and the wall and CPU time of each batch a producer thread finished meanwhile.
    wait: float = 0.0
    cpu: float = 0.0
    produced: Sequence[tuple[float, float]] = ()
    overran: bool = False
    #: Whether the workers that make the batches changed in number since the report before
    #: (an elastic pool, ``num_workers="auto"``): what either mode cost was measured on others.
    resized: bool = False


class ModePolicy(Protocol):
    """Decides, cycle by cycle, whether a producer thread pays; kept for a loader's life."""

    @property
    def reason(self) -> str:
        """Why the current mode was chosen, in a few words."""

    def start_epoch(self, *, helper_processes: bool) -> Verdict:
        """A new epoch starts; ``helper_processes``: whether DataLoader workers (processes, or
        worker threads) may be making batches while the loop steps, in either mode."""

    def observe(self, cycles: Cycles) -> Verdict:
        """Account for cycles made as the latest verdict asked (at most its ``cycles``)."""
