"""``ElasticRay``: Ray workers with ``num_workers="auto"``, as many actors as the loader's
:class:`~dataloaderx.workers.elastic.scaling.Scaling` decides (``docs/elastic-workers.md``).

A map-style dataset's task goes to the ready actor with the fewest tasks on hand, whatever
worker the schedule names, with its batch's seed
(:func:`~dataloaderx.workers.elastic.seeds.batch_seed`), so that the batches are the same
whatever the count. An actor added starts beside the others (at most as many at once as
the cluster has CPUs) and takes tasks once it answers; an actor removed takes no more and
ends once those it has are done (or, lost meanwhile, they are made again by the others).
Between epochs, actors idle past ``worker_options["idle_timeout_s"]`` (by default as long as
one takes to start) end, but ``min_workers`` of an open pool (persistent workers); the next
epoch starts them again.
An iterable dataset is sharded by worker id: its actors change only between epochs, each
then starting afresh as one of the new count.
"""

from __future__ import annotations

import contextlib
import functools
import time
import warnings
from collections import Counter
from collections.abc import Callable
from typing import Any

import ray
from ray.util import scheduling_strategies
from torch.utils.data.dataloader import _DatasetKind

from dataloaderx.engine.timer import OneTimer
from dataloaderx.util.cores import usable_cores
from dataloaderx.workers.elastic.seeds import batch_seed
from dataloaderx.workers.ray.cluster import RayGone, calls, connect
from dataloaderx.workers.ray.group import ActorGroup, ActorSlot, SlotState
from dataloaderx.workers.ray.options import RayOptions, parse_options
from dataloaderx.workers.ray.pool import Phase, RayWorkers

__all__ = ["ElasticRay"]


