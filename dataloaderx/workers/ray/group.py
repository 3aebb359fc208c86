"""A loader's Ray actors: one per worker, kept between epochs, replaced when lost, ended
when dropped (``docs/design.md``, "Worker threads and Ray workers"). A fixed count of
workers reserves its actors' resources together; an elastic pool's actors are placed one by
one, as it adds them.

The actors are named ``<group>-w<worker>-g<generation>`` in the namespace
:data:`NAMESPACE`. They, their reservation and their shared-memory files end with the
group: at :meth:`ActorGroup.kill`, or once nothing holds the group, and without a Ray call
after the ``ray.init`` they were made under is gone.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import os
import statistics
import time
import uuid
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import ray
from ray.util import scheduling_strategies

from dataloaderx.workers.contract import WorkerSetup
from dataloaderx.workers.ray.actor import CONTROL, Place, RayWorker, payload
from dataloaderx.workers.ray.cluster import (
    RayGone,
    calls,
    connect,
    release,
    reserve,
    session,
    wait_reserved,
)
from dataloaderx.workers.ray.options import RayOptions
from dataloaderx.workers.ray.shared import SharedMemory, files_prefix, machine, remove_files

__all__ = ["NAMESPACE", "ActorGroup", "ActorSlot", "SlotState"]

#: The Ray namespace of every worker actor.
NAMESPACE: Final = "dataloaderx"

_RemoteWorker: Final[Any] = ray.remote(concurrency_groups={CONTROL: 1})(RayWorker)  # type: ignore[call-overload]


class SlotState(enum.Enum):
    """Where a worker's actor is in its life."""

    #: Created, not yet answered where it runs; tasks queue on it.
    STARTING = "starting"
    READY = "ready"
    #: The previous actor was lost; the new one has not answered yet: tasks go elsewhere.
    REPLACING = "replacing"
    #: An elastic pool's actor asked to leave: it takes no task, and ends once its own are done.
    LEAVING = "leaving"


@dataclass
class ActorSlot:
    """A worker's current actor."""

    handle: Any
    name: str
    generation: int
    state: SlotState
    #: The answer to ``place()`` while the actor starts, and when it must have come.
    ping: Any
    deadline: float
    place: Place | None = None
    #: How long the actor took to start, once it answered (its pool measures).
    start_seconds: float | None = None

    def __str__(self) -> str:
        where = "not started yet" if self.place is None else f"on {self.place}"
        return f"Ray actor {self.name} {where}"


@dataclass
class _Owned:
    """What ends with a group; shared with its finaliser, which must not hold the group."""

    session: tuple[str, str]
    prefix: str
    pid: int = field(default_factory=os.getpid)
    handles: dict[int, Any] = field(default_factory=dict)
    placement: Any = None


def _end(owned: _Owned) -> None:
    """End the actors and the reservation of ``owned`` (where this process made them, and
    its Ray is still theirs), and remove their shared-memory files."""
    if owned.pid != os.getpid():  # a forked child has none of these
        return
    try:
        with contextlib.suppress(RayGone), calls():
            if session() == owned.session:
                for handle in owned.handles.values():
                    _kill(handle)
                release(owned.placement)
    finally:
        owned.handles.clear()
        owned.placement = None
        remove_files(owned.prefix)


def _key(options: RayOptions, setup: WorkerSetup) -> tuple[Any, ...]:
    """What a group is made for: the options, and the arguments shipped (the objects
    themselves: the group holds them, so that their ids stay theirs)."""
    objects = (setup.dataset, setup.collate_fn, setup.init_fn)
    flags = (setup.dataset_kind, setup.auto_collation, setup.drop_last, setup.num_workers)
    return options, flags, tuple(map(id, objects))


def _kill(handle: Any) -> None:
    with contextlib.suppress(Exception):  # an actor already gone needs no ending
        ray.kill(handle, no_restart=True)


