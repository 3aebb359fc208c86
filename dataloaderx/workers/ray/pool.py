"""``RayWorkers``: an epoch's tasks run on a loader's Ray actors, a lost actor's redone.

Each task is one actor call; the results are waited for here, in the thread that asks for
them, in waits of at most ``POLL_SECONDS`` that end once :meth:`RayWorkers.close` was
called. A task's result names the worker it was sent to, whichever actor ran it, so the
iterator's schedule (order, timeouts, errors) is the one thread workers have.

A lost actor (its process or node died): its outstanding tasks are sent again at once,
and its replacement starts meanwhile; :class:`~dataloaderx.workers.ray.recovery.Recovery`
says whether it may be replaced and which actors run the tasks. A replacement that fails to
start is an error, as are actors that do not start within ``placement_timeout_s`` while
none is ready.
"""

from __future__ import annotations

import enum
import threading
import time
from collections.abc import Mapping
from typing import Any, NamedTuple

import ray
from ray import exceptions as ray_errors
from torch.utils.data._utils.pin_memory import pin_memory
from torch.utils.data.dataloader import _DatasetKind

from dataloaderx.engine.stream import POLL_SECONDS
from dataloaderx.workers.contract import Outcome, Result, WorkerPool, WorkerSetup
from dataloaderx.workers.ray.actor import EpochSetup
from dataloaderx.workers.ray.group import ActorGroup, SlotState
from dataloaderx.workers.ray.heartbeat import Heartbeat
from dataloaderx.workers.ray.options import RayOptions, parse_options
from dataloaderx.workers.ray.recovery import Recovery, first_line
from dataloaderx.workers.ray.transfer import prepare, unpack

__all__ = ["RayWorkers"]

#: How long a new epoch waits for the actors an epoch left early is still giving back.
_TAKE_SECONDS = 2.0
#: Errors that mean a task's result is gone, though its actor may live (checked first).
_LOST_RESULT = (ray_errors.ObjectLostError, ray_errors.ActorUnavailableError)
#: Errors that mean a task's actor is gone (its result will never come from it).
_LOST_ACTOR = (ray_errors.RayActorError,)


class Phase(enum.Enum):
    """The pool's life."""

    RUNNING = "running"
    CLOSED = "closed"


class _Task(NamedTuple):
    epoch: int
    task: int
    worker: int
    indices: Any
    #: The worker whose actor runs it, and that actor's generation.
    runner: int
    generation: int


def _shipped_setup(setup: WorkerSetup) -> Any:
    """The epoch's setup in the object store; an error names the argument that fails."""
    for name, value in (("collate_fn", setup.collate_fn), ("worker_init_fn", setup.init_fn)):
        try:
            ray.cloudpickle.dumps(value)  # type: ignore[no-untyped-call]
        except Exception as exc:
            raise TypeError(
                f"{name}={value!r} cannot be sent to Ray workers: cloudpickle fails ({exc}); "
                "make it picklable (a module-level function, or an object whose members "
                "pickle), or use worker_method='thread'"
            ) from exc
    epoch_setup = EpochSetup(
        setup.dataset_kind, setup.auto_collation, setup.collate_fn, setup.drop_last, setup.init_fn
    )
    return ray.put(epoch_setup)


