"""The worker in a Ray actor's process: it keeps the worker contract of a worker process.

Each epoch it starts afresh as a new worker process would (``fresh``): the global
generators seeded from ``base_seed + id`` (numpy's through torch's ``_generate_state``),
``get_worker_info()`` set for the process, ``worker_init_fn(id)`` called; or, with
persistent workers, only a new fetcher. The actor's process keeps one intra-op torch
thread. An actor on the loop's machine hands batches over as a worker process does:
``get_worker_info()`` is torch's own global, so that ``default_collate`` stacks into shared
memory (files the loop maps: :mod:`~dataloaderx.workers.ray.shared`); elsewhere the
worker's info is hidden from that collation, and tensors go through the object store.
Every task answers with an :class:`~dataloaderx.workers.contract.Outcome` and a payload:
the batch with its tensors packed for the hand-over, or the error wrapped as a worker
process wraps it, naming the worker, the node and the process.
"""

from __future__ import annotations

import os
import random
import threading
from collections.abc import Callable
from typing import Any, Final, NamedTuple

import numpy
import ray
import torch
from torch._utils import ExceptionWrapper
from torch.utils.data._utils import worker as torch_worker
from torch.utils.data.dataloader import _DatasetKind

from dataloaderx.workers.contract import Outcome
from dataloaderx.workers.info import install, set_process_info, worker_info
from dataloaderx.workers.ray.shared import SharedMemory, machine, share_by_name
from dataloaderx.workers.ray.transfer import pack

__all__ = ["CONTROL", "EpochSetup", "Place", "RayWorker"]

#: The actor's concurrency group for calls that run beside its tasks, not after them.
CONTROL: Final = "control"


class EpochSetup(NamedTuple):
    """The loader's arguments a worker makes its fetcher from (the dataset travels apart)."""

    dataset_kind: int
    auto_collation: bool
    collate_fn: Callable[[Any], Any]
    drop_last: bool
    init_fn: Callable[[int], None] | None


class Place(NamedTuple):
    """Where an actor runs."""

    node_ip: str
    node_id: str
    pid: int

    def __str__(self) -> str:
        return f"node {self.node_ip} ({self.node_id[:8]}), pid {self.pid}"


def _node_address(node_id: str) -> str:
    """The address of the Ray node ``node_id``, as the cluster knows it."""
    for node in ray.nodes():  # type: ignore[no-untyped-call]
        if node.get("NodeID") == node_id:
            return str(node.get("NodeManagerAddress", "?"))
    return "?"


class RayWorker:
    """Worker ``worker_id`` of ``num_workers``; ``shared`` says where the loop runs
    (``None``: hand everything over through the object store). The dataset comes with the
    first epoch (:meth:`start_epoch`), so that an actor starts while the loop ships it."""

    def __init__(
        self,
        worker_id: int,
        num_workers: int,
        shared: SharedMemory | None,
    ) -> None:
        torch.set_num_threads(1)
        install()
        #: The prefix of this actor's shared-memory files, on the loop's machine only.
        self._prefix = None if shared is None or shared.machine != machine() else shared.prefix
        if self._prefix is not None:
            share_by_name(self._prefix)
        self._id = worker_id
        self._num_workers = num_workers
        self._dataset: Any = None
        node_id = ray.get_runtime_context().get_node_id()
        self._place = Place(_node_address(node_id), node_id, os.getpid())
        self._fetcher: Any = None
        self._failure: ExceptionWrapper | None = None
        self._iterable = False
        self._exhausted = False
        self._skip_lock = threading.Lock()
        self._skip_through = 0  #: guarded by ``_skip_lock``: tasks up to it are skipped

    def place(self) -> Place:
        """Where this actor runs; answered once it has started."""
        return self._place

    def start_epoch(
        self, setup_ref: list[Any], dataset_ref: list[Any], base_seed: int, fresh: bool
    ) -> None:
        """Make this epoch's fetcher from the :class:`EpochSetup` of ``setup_ref[0]`` and,
        unless it holds it already, the dataset of ``dataset_ref[0]``; with ``fresh``, first
        start as a new worker process would. (The references come in lists so that Ray hands
        them over unresolved: a dataset that fails to load is the first batch's outcome, as
        in a worker process.)"""
        self._exhausted = False
        self._fetcher, self._failure = None, None
        try:
            setup: EpochSetup = ray.get(setup_ref[0])
            self._iterable = setup.dataset_kind == _DatasetKind.Iterable
            if self._dataset is None:
                self._dataset = ray.get(dataset_ref[0])
            if fresh:
                self._seed(base_seed)
                if setup.init_fn is not None:
                    setup.init_fn(self._id)
            self._fetcher = _DatasetKind.create_fetcher(  # type: ignore[no-untyped-call]
                setup.dataset_kind,
                self._dataset,
                setup.auto_collation,
                setup.collate_fn,
                setup.drop_last,
            )
        except Exception:  # noqa: BLE001 - the outcome of the epoch's tasks
            self._failure = self._wrapped()

    def _seed(self, base_seed: int) -> None:
        seed = base_seed + self._id
        random.seed(seed)
        torch.manual_seed(seed)
        numpy.random.seed(torch_worker._generate_state(base_seed, self._id))  # type: ignore[no-untyped-call]
        info = worker_info(self._dataset, self._id, self._num_workers, base_seed, method="ray")
        if self._prefix is not None:
            torch_worker._worker_info = info
        else:
            set_process_info(info)

    @ray.method(concurrency_group=CONTROL)
    def skip_through(self, ticket: int) -> None:
        """Skip the tasks numbered up to ``ticket`` not yet started (an epoch left early);
        runs beside the task under way."""
        with self._skip_lock:
            self._skip_through = max(self._skip_through, ticket)

    def fetch(self, ticket: int, indices: Any) -> tuple[Outcome, Any] | None:
        """The batch of ``indices`` (ignored for an iterable dataset), or why there is none;
        ``None`` for a task skipped (task number ``ticket``)."""
        with self._skip_lock:
            if ticket <= self._skip_through:
                return None
        if self._failure is not None:
            return Outcome.FAILED, self._failure
        if self._exhausted:
            return Outcome.EXHAUSTED, None
        try:
            return Outcome.BATCH, pack(self._fetcher.fetch(indices), self._prefix)
        except StopIteration:
            if self._iterable:
                self._exhausted = True
                return Outcome.EXHAUSTED, None
            return Outcome.FAILED, self._wrapped()
        except Exception:  # noqa: BLE001 - handed to the loop
            return Outcome.FAILED, self._wrapped()
        except BaseException as exc:  # noqa: BLE001 - the loop raises it
            return Outcome.FATAL, exc

    def _wrapped(self) -> ExceptionWrapper:
        """The exception being handled, as a worker process hands it over."""
        where = f"in DataLoader worker {self._id} (Ray actor on {self._place})"
        return ExceptionWrapper(where=where)  # type: ignore[no-untyped-call]