class ActorGroup:
    """``setup.num_workers`` actors for ``setup``, reserved together; ``make_room()`` ends
    another loader's idle actors where these do not fit. With ``workers``, an elastic pool's
    group: ``workers`` actors to start with, each placed on its own with the actor options
    ``placing`` (:meth:`add`, :meth:`remove`). The caller serialises calls, inside
    :func:`~dataloaderx.workers.ray.cluster.calls`."""

    def __init__(
        self,
        options: RayOptions,
        setup: WorkerSetup,
        make_room: Callable[[], object],
        *,
        workers: int | None = None,
        placing: Mapping[str, Any] | None = None,
    ) -> None:
        local = connect(without_authentication=options.start_local_ray_without_authentication)
        self.options = options
        self.setup = setup
        token = uuid.uuid4().hex[:12]
        self.name = f"dataloaderx-{token}"
        # On a Ray this process started, actors share the cores, as worker processes do.
        placed = dataclasses.replace(options, num_cpus=0.0) if local else options
        prefix = files_prefix(token)
        here = machine() if options.handover == "auto" else None
        self._shared = None if here is None else SharedMemory(here, prefix)
        self._placed = placed
        self._owned = _Owned(session(), prefix)
        self._finalizer = weakref.finalize(self, _end, self._owned)
        #: The number of the latest task sent to any actor of the group.
        self._tickets = 0
        #: Results of tasks no longer wanted, not yet come.
        self._abandoned: list[Any] = []
        #: An elastic pool's actor options that place each actor (``None``: a fixed count).
        self._placing = None if workers is None else dict(placing or {})
        #: The actors by worker id.
        self.slots: dict[int, ActorSlot] = {}
        try:
            if self._placing is None:
                self._owned.placement = reserve(placed, self.num_workers)
            for worker in range(self.num_workers if workers is None else workers):
                self.slots[worker] = self._start(worker, 0, SlotState.STARTING)
            #: The loader's arguments in the object store, for every actor's first epoch.
            self.payload_ref = ray.put(payload(setup))
            wait_reserved(self._owned.placement, placed, self.num_workers, make_room)
            for slot in self.slots.values():  # the time to start counts once they are placed
                slot.deadline = time.monotonic() + placed.placement_timeout_s
        except BaseException:
            self.kill()
            raise

    @property
    def start_seconds(self) -> float:
        """How long an actor of the group takes to start: the median of those its actors
        took (0 where none is known)."""
        known = [slot.start_seconds for slot in self.slots.values() if slot.start_seconds]
        return statistics.median(known) if known else 0.0

    @property
    def num_workers(self) -> int:
        """The most workers (a fixed count's: all of them)."""
        return self.setup.num_workers

    def fits(self, options: RayOptions, setup: WorkerSetup) -> bool:
        """Whether this group serves a pool with these arguments, under the Ray in use."""
        try:
            with calls():
                same_ray = self._owned.session == session()
        except RayGone:  # not initialised now: the group's Ray is gone
            return False
        return same_ray and _key(self.options, self.setup) == _key(options, setup)

    def _start(self, worker: int, generation: int, state: SlotState) -> ActorSlot:
        options = self._placed
        placed: dict[str, Any] = {"scheduling_strategy": options.scheduling_strategy}
        if self._owned.placement is not None:
            placed["scheduling_strategy"] = scheduling_strategies.PlacementGroupSchedulingStrategy(
                self._owned.placement, placement_group_bundle_index=worker
            )
        elif self._placing is not None:
            placed = self._placing
        name = f"{self.name}-w{worker}-g{generation}"
        optional = {"memory": options.memory, "runtime_env": options.runtime_env}
        handle = _RemoteWorker.options(
            name=name,
            namespace=NAMESPACE,
            num_cpus=options.num_cpus,
            num_gpus=options.num_gpus,
            resources=dict(options.resources),
            max_restarts=0,
            max_task_retries=0,
            **placed,
            **{key: value for key, value in optional.items() if value is not None},
        ).remote(worker, self._shared)
        self._owned.handles[worker] = handle
        deadline = time.monotonic() + options.placement_timeout_s
        return ActorSlot(handle, name, generation, state, handle.place.remote(), deadline)

    def ticket(self) -> int:
        """A new task's number, greater than every earlier task's."""
        self._tickets += 1
        return self._tickets

    def abandon(self, results: list[Any]) -> None:
        """Make every actor skip the tasks sent so far that it has not started, and let go
        of their ``results`` (none: only read and drop those let go of before): each is
        read and dropped once it comes."""
        if results:
            for slot in self.slots.values():
                slot.handle.skip_through.remote(self._tickets)
            self._abandoned.extend(results)
        self.drop_abandoned()

    def drop_abandoned(self) -> None:
        """Read and drop the results let go of that have come, without waiting."""
        if not self._abandoned:
            return
        ready, self._abandoned = ray.wait(
            self._abandoned, num_returns=len(self._abandoned), timeout=0, fetch_local=False
        )
        for result in ready:
            with contextlib.suppress(Exception):  # a result nobody wants, lost or not
                ray.get(result, timeout=0)

    def replace(self, worker: int) -> ActorSlot:
        """Start a new actor for ``worker`` (the old one is lost), and return its slot."""
        old = self.slots[worker]
        _kill(old.handle)
        slot = self._start(worker, old.generation + 1, SlotState.REPLACING)
        self.slots[worker] = slot
        return slot

    def add(self, worker: int) -> ActorSlot:
        """Start an actor for the new worker ``worker`` of an elastic pool; its slot."""
        slot = self._start(worker, 0, SlotState.STARTING)
        self.slots[worker] = slot
        return slot

    def remove(self, worker: int) -> None:
        """End the actor of ``worker``, which leaves an elastic pool."""
        slot = self.slots.pop(worker)
        self._owned.handles.pop(worker, None)
        _kill(slot.handle)

    def forget_reservation(self) -> None:
        """Leave the reservation of a cluster that went away to it: asked to free it, a GCS
        gone keeps the caller waiting until Ray's own limit (60 s) ends the process."""
        self._owned.placement = None

    def kill(self) -> None:
        """End every actor and free the reservation (as far as Ray is still there)."""
        self._finalizer()
