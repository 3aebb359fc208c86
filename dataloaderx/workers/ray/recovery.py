"""``Recovery``: what a lost Ray actor means, and which actor runs its worker's tasks.

A lost actor (its process or node died) is replaced by a new actor for the same worker id
and seed, with a warning that names the worker and the node; until the new actor answers,
its worker's tasks go to actors that are ready, in turn (to its own where none is). An
iterable dataset's worker cannot be replaced (its position in its shard is lost with it):
that is an error, as is a replacement past ``max_replacements``.
"""

from __future__ import annotations

import itertools
import warnings

from dataloaderx.workers.ray.group import ActorGroup, ActorSlot, SlotState

__all__ = ["Recovery", "first_line"]


class Recovery:
    """The lost-actor policy of one iterator over ``group``; the caller serialises calls."""

    def __init__(self, group: ActorGroup, *, max_replacements: int, iterable: bool) -> None:
        self._group = group
        self._max_replacements = max_replacements
        self._iterable = iterable
        self._replacements = 0
        self._turns = itertools.cycle(range(group.num_workers))

    def runner(self, worker: int) -> int:
        """The worker whose actor runs a task of ``worker``: its own, unless it is being
        replaced and another is ready."""
        slots = self._group.slots
        if slots[worker].state is not SlotState.REPLACING:
            return worker
        for _ in range(len(slots)):
            other = next(self._turns)
            if slots[other].state is SlotState.READY:
                return other
        return worker

    def lost(self, worker: int, slot: ActorSlot, cause: BaseException) -> None:
        """Count the replacement of ``worker``'s lost actor ``slot`` and warn (where the
        caller is); raise where it may not be replaced."""
        reason = first_line(cause)
        if self._iterable:
            raise RuntimeError(
                f"DataLoader worker {worker} ({slot}) was lost: {reason}. An iterable "
                "dataset's worker cannot be replaced (its place in its shard is lost with "
                "it), so the epoch cannot complete; resume from a checkpoint, or use a "
                "map-style dataset, whose batches a new worker can make again"
            ) from cause
        if self._replacements >= self._max_replacements:
            raise RuntimeError(
                f"DataLoader worker {worker} ({slot}) was lost: {reason}; "
                f"{self._replacements} lost Ray actors were replaced already, "
                f"worker_options['max_replacements']={self._max_replacements!r}; "
                "check the cluster's nodes (memory, pre-emption), or raise max_replacements"
            ) from cause
        self._replacements += 1
        warnings.warn(
            f"dataloaderx: DataLoader worker {worker} ({slot}) was lost: {reason}; its "
            "batches are made again by other workers while a new actor starts",
            RuntimeWarning,
            stacklevel=2,
        )


def first_line(error: BaseException) -> str:
    """``error``'s type and the first line of its message."""
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}"
