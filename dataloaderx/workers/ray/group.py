"""A loader's Ray actors: one per worker, kept between epochs, replaced when lost.

The group asks for the actors' resources (a placement group, one bundle per worker), starts
the actors, and ships the dataset to the object store once (``ray.put``) while they are
placed and start (each takes it with its first epoch); then it waits for the placement.
The actors are named actors in the namespace :data:`NAMESPACE`, named
``<group>-w<worker>-g<generation>``; the group's name is unique per loader, so the actors
of a loader can be found and counted.
A replacement keeps its worker's id and bundle. :meth:`ActorGroup.kill` ends every actor.
The results of tasks an epoch no longer wants are read and dropped once they come
(:meth:`ActorGroup.abandon`): a batch in shared memory is freed only when read.
"""

from __future__ import annotations

import enum
import time
import uuid
import weakref
from dataclasses import dataclass
from typing import Any, Final

import ray
from ray.util import scheduling_strategies

from dataloaderx.workers.ray.actor import CONTROL, Place, RayWorker
from dataloaderx.workers.ray.cluster import connect, release, reserve, wait_reserved
from dataloaderx.workers.ray.options import RayOptions
from dataloaderx.workers.ray.shared import SharedMemory, machine, remove_files

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

    def __str__(self) -> str:
        where = "not started yet" if self.place is None else f"on {self.place}"
        return f"Ray actor {self.name} {where}"


def _picklable_member(value: Any) -> str:
    """The first attribute of ``value`` cloudpickle cannot pickle, described."""
    for name, member in vars(value).items() if hasattr(value, "__dict__") else ():
        try:
            ray.cloudpickle.dumps(member)  # type: ignore[no-untyped-call]
        except Exception as exc:  # noqa: BLE001 - what to report
            return f"its member {name!r} ({type(member).__name__}) cannot be pickled ({exc})"
    return "it cannot be pickled"


def shipped(what: str, value: Any, fix: str) -> Any:
    """``value`` in the object store; an error names ``what`` and the member that fails."""
    try:
        return ray.put(value)
    except Exception as exc:
        raise TypeError(
            f"{what}={type(value).__name__} cannot be sent to Ray workers: "
            f"{_picklable_member(value)}; {fix}, or use worker_method='thread'"
        ) from exc


class ActorGroup:
    """``num_workers`` actors holding ``dataset``; the caller serialises calls."""

    def __init__(self, options: RayOptions, num_workers: int, dataset: Any) -> None:
        connect()
        self.options = options
        self.num_workers = num_workers
        self.name = f"dataloaderx-{uuid.uuid4().hex[:12]}"
        #: The number of the latest task sent to any actor of the group.
        self._tickets = 0
        #: Where actors that run on this machine hand batches over in shared memory.
        here = machine() if options.handover == "auto" else None
        self._shared = None if here is None else SharedMemory(here, self.name)
        #: Results of tasks no longer wanted, not yet come.
        self._abandoned: list[Any] = []
        #: Removes the actors' shared-memory files left (at :meth:`kill`, or at exit).
        self._remove_files = weakref.finalize(self, remove_files, self.name)
        self._placement = reserve(options, num_workers)
        self.slots: list[ActorSlot] = []
        try:
            for worker in range(num_workers):
                self.slots.append(self._start(worker, 0, SlotState.STARTING))
            #: The dataset in the object store, for every actor's first epoch.
            self.dataset_ref = shipped(
                "dataset",
                dataset,
                "make every member picklable with cloudpickle (open files, locks and "
                "connections in worker_init_fn or on first use instead)",
            )
            wait_reserved(self._placement, options, num_workers)
        except BaseException:
            self.kill()
            raise

    def _start(self, worker: int, generation: int, state: SlotState) -> ActorSlot:
        options = self.options
        strategy: Any = options.scheduling_strategy
        if self._placement is not None:
            strategy = scheduling_strategies.PlacementGroupSchedulingStrategy(
                self._placement, placement_group_bundle_index=worker
            )
        name = f"{self.name}-w{worker}-g{generation}"
        actor_options: dict[str, Any] = {
            "name": name,
            "namespace": NAMESPACE,
            "num_cpus": options.num_cpus,
            "num_gpus": options.num_gpus,
            "resources": dict(options.resources),
            "scheduling_strategy": strategy,
            "max_restarts": 0,
            "max_task_retries": 0,
        }
        if options.memory is not None:
            actor_options["memory"] = options.memory
        if options.runtime_env is not None:
            actor_options["runtime_env"] = dict(options.runtime_env)
        handle = _RemoteWorker.options(**actor_options).remote(
            worker, self.num_workers, self._shared
        )
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
            for slot in self.slots:
                slot.handle.skip_through.remote(self._tickets)
            self._abandoned.extend(results)
        self.drop_abandoned()

    def drop_abandoned(self) -> None:
        """Read and drop the results let go of that have come, without waiting."""
        if not self._abandoned or not ray.is_initialized():
            return
        ready, self._abandoned = ray.wait(
            self._abandoned, num_returns=len(self._abandoned), timeout=0, fetch_local=False
        )
        for result in ready:
            try:
                ray.get(result, timeout=0)
            except Exception:  # noqa: BLE001 - a result nobody wants, lost or not
                continue

    def replace(self, worker: int) -> ActorSlot:
        """Start a new actor for ``worker`` (the old one is lost), and return its slot."""
        old = self.slots[worker]
        _kill(old.handle)
        slot = self._start(worker, old.generation + 1, SlotState.REPLACING)
        self.slots[worker] = slot
        return slot

    def forget_reservation(self) -> None:
        """Leave the reservation of a cluster that went away to it: asked to free it, a GCS
        gone keeps the caller waiting until Ray's own limit (60 s) ends the process."""
        self._placement = None

    def kill(self) -> None:
        """End every actor and free the reservation (as far as Ray is still there)."""
        try:
            self.drop_abandoned()
            for slot in self.slots:
                _kill(slot.handle)
            release(self._placement)
            self._placement = None
        finally:
            self._remove_files()


def _kill(handle: Any) -> None:
    if not ray.is_initialized():
        return
    try:
        ray.kill(handle, no_restart=True)
    except Exception:  # noqa: BLE001 - an actor already gone needs no ending
        return