class ElasticRay(RayWorkers):
    """Between 1 and ``setup.num_workers`` Ray actors, placed as ``options.placement`` says;
    thread-safe. :meth:`resize` changes the count: at once for a map-style dataset, at the
    next epoch for an iterable one."""

    @classmethod
    def check_options(cls, options: Any) -> RayOptions:
        return parse_options(options, elastic=True)

    @classmethod
    def most_workers(cls, options: Any) -> int:
        """As many actors as the cluster's CPUs hold at ``num_cpus`` each (one per CPU for
        actors that reserve none): Ray's, where it is initialised already, else this
        machine's, which a local Ray started by the loader has."""
        cpus = _cluster_cpus() or float(usable_cores())
        return max(1, int(cpus // (options.num_cpus or 1.0)))

    def _start(self, name: str) -> None:
        # Before Ray's first call here: one without it starts a Ray of Ray's defaults.
        connect(without_authentication=self._options.start_local_ray_without_authentication)
        self._map = self._setup.dataset_kind == _DatasetKind.Map
        #: Guarded by ``_lock``, as the base pool's state: the count asked for, the most
        #: the cluster had room for (``None``: no limit met), and the loader's epoch and
        #: batches before the epoch's first task.
        self._target = self._workers
        self._room: int | None = None
        self._origin = (0, 0)
        #: The most actors that start at once: the cluster's CPUs (each start imports
        #: Python modules, torch among them, seconds of CPU).
        self._at_once = max(1, int(_cluster_cpus()))
        #: The node of the loop's process: where ``placement`` puts actors first.
        self._host = ray.get_runtime_context().get_node_id()
        #: What ends the idle actors of an open pool between epochs.
        self._idle = OneTimer("idle")
        super()._start(name)

    # -- the worker contract --------------------------------------------------------------

    def scheduled_workers(self) -> int:
        with self._lock:
            return self._shards()

    def set_origin(self, epoch: int, first_batch: int) -> None:
        with self._lock:
            self._origin = (epoch, first_batch)

    def resize(self, workers: int) -> int:
        with self._lock:
            self._idle.cancel()
            self._target = workers if self._room is None else min(workers, self._room)
            if self._map and self._phase is Phase.RUNNING:
                with calls():
                    self._adjust()
            return self._taking()

    def resizing(self) -> bool:
        with self._lock:
            slots = self._group.slots
            if not self._map:
                return self._target != len(slots)
            return len(_staying(slots)) != self._target or any(
                slot.state is not SlotState.READY for slot in slots.values()
            )

    def idle(self, keep: int, ended: Callable[[int, str], None]) -> None:
        with self._lock:
            self._idle.cancel()
            group = self._group
            if len(group.slots) <= keep:
                return
            after = self._options.idle_timeout_s
            after = group.start_seconds if after is None else after
            trim = functools.partial(self._trim, keep=keep, ended=ended)
            if self._phase is Phase.CLOSED:  # the group is the loader's now, if it kept it
                self._kept.expire(group, after, trim)
                return
            self._idle.start(after, self._end_idle, trim, self._epoch)

    def close(self) -> None:
        with self._lock:
            self._idle.cancel()
        super().close()

    # -- the base pool's choices ----------------------------------------------------------

    def _new_group(self) -> ActorGroup:
        placing = _placement(self._options.placement, self._host)
        # An iterable dataset's shards need every actor; a map-style one's come as they start.
        workers = self._target if not self._map else min(self._target, self._at_once)
        return ActorGroup(
            self._options, self._setup, self._kept.make_room, workers=workers, placing=placing
        )

    def _regroup(self) -> bool:
        if self._map:  # resized as the iterator asks, at any time
            return False
        slots = self._group.slots
        if len(slots) == self._target:
            return False
        for worker in [worker for worker in slots if worker >= self._target]:
            self._group.remove(worker)
        for worker in range(len(slots), self._target):
            self._group.add(worker)
        return True  # every actor starts as one of the new count of shards

    def _shards(self) -> int:
        return self._setup.num_workers if self._map else len(self._group.slots)

    def _seed(self, task: int) -> int | None:
        if not self._map:
            return None
        epoch, first = self._origin
        return batch_seed(self._setup.base_seed, epoch, first + task)

    def _runner(self, worker: int) -> int:
        if not self._map:
            return super()._runner(worker)
        load = Counter(task.runner for task in self._pending.values())
        slots = self._group.slots
        ready = [each for each, slot in slots.items() if slot.state is SlotState.READY]
        return min(ready or _staying(slots), key=lambda each: (load[each], each))

    def _replace_lost(self, worker: int, cause: BaseException, making: Any) -> None:
        if self._group.slots[worker].state is SlotState.LEAVING:
            self._group.remove(worker)  # it was leaving: its tasks go to the others
            return
        super()._replace_lost(worker, cause, making)

    def _cancel_pending(self) -> None:
        super()._cancel_pending()
        self._end_drained()

    def _started(self, worker: int, ping: Any) -> None:
        with self._lock:
            slot = self._group.slots.get(worker)
        super()._started(worker, ping)
        with self._lock:
            if slot is not None and slot.place is not None:  # its deadline ran from its start
                began = slot.deadline - self._options.placement_timeout_s
                slot.start_seconds = time.monotonic() - began

    def _check_started(self) -> None:
        """An actor added that has not started in time gives way where others run: the
        cluster has no room for it."""
        now = time.monotonic()
        late = [
            each
            for each, slot in self._group.slots.items()
            if slot.place is None and slot.deadline < now
        ]
        if not all(self._gave_way(worker) for worker in late):
            super()._check_started()

    def _gave_way(self, worker: int) -> bool:
        """Where another actor runs: end ``worker``'s actor, which could not start (no room),
        send its tasks to the others, and run at most as many actors as are left."""
        slots = self._group.slots
        if not any(slot.state is SlotState.READY for slot in slots.values()):
            return False
        self._group.remove(worker)
        for ref, task in list(self._pending.items()):
            if task.runner == worker:
                self._submit(self._pending.pop(ref))
        room = len(_staying(slots))
        if self._room is None or room < self._room:
            warnings.warn(
                f"dataloaderx: the Ray cluster had no room for more than {room} DataLoader "
                f"workers (Ray actors reserving {self._options.bundle()}, placed "
                f"{self._options.placement!r}) within worker_options['placement_timeout_s']="
                f"{self._options.placement_timeout_s!r} s; this iterator runs at most {room}",
                RuntimeWarning,
                stacklevel=2,
            )
        self._room = room
        self._target = min(self._target, room)
        return True

    # -- idle between epochs --------------------------------------------------------------

    def _end_idle(self, trim: Callable[[ActorGroup], None], epoch: int) -> None:
        """(The idle timer's thread.) ``trim`` the group where the pool is still open, its
        epoch ``epoch`` left, and the timer was not cancelled meanwhile."""
        with self._lock:
            if self._idle.claim() and self._phase is Phase.RUNNING and self._epoch == epoch:
                trim(self._group)

    def _trim(self, group: ActorGroup, keep: int, ended: Callable[[int, str], None]) -> None:
        """End all but ``keep`` of ``group``'s idle actors (the order they leave in; an
        iterable dataset's shards are the worker ids, so its last ones) and tell ``ended``."""
        slots = group.slots
        order = _leaving_first(slots, self._host) if self._map else sorted(slots, reverse=True)
        leaving = order[: max(0, len(order) - keep)]
        gone = 0
        with contextlib.suppress(RayGone), calls():
            for worker in leaving:
                group.remove(worker)
                gone += 1
        if gone:
            ended(len(group.slots), f"ended {gone} idle between epochs")

    # -- resizing (under ``_lock``) -------------------------------------------------------

    def _taking(self) -> int:
        """How many actors take tasks now: those ready, or all that stay while none is."""
        slots = self._group.slots
        if not self._map:
            return len(slots)
        staying = _staying(slots)
        return sum(slot.state is SlotState.READY for slot in staying.values()) or len(staying)

    def _adjust(self) -> None:
        """Add or remove a map-style dataset's actors towards the count asked for: those
        leaving stay first, then new ones start, at most ``_at_once`` starting at a time
        (the rest as those answer: each call adds what it can); the first to leave are
        those not started yet, then those on other nodes, then the newest."""
        slots = self._group.slots
        staying = _staying(slots)
        for worker, slot in sorted(slots.items()):
            if len(staying) >= self._target:
                break
            if worker not in staying:
                slot.state = SlotState.STARTING if slot.place is None else SlotState.READY
                staying[worker] = slot
        starting = sum(slot.place is None for slot in staying.values())
        for _ in range(min(self._target - len(staying), self._at_once - starting)):
            worker = min(set(range(self._setup.num_workers)) - set(slots))
            staying[worker] = self._group.add(worker)
            self._start_epoch(worker, fresh=True)
        for worker in _leaving_first(staying, self._host)[: max(0, len(staying) - self._target)]:
            staying[worker].state = SlotState.LEAVING
        self._end_drained()

    def _end_drained(self) -> None:
        """End the actors leaving that have no task on hand."""
        busy = {task.runner for task in self._pending.values()}
        for worker, slot in list(self._group.slots.items()):
            if slot.state is SlotState.LEAVING and worker not in busy:
                self._group.remove(worker)


def _cluster_cpus() -> float:
    """The CPUs of the Ray cluster connected to; 0 where Ray is not initialised."""
    if not ray.is_initialized():
        return 0.0
    return float(ray.cluster_resources().get("CPU", 0))  # type: ignore[no-untyped-call]


def _staying(slots: dict[int, ActorSlot]) -> dict[int, ActorSlot]:
    """The actors of ``slots`` not asked to leave."""
    return {worker: slot for worker, slot in slots.items() if slot.state is not SlotState.LEAVING}


def _leaving_first(slots: dict[int, ActorSlot], host: str) -> list[int]:
    """The workers of ``slots`` in the order they leave: those not started yet, then those
    off ``host`` (the loop's node), then the newest."""

    def order(worker: int) -> tuple[bool, bool, int]:
        place = slots[worker].place
        return place is not None, place is not None and place.node_id == host, -worker

    return sorted(slots, key=order)


def _placement(placement: str, host: str) -> dict[str, Any]:
    """The actor options that place an elastic pool's actor as ``placement`` says, where
    ``host`` is the node id of the loop's node."""
    if placement == "remote_only":
        return {"label_selector": {"ray.io/node-id": f"!{host}"}}
    # Ray's own libraries (Ray Data's locality) place "here first" the same way: without
    # the spill, a soft affinity waits for the node's resources instead of going elsewhere.
    # "Here only" fails at once where the node has no room, rather than waiting for it.
    first = placement == "host_first"
    return {
        "scheduling_strategy": scheduling_strategies.NodeAffinitySchedulingStrategy(
            host, soft=first, _spill_on_unavailable=first, _fail_on_unavailable=not first
        )
    }
