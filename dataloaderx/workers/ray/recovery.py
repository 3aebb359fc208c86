"""``Recovery``: what a lost Ray actor means (a replacement, with a warning, or an error for
the epoch), and which actor runs its worker's tasks meanwhile; ``docs/ray-workers.md``,
"Fault tolerance".
"""

from __future__ import annotations

import itertools
import warnings
from typing import Any

from dataloaderx.workers.ray.group import ActorGroup, ActorSlot, SlotState

__all__ = ["Recovery", "first_line"]

#: Actors a batch may end before it is taken for the cause.
_DEATHS_PER_BATCH = 2


class Recovery:
    """The lost-actor policy of one iterator over ``group``; the caller serialises calls."""

    def __init__(self, group: ActorGroup, *, max_replacements: int, iterable: bool) -> None:
        self._group = group
        self._max_replacements = max_replacements
        self._iterable = iterable
        self._replacements = 0
        self._turns = itertools.cycle(range(group.num_workers))
        #: Workers that handed over a result this epoch (the caller's to fill and clear).
        self.delivered: set[int] = set()
        #: The actors each batch ended.
        self._deaths: dict[int, list[str]] = {}

    def runner(self, worker: int) -> int:
        """The worker whose actor runs a task of ``worker``: its own, unless it is being
        replaced and another is ready (never another for an iterable's, which has a shard)."""
        slots = self._group.slots
        if self._iterable or slots[worker].state is not SlotState.REPLACING:
            return worker
        for _ in range(self._group.num_workers):
            other = next(self._turns)
            slot = slots.get(other)
            if slot is not None and slot.state is SlotState.READY:
                return other
        return worker

    def lost(self, worker: int, slot: ActorSlot, cause: BaseException, making: Any) -> None:
        """Count the replacement of ``worker``'s lost actor ``slot``, which died making the
        task ``making`` (its number, indices and worker), and warn (where the caller is);
        raise where it may not be replaced, or where that batch ended two actors."""
        task, indices, owner = making
        deaths = self._deaths.setdefault(task, [])
        deaths.append(f"{slot}: {first_line(cause)}")
        if len(deaths) >= _DEATHS_PER_BATCH:
            raise RuntimeError(
                f"DataLoader worker {owner}'s batch of indices {indices} ended the process "
                f"of {len(deaths)} Ray actors in turn ({'; '.join(deaths)}), so no other is "
                "given it; make those items loadable (a crash in native code, an "
                "out-of-memory kill?), or leave them out of the sampler"
            ) from cause
        reason = first_line(cause)
        if self._iterable and worker in self.delivered:
            raise RuntimeError(
                f"DataLoader worker {worker} ({slot}) was lost: {reason}. An iterable "
                "dataset's worker cannot be replaced mid-epoch (its place in its shard is "
                "lost with it), so this epoch cannot complete; the next one starts on a new "
                "actor. Resume from a checkpoint, or use a map-style dataset, whose batches "
                "a new worker can make again"
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
