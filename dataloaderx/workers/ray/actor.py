"""The worker in a Ray actor's process: a :class:`~dataloaderx.workers.core.WorkerCore`
started as a worker process starts, from one payload of the loader's arguments
(:func:`payload`), its batches handed over by :mod:`~dataloaderx.workers.ray.transfer`.
"""

from __future__ import annotations

import functools
import os
import threading
from typing import Any, Final, NamedTuple

import ray
import torch

from dataloaderx.workers.contract import Outcome, WorkerSetup
from dataloaderx.workers.core import WorkerCore, WorkerKind
from dataloaderx.workers.ray.shared import SharedMemory, machine, share_by_name
from dataloaderx.workers.ray.transfer import pack

__all__ = ["CONTROL", "Place", "RayWorker", "payload"]

#: The actor's concurrency group for calls that run beside its tasks, not after them.
CONTROL: Final = "control"


class Place(NamedTuple):
    """Where an actor runs."""

    node_ip: str
    node_id: str
    pid: int

    def __str__(self) -> str:
        return f"node {self.node_ip} ({self.node_id[:8]}), pid {self.pid}"


def payload(setup: WorkerSetup) -> bytes:
    """``setup`` pickled in one piece; a ``TypeError`` names an argument that cannot be."""
    try:
        return ray.cloudpickle.dumps(setup._replace(pin=None, base_seed=0))  # type: ignore[no-any-return,no-untyped-call]
    except Exception as exc:
        shipped = {"dataset": setup.dataset, "collate_fn": setup.collate_fn}
        for argument, value in {**shipped, "worker_init_fn": setup.init_fn}.items():
            try:
                ray.cloudpickle.dumps(value)  # type: ignore[no-untyped-call]
            except Exception:  # noqa: BLE001 - the one to name
                shown = type(value).__name__ if argument == "dataset" else repr(value)
                raise TypeError(
                    f"{argument}={shown} cannot be sent to Ray workers: "
                    f"{_unpicklable(value, exc)}; make it picklable with cloudpickle (open "
                    "files, locks and connections in worker_init_fn or on first use "
                    "instead), or use worker_method='thread'"
                ) from exc
        raise


def _unpicklable(value: Any, error: Exception) -> str:
    """The first attribute of ``value`` cloudpickle cannot pickle, described."""
    for name, member in vars(value).items() if hasattr(value, "__dict__") else ():
        try:
            ray.cloudpickle.dumps(member)  # type: ignore[no-untyped-call]
        except Exception as exc:  # noqa: BLE001 - what to report
            return f"its member {name!r} ({type(member).__name__}) cannot be pickled ({exc})"
    return f"it cannot be pickled ({error})"


class RayWorker:
    """Worker ``worker_id``; ``shared`` says where the loop runs (``None``: hand everything
    over through the object store)."""

    def __init__(self, worker_id: int, shared: SharedMemory | None) -> None:
        torch.set_num_threads(1)
        prefix = None if shared is None or shared.machine != machine() else shared.prefix
        if prefix is not None:
            share_by_name(prefix)
        node_id = ray.get_runtime_context().get_node_id()
        self._place = Place(ray.util.get_node_ip_address(), node_id, os.getpid())  # type: ignore[no-untyped-call]
        self._payload: Any = None
        #: The count of workers the core was started as one of (0: not started yet).
        self._num_workers = 0
        self._make_core = functools.partial(
            WorkerCore,
            self._load,
            worker_id,
            kind=WorkerKind.PROCESS if prefix is None else WorkerKind.SHARED_MEMORY_PROCESS,
            method="ray",
            where=f"in DataLoader worker {worker_id} (Ray actor on {self._place})",
            finish=functools.partial(pack, prefix=prefix),
        )
        self._core = self._make_core()
        self._skip_lock = threading.Lock()
        self._skip_through = 0  #: guarded by ``_skip_lock``: tasks up to it are skipped

    def place(self) -> Place:
        """Where this actor runs; answered once it has started."""
        return self._place

    def start_epoch(
        self, payload_ref: list[Any], base_seed: int, fresh: bool, num_workers: int
    ) -> None:
        """Start an epoch (see :meth:`WorkerCore.start_epoch`) as one of ``num_workers``
        workers; the payload comes in a list, so that Ray hands it over unresolved: one that
        fails to load is the first batch's outcome, as in a worker process."""
        self._payload = payload_ref[0]
        if fresh and self._num_workers not in (0, num_workers):
            self._core = self._make_core()  # an iterable dataset's shards changed
        self._num_workers = num_workers
        self._core.start_epoch(base_seed, fresh=fresh)

    def _load(self) -> WorkerSetup:
        setup: WorkerSetup = ray.cloudpickle.loads(ray.get(self._payload))
        return setup._replace(num_workers=self._num_workers)

    @ray.method(concurrency_group=CONTROL)
    def skip_through(self, ticket: int) -> None:
        """Skip the tasks numbered up to ``ticket`` not yet started (an epoch left early);
        runs beside the task under way."""
        with self._skip_lock:
            self._skip_through = max(self._skip_through, ticket)

    @ray.method(enable_task_events=False)
    def fetch(self, ticket: int, indices: Any, seed: int | None) -> tuple[Outcome, Any] | None:
        """The outcome of task number ``ticket``, the batch of ``indices``; ``None`` for a
        task skipped. An elastic pool's batch comes with its ``seed``
        (:meth:`WorkerCore.seed_batch`). Ray records no task events for it
        (``docs/ray-workers.md``: "What differs from processes and threads")."""
        with self._skip_lock:
            if ticket <= self._skip_through:
                return None
        if seed is not None:
            self._core.seed_batch(seed)
        return self._core.run(indices)
