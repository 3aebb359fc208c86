"""Where an epoch stands, from the training loop's side."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

from dataloaderx.epoch.run import Run


class Position:
    """The batches an epoch handed to the loop; written by the loop's thread only.

    ``run`` counts them (and the time the inline ones took); ``failed`` counts the
    ``next()`` calls that raised a batch's error, which use up a batch too. ``start`` is
    where the epoch resumed, ``limit`` how many batches its iterator has (``None``: not
    known; a producer reads no further before the loop asks), ``finished`` whether it
    raised ``StopIteration``, and ``state`` the source's state saved with the latest batch
    handed out. The resume position, ``_num_yielded``, the stall statistics and the
    producer's bound all read these counts.
    """

    __slots__ = ("_handed_at_failure", "failed", "finished", "limit", "run", "start", "state")

    def __init__(self, consumed: int = 0, state: Any = None) -> None:
        self.start = consumed
        self.run = Run()
        self.failed = 0
        self._handed_at_failure = -1
        self.limit: int | None = None
        self.finished = False
        self.state = state

    @property
    def handed(self) -> int:
        """Batches handed to the loop by this epoch's iterator."""
        return self.run.handed

    def fail(self) -> None:
        """Count a ``next()`` that raised a batch's error."""
        self.failed += 1
        self._handed_at_failure = self.run.handed

    @property
    def last_failed(self) -> bool:
        """Whether the latest outcome handed to the loop was a batch's error."""
        return self._handed_at_failure == self.run.handed

    @property
    def consumed(self) -> int:
        """Batches of the epoch the loop has had (or had the error of), resumed ones included."""
        return self.start + self.run.handed + self.failed

    def unread(self) -> int | None:
        """Batches of the iterator not read yet while none is read ahead (``None``: not known)."""
        limit = self.limit
        return None if limit is None else max(0, limit - self.run.handed - self.failed)


class Tracking(NamedTuple):
    """What an epoch records for resuming it: its :class:`Position`, a ``snapshot`` of the
    source's state taken with each batch, and how many outcomes of the source to drop
    unseen (those a resumed epoch already handed out)."""

    position: Position
    snapshot: Callable[[], Any] | None = None
    skip: int = 0