class RayWorkers(WorkerPool):
    """``setup.num_workers`` Ray actors (a loader's, kept between its epochs); thread-safe."""

    @classmethod
    def check_options(cls, options: Mapping[str, Any]) -> Mapping[str, Any]:
        parse_options(options)
        return dict(options)

    def _start(self, name: str) -> None:
        setup = self._setup
        self._options: RayOptions = parse_options(self._given_options)
        prepare()
        group = self._kept.take(timeout=_TAKE_SECONDS)
        if isinstance(group, ActorGroup) and (
            group.num_workers != setup.num_workers or group.options != self._options
        ):
            group.kill()
            group = None
        if group is not None:
            group.drop_abandoned()
        try:
            if group is None:
                group = ActorGroup(self._options, setup.num_workers, setup.dataset)
            self._setup_ref = _shipped_setup(setup)
        except BaseException:
            self._give_back(group)
            raise
        self._group: ActorGroup = group
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._phase = Phase.RUNNING  #: guarded by ``_lock``, as everything below
        self._epoch = 0
        self._pending: dict[Any, _Task] = {}
        self._recovery = Recovery(
            group,
            max_replacements=self._options.max_replacements,
            iterable=setup.dataset_kind == _DatasetKind.Iterable,
        )
        self._heartbeat = Heartbeat(self._options.placement_timeout_s)
        for worker in range(setup.num_workers):
            self._start_epoch(worker, fresh=True)

    # -- the worker contract --------------------------------------------------------------

    @property
    def handles(self) -> list[Any]:
        return [slot.handle for slot in self._group.slots]

    def describe(self, worker: int) -> str:
        return f"worker {worker} ({self._group.slots[worker]})"

    def send(self, worker: int, task: int, indices: Any) -> None:
        with self._lock:
            if self._phase is Phase.RUNNING:
                self._submit(_Task(self._epoch, task, worker, indices, worker, 0))

    def new_epoch(self) -> int:
        with self._lock:
            self._epoch += 1
            self._cancel_pending()
            for worker in range(self._setup.num_workers):
                self._start_epoch(worker, fresh=False)
            return self._epoch

    def ended(self) -> list[int]:
        return []  # a lost actor is replaced, or receive() raises

    def starting(self) -> bool:
        with self._lock:
            return any(slot.state is SlotState.STARTING for slot in self._group.slots)

    def receive(self, timeout: float) -> Result | None:
        deadline = time.monotonic() + timeout
        while not self._stop.is_set():
            if not ray.is_initialized():  # a call now would start a new Ray
                raise RuntimeError(
                    "Ray was shut down while DataLoader workers (worker_method='ray') had "
                    "batches to make; shut Ray down after the loop is done with the loader"
                )
            with self._lock:
                waiting = list(self._pending)
                starting = {
                    slot.ping: worker
                    for worker, slot in enumerate(self._group.slots)
                    if slot.state is not SlotState.READY
                }
                self._check_started()
                if waiting:
                    self._heartbeat.check(self._group)
            wait = max(0.0, min(deadline - time.monotonic(), POLL_SECONDS))
            if not waiting and not starting:
                self._stop.wait(wait)
                return None
            ready, _ = ray.wait(
                [*waiting, *starting, *self._heartbeat.pings], num_returns=1, timeout=wait
            )
            if not ready:
                return None
            if ready[0] in starting:
                self._heartbeat.heard()
                self._started(starting[ready[0]], ready[0])
                continue
            if self._heartbeat.answered(ready[0]):
                continue
            result = self._collect(ready[0])
            if result is not None:
                self._heartbeat.heard()
                return result
            if time.monotonic() >= deadline:
                return None
        return None

    def close(self) -> None:
        self._stop.set()
        with self._lock:
            if self._phase is Phase.CLOSED:
                return
            self._phase = Phase.CLOSED
            self._cancel_pending()
        self._give_back(self._group)

    def _give_back(self, group: ActorGroup | None) -> None:
        """Keep ``group`` for the loader's next epoch, or end it where it cannot be kept."""
        if not self._kept.keep(group, ActorGroup.kill) and group is not None:
            group.kill()

    # -- tasks ----------------------------------------------------------------------------

    def _start_epoch(self, worker: int, fresh: bool) -> None:
        slot = self._group.slots[worker]
        slot.handle.start_epoch.remote(
            [self._setup_ref], [self._group.dataset_ref], self._setup.base_seed, fresh
        )

    def _submit(self, task: _Task) -> None:
        runner = self._recovery.runner(task.worker)
        slot = self._group.slots[runner]
        task = task._replace(runner=runner, generation=slot.generation)
        self._pending[slot.handle.fetch.remote(self._group.ticket(), task.indices)] = task

    def _cancel_pending(self) -> None:
        """Drop the tasks sent: each actor skips those it has not started. (Not
        ``ray.cancel``: an actor waits 30 s for a cancelled task's place in its order.)"""
        pending, self._pending = self._pending, {}
        if ray.is_initialized():  # Ray shut down first: nothing left to skip
            self._group.abandon(list(pending))

    def _collect(self, ref: Any) -> Result | None:
        """The result of ``ref``; ``None`` when it is not this epoch's, or was redone."""
        with self._lock:
            task = self._pending.pop(ref, None)
        if task is None:
            return None
        try:
            outcome, payload = ray.get(ref, timeout=self._options.placement_timeout_s)
        except _LOST_RESULT as exc:
            exc.__traceback__ = None  # Ray keeps the error: not with this thread's frames
            with self._lock:
                if self._phase is Phase.RUNNING:
                    self._submit(task)
            return None
        except _LOST_ACTOR as exc:
            exc.__traceback__ = None
            self._lost(task, exc)
            return None
        except ray_errors.RayError as exc:  # the call itself failed: the worker is unusable
            outcome, payload = Outcome.FATAL, exc
        if outcome is Outcome.BATCH:
            payload = unpack(payload)
            if self._setup.pin is not None:
                payload = pin_memory(payload, self._setup.pin[0])  # type: ignore[no-untyped-call]
        return Result(task.epoch, task.task, task.worker, outcome, payload)

    # -- lost actors ----------------------------------------------------------------------

    def _lost(self, task: _Task, cause: BaseException) -> None:
        """Redo ``task`` and every other task of its lost actor; replace that actor once."""
        with self._lock:
            if self._phase is Phase.CLOSED:
                return
            slot = self._group.slots[task.runner]
            if slot.generation == task.generation:  # the first news of this loss
                self._recovery.lost(task.runner, slot, cause)
                self._group.replace(task.runner)
                self._start_epoch(task.runner, fresh=True)
            redo = [task]
            for ref, other in list(self._pending.items()):
                if (other.runner, other.generation) == (task.runner, task.generation):
                    redo.append(self._pending.pop(ref))
            for lost in sorted(redo, key=lambda each: each.task):
                self._submit(lost)

    def _started(self, worker: int, ping: Any) -> None:
        """Note the answer ``ping`` of ``worker``'s actor; raise if it could not start."""
        try:
            place = ray.get(ping, timeout=self._options.placement_timeout_s)
        except ray_errors.RayError as exc:
            with self._lock:
                slot = self._group.slots[worker]
                if slot.ping is not ping:
                    return
            raise RuntimeError(
                f"DataLoader worker {worker} ({slot}) could not start: {first_line(exc)}; "
                "check worker_options (runtime_env, resources) and the cluster's logs"
            ) from exc
        with self._lock:
            slot = self._group.slots[worker]
            if slot.ping is ping:
                slot.place, slot.state = place, SlotState.READY

    def _check_started(self) -> None:
        """Raise when no actor is ready and one has not started in time (under the lock)."""
        slots = self._group.slots
        if any(slot.state is SlotState.READY for slot in slots):
            return
        now = time.monotonic()
        late = [worker for worker, slot in enumerate(slots) if slot.deadline < now]
        if late:
            raise RuntimeError(
                f"DataLoader worker(s) {late} did not start on the Ray cluster within "
                f"worker_options['placement_timeout_s']={self._options.placement_timeout_s!r}"
                " s and no other worker is ready; check that the cluster is up and has "
                "room for the actors"
            )
