"""An epoch's batches, counted down to each report to its mode policy."""

from __future__ import annotations

import math
from collections.abc import Sequence
from itertools import pairwise
from typing import Final

from dataloaderx.contracts.policy import INLINE, Cycles, Mode, Verdict

#: How many of a run's cycles the report carries at most: the latest ones.
TAIL: Final = 32
#: A run of an epoch whose policy is not asked: as long as it may be while its count
#: stays a one-digit Python int (cheaper to count down); it restarts when it ends.
ENDLESS: Final = (1 << 30) - 1


class Run:
    """The batches an epoch handed out, and the run under way.

    The count goes down: the epoch reports to its policy every ``length`` batches, and
    ``left`` of them are still to come, so :attr:`handed` is ``before + length - left``.
    Besides, the run keeps what its report needs (the mode asked for, when the run began,
    the end times of its last ``TAIL + 1`` batches, its time budget) and the time the
    epoch's inline batches took (``seconds``). A time kept for later costs more, right
    after a batch was collated, than all the rest of a batch's accounting, so only the
    run's last batches are timed one by one. ``pending`` is the verdict to follow once
    the producer has stopped, while the batches it had made ahead are handed out (they
    belong to neither mode).
    """

    __slots__ = (
        "before",
        "cpu",
        "deadline",
        "ends",
        "first",
        "left",
        "length",
        "measure",
        "mode",
        "pending",
        "seconds",
    )

    def __init__(self) -> None:
        self.before = 0
        self.length = self.left = ENDLESS
        self.seconds = 0.0
        self.mode: Mode = INLINE
        #: When the batch before the run was in the loop's hands (``None``: unknown).
        self.first: float | None = None
        self.ends: list[float] = []
        self.deadline = math.inf
        self.measure = False
        #: The loop thread's CPU time at the latest batch, while measured.
        self.cpu = 0.0
        self.pending: Verdict | None = None

    @property
    def handed(self) -> int:
        """Batches handed to the loop."""
        return self.before + self.length - self.left

    @property
    def made(self) -> int:
        """Batches of the run under way handed out."""
        return self.length - self.left

    def start(self, verdict: Verdict, first: float | None, length: int) -> None:
        """Begin the run ``verdict`` asks for (``length`` batches), after a batch in hand
        at ``first``."""
        self.before = self.handed
        self.length = self.left = length
        self.mode = verdict.mode
        self.first = first
        self.ends.clear()
        self.deadline = math.inf if first is None else first + verdict.seconds
        self.measure = verdict.measure
        self.pending = None

    def drain(self, pending: Verdict, first: float | None) -> None:
        """Hand out what a stopped producer made ahead, then follow ``pending``."""
        self.before = self.handed
        self.length = self.left = ENDLESS
        self.first = first
        self.pending = pending

    def cycles(
        self,
        *,
        wait: float = 0.0,
        cpu: float = 0.0,
        produced: Sequence[tuple[float, float]] = (),
        overran: bool = False,
        resized: bool = False,
    ) -> Cycles:
        """The report of the run so far (the rest: see :class:`Cycles`)."""
        made = self.made
        ends = self.ends
        first = self.first
        if first is not None and len(ends) >= made:  # every batch's end, and the start
            seconds = [end - start for start, end in pairwise([first, *ends])]
        else:
            seconds = [end - start for start, end in pairwise(ends)]
        count = made if first is not None else made - 1
        return Cycles(
            self.mode, max(0, count), seconds[-TAIL:], wait, cpu, produced, overran, resized
        )
