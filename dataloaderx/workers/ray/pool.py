"""``RayWorkers``: an epoch's tasks run on a loader's Ray actors, a lost actor's redone.

Each task is one actor call, its result waited for in the thread that asks, in waits of at
most ``POLL_SECONDS``; it names the worker it was sent to, whichever actor ran it, so the
iterator's schedule is the one thread workers have. What a lost actor, a lost result or an
actor that does not start mean: ``docs/ray-workers.md``, "Fault tolerance".
"""

from __future__ import annotations

import contextlib
import enum
import itertools
import threading
import time
from typing import Any, NamedTuple

import ray
from ray import exceptions as ray_errors
from torch.utils.data._utils.pin_memory import pin_memory
from torch.utils.data.dataloader import _DatasetKind

from dataloaderx.engine.stream import POLL_SECONDS
from dataloaderx.workers.contract import Outcome, Result, WorkerPool
from dataloaderx.workers.ray.cluster import RayGone, calls
from dataloaderx.workers.ray.group import ActorGroup, SlotState
from dataloaderx.workers.ray.heartbeat import Heartbeat
from dataloaderx.workers.ray.options import RayOptions, parse_options
from dataloaderx.workers.ray.recovery import Recovery, first_line
from dataloaderx.workers.ray.transfer import prepare, unpack

__all__ = ["RayWorkers"]

#: How long a new epoch waits for the actors an epoch left early is still giving back.
_TAKE_SECONDS = 2.0
#: How often a task is sent in all, its result lost on the way each time, before an error.
_TRIES = 3


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
    runner: int = 0
    generation: int = 0
    #: Its place in the order tasks were sent in (an actor runs its own in that order).
    sent: int = 0
    #: How often it was sent before.
    tries: int = 0
    #: An elastic pool's seed for the batch (``None``: the worker's own generators).
    seed: int | None = None


def _made(ref: Any) -> bool:
    """Whether the task of ``ref`` has a result (not an error) already."""
    if not ray.wait([ref], timeout=0, fetch_local=False)[0]:
        return False
    try:
        ray.get(ref, timeout=0)
    except ray_errors.RayError as exc:
        exc.__traceback__ = None  # Ray keeps the error: not with this thread's frames
        return False
    return True


class RayWorkers(WorkerPool):
    """``setup.num_workers`` Ray actors (a loader's, kept between its epochs); thread-safe."""

    @classmethod
    def check_options(cls, options: Any) -> RayOptions:
        return parse_options(options)

    def _start(self, name: str) -> None:
        setup = self._setup
        options: RayOptions = self._options
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._phase = Phase.RUNNING  #: guarded by ``_lock``, as everything below
        self._epoch = 0
        self._pending: dict[Any, _Task] = {}
        self._sent = itertools.count()
        group: ActorGroup | None = None
        try:  # from the take on: whatever happens, the group is given back
            prepare()
            group = self._kept.take(timeout=_TAKE_SECONDS)
            if group is not None and not group.fits(options, setup):
                group.kill()
                group = None
            if group is None:
                group = self._new_group()
            self._group = group
            self._recovery = Recovery(
                group,
                max_replacements=options.max_replacements,
                iterable=setup.dataset_kind == _DatasetKind.Iterable,
            )
            self._heartbeat = Heartbeat(options.placement_timeout_s)
            with calls():
                group.drop_abandoned()
                self._regroup()
                for worker in group.slots:
                    self._start_epoch(worker, fresh=True)
        except BaseException:
            self._give_back(group)
            raise

    # -- the worker contract --------------------------------------------------------------

    @property
    def handles(self) -> list[Any]:
        with self._lock:
            return [slot.handle for _, slot in sorted(self._group.slots.items())]

    def describe(self, worker: int) -> str:
        with self._lock:
            slot = self._group.slots.get(worker)
        return f"worker {worker}" if slot is None else f"worker {worker} ({slot})"

    def send(self, worker: int, task: int, indices: Any) -> None:
        with self._lock:
            if self._phase is Phase.RUNNING:
                with calls():
                    self._submit(_Task(self._epoch, task, worker, indices, seed=self._seed(task)))

    def new_epoch(self) -> int:
        with self._lock, calls():
            self._epoch += 1
            self._cancel_pending()
            self._recovery.delivered.clear()
            fresh = self._regroup()
            for worker in self._group.slots:
                self._start_epoch(worker, fresh=fresh)
            return self._epoch

    def starting(self) -> bool:
        with self._lock:
            return any(slot.state is SlotState.STARTING for slot in self._group.slots.values())

    def receive(self, timeout: float) -> Result | None:
        deadline = time.monotonic() + timeout
        while not self._stop.is_set():
            with calls():
                with self._lock:
                    waiting = list(self._pending)
                    starting = {
                        slot.ping: worker
                        for worker, slot in self._group.slots.items()
                        if slot.place is None
                    }
                    self._check_started()
                if waiting:
                    self._heartbeat.check(self._group)
                wait = max(0.0, min(deadline - time.monotonic(), POLL_SECONDS))
                if not waiting and not starting:
                    self._stop.wait(wait)
                    return None
                # Starting actors' answers first: ray.wait returns the first ready in order.
                ready, _ = ray.wait([*starting, *waiting], num_returns=1, timeout=wait)
                if not ready:
                    return None
                if ready[0] in starting:
                    self._started(starting[ready[0]], ready[0])
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
            with contextlib.suppress(RayGone), calls():
                self._cancel_pending()
        self._give_back(self._group)

    def _give_back(self, group: ActorGroup | None) -> None:
        """Keep ``group`` for the loader's next epoch, or end it where it cannot be kept."""
        if not self._kept.keep(group, ActorGroup.kill) and group is not None:
            group.kill()

    # -- what an elastic pool changes (under ``_lock``) ------------------------------------

    def _new_group(self) -> ActorGroup:
        """The actors of a pool that has none kept."""
        return ActorGroup(self._options, self._setup, self._kept.make_room)

    def _regroup(self) -> bool:
        """Before an epoch: change the actors as the pool wants them; whether each starts
        afresh (as a new worker). A fixed count keeps them."""
        return False

    def _shards(self) -> int:
        """How many workers each actor is one of."""
        return self._setup.num_workers

    def _seed(self, task: int) -> int | None:
        """The seed of task number ``task``'s batch, where it has its own."""
        return None

    def _runner(self, worker: int) -> int:
        """The worker whose actor runs a task of ``worker``."""
        return self._recovery.runner(worker)

    def _gave_way(self, worker: int) -> bool:
        """``worker``'s actor could not start: whether it gives way (its tasks to the others)
        rather than fail the epoch. A fixed count's does not."""
        return False

    def _replace_lost(self, worker: int, cause: BaseException, making: Any) -> None:
        """``worker``'s actor was lost making the task ``making``: replace it, or raise."""
        self._recovery.lost(worker, self._group.slots[worker], cause, making)
        self._group.replace(worker)
        self._start_epoch(worker, fresh=True)

    # -- tasks ----------------------------------------------------------------------------

    def _start_epoch(self, worker: int, fresh: bool) -> None:
        slot = self._group.slots[worker]
        slot.handle.start_epoch.remote(
            [self._group.payload_ref], self._setup.base_seed, fresh, self._shards()
        )

    def _submit(self, task: _Task) -> None:
        runner = self._runner(task.worker)
        slot = self._group.slots[runner]
        task = task._replace(runner=runner, generation=slot.generation, sent=next(self._sent))
        ref = slot.handle.fetch.remote(self._group.ticket(), task.indices, task.seed)
        self._pending[ref] = task

    def _cancel_pending(self) -> None:
        """Drop the tasks sent: each actor skips those it has not started. (Not
        ``ray.cancel``: an actor waits 30 s for a cancelled task's place in its order.)"""
        pending, self._pending = self._pending, {}
        self._group.abandon(list(pending))

    def _collect(self, ref: Any) -> Result | None:
        """The result of ``ref``; ``None`` when it is not this epoch's, or is redone."""
        with self._lock:
            task = self._pending.pop(ref, None)
        if task is None:
            return None
        try:
            outcome, payload = ray.get(ref, timeout=self._options.placement_timeout_s)
        except (ray_errors.ObjectLostError, ray_errors.ActorUnavailableError) as exc:
            exc.__traceback__ = None  # Ray keeps the error: not with this thread's frames
            self._again(task, exc)
            return None
        except ray_errors.RayActorError as exc:  # its actor is gone: the result never comes
            exc.__traceback__ = None
            self._lost(task, exc)
            return None
        except ray_errors.RayError as exc:  # the call itself failed: the worker is unusable
            outcome, payload = Outcome.FATAL, exc
        if outcome is Outcome.BATCH:
            payload = unpack(payload)
            if self._setup.pin is not None:
                payload = pin_memory(payload, self._setup.pin[0])  # type: ignore[no-untyped-call]
        with self._lock:
            self._recovery.delivered.add(task.worker)
        return Result(task.epoch, task.task, task.worker, outcome, payload)

    def _again(self, task: _Task, cause: BaseException) -> None:
        """Send ``task`` again, its result lost, or its actor out of reach for now (asked
        again soon, uncounted: the heartbeat tells a cluster gone); raise where it cannot be
        made again."""
        lost = isinstance(cause, ray_errors.ObjectLostError)
        iterable = self._setup.dataset_kind == _DatasetKind.Iterable
        if task.tries + lost >= _TRIES or iterable:
            why = (
                "an iterable dataset's cannot be made again" if iterable else f"sent {_TRIES} times"
            )
            raise RuntimeError(
                f"the batch of indices {task.indices} of DataLoader worker {task.worker} was "
                f"lost on its way to the loop ({first_line(cause)}; {why}); check the Ray "
                "cluster's object store (memory, spilling) and its nodes"
            ) from cause
        if not lost:
            self._stop.wait(POLL_SECONDS)
        with self._lock:
            if self._phase is Phase.RUNNING:
                self._submit(task._replace(tries=task.tries + lost))

    # -- actors ---------------------------------------------------------------------------

    def _lost(self, task: _Task, cause: BaseException) -> None:
        """Redo ``task`` and every other task of its lost actor; replace that actor once."""
        with self._lock:
            if self._phase is Phase.CLOSED:
                return
            slot = self._group.slots.get(task.runner)
            redo = [task]
            for ref, other in list(self._pending.items()):
                mine = (other.runner, other.generation) == (task.runner, task.generation)
                if mine and not _made(ref):  # what it made before it died is kept
                    redo.append(self._pending.pop(ref))
            if slot is not None and slot.generation == task.generation:  # the first news
                making = min(redo, key=lambda each: each.sent)  # it ran them in that order
                self._replace_lost(task.runner, cause, (making.task, making.indices, making.worker))
            for lost in sorted(redo, key=lambda each: each.task):
                self._submit(lost)

    def _started(self, worker: int, ping: Any) -> None:
        """Note the answer ``ping`` of ``worker``'s actor; raise if it could not start."""
        try:
            place = ray.get(ping, timeout=self._options.placement_timeout_s)
        except ray_errors.RayError as exc:
            with self._lock:
                slot = self._group.slots.get(worker)
                if slot is None or slot.ping is not ping:
                    return
                if self._gave_way(worker):
                    return
            raise RuntimeError(
                f"DataLoader worker {worker} ({slot}) could not start: {first_line(exc)}; "
                "check worker_options (runtime_env, resources) and the cluster's logs"
            ) from exc
        with self._lock:
            slot = self._group.slots.get(worker)
            if slot is not None and slot.ping is ping:
                slot.place = place
                if slot.state is not SlotState.LEAVING:
                    slot.state = SlotState.READY

    def _check_started(self) -> None:
        """Raise for an actor that has not started in time while tasks wait for it (under
        the lock); a replacement's tasks run elsewhere meanwhile."""
        now = time.monotonic()
        for worker, slot in self._group.slots.items():
            if slot.state is SlotState.STARTING and slot.deadline < now:
                raise RuntimeError(
                    f"DataLoader worker {worker} ({slot}) did not start on the Ray cluster "
                    "within worker_options['placement_timeout_s']="
                    f"{self._options.placement_timeout_s!r} s; check that the cluster is up "
                    "and has room for the actors"
                )
