"""``DataLoader``'s iterator over the workers of a worker method other than processes.

It is a ``_BaseDataLoaderIter``, as PyTorch's own iterators are: the sampler, the base seed
drawn from the loader's ``generator``, ``len()``, the persistent-workers reset and the
profiler label are PyTorch's. What differs is where a batch is made: a worker of a
:class:`~dataloaderx.workers.contract.WorkerPool` (a thread of this process, a Ray actor),
while this iterator keeps the order, the timeout and the errors for every method. The
shutdown: the end of a non-persistent epoch, ``_shutdown_workers()`` (the loader's release
of a left epoch) and garbage collection close the pool; the pool holds no reference to this
iterator.
"""

from __future__ import annotations

import os
import time
import traceback
import weakref
from typing import Any, NoReturn

import torch
from torch._utils import ExceptionWrapper
from torch.utils.data import DataLoader
from torch.utils.data.dataloader import _BaseDataLoaderIter

from dataloaderx.engine.producer import thread_name
from dataloaderx.engine.stream import POLL_SECONDS
from dataloaderx.workers.contract import KeptWorkers, Outcome, Result, WorkerPool, WorkerSetup
from dataloaderx.workers.info import install
from dataloaderx.workers.schedule import Schedule

__all__ = ["WorkersIterator"]


def _stop(workers: WorkerPool, owner_pid: int) -> None:
    if os.getpid() == owner_pid:  # a forked child has none of these workers
        workers.close()


def _reraise(wrapper: ExceptionWrapper) -> NoReturn:
    """Raise a worker's error as ``DataLoader`` does (its type, and the worker's traceback in
    the message), without the reference cycle PyTorch's ``reraise`` leaves in its frame."""
    try:
        wrapper.reraise()  # type: ignore[no-untyped-call]
    except BaseException as error:
        traceback.clear_frames(error.__traceback__)
        raise
    raise RuntimeError(f"a DataLoader worker failed: {wrapper.exc_msg}")


class WorkersIterator(_BaseDataLoaderIter):
    """One epoch (or, with ``persistent_workers``, every epoch) of a loader whose workers
    are a ``pool_class``'s, given its checked ``options``."""

    def __init__(
        self,
        loader: DataLoader[Any],
        pool_class: type[WorkerPool],
        options: Any = None,
        kept: KeptWorkers | None = None,
        *,
        workers: int | None = None,
    ) -> None:
        """``workers``: how many workers an elastic pool starts with (``num_workers`` is
        then the most it runs)."""
        super().__init__(loader)
        install()
        self._prefetch_factor: int = loader.prefetch_factor or 2
        self._in_order = loader.in_order
        pin = None
        device_type = self._pin_memory_device
        if self._pin_memory and device_type is not None:  # on the current device, as DataLoader
            pin = (device_type, torch.accelerator.current_device_index())
        setup = WorkerSetup(
            dataset_kind=self._dataset_kind,
            dataset=self._dataset,
            auto_collation=self._auto_collation,
            collate_fn=self._collate_fn,
            drop_last=self._drop_last,
            init_fn=loader.worker_init_fn,
            num_workers=self._num_workers,
            base_seed=int(self._base_seed),
            pin=pin,
        )
        self._pool = pool_class(setup, thread_name("worker"), options, kept, workers=workers)
        #: The workers, by worker id (where PyTorch's iterator has its processes).
        self._workers = self._pool.handles
        self._finalizer = weakref.finalize(self, _stop, self._pool, os.getpid())
        self._shutdown = False
        self._epoch = 0
        self._reset(loader, first_iter=True)

    def _reset(self, loader: DataLoader[Any], first_iter: bool = False) -> None:
        super()._reset(loader, first_iter)
        self._start_epoch(first_iter)
        for _ in range(self._schedule.limit):
            self._try_put_index()

    def _start_epoch(self, first_iter: bool) -> None:
        """The epoch's pool and schedule, before its first tasks are sent."""
        if not first_iter:
            self._epoch = self._pool.new_epoch()
        self._schedule = Schedule(self._num_workers, self._prefetch_factor, self._in_order)

    def _try_put_index(self) -> None:
        worker = self._schedule.next_worker()
        if worker is None:
            return
        try:
            indices = self._next_index()  # type: ignore[no-untyped-call]
        except StopIteration:
            return
        self._pool.send(worker, self._schedule.sent_to(worker), indices)

    def _next_data(self) -> Any:
        schedule = self._schedule
        while True:
            result = schedule.ready()
            if result is None:
                if schedule.done or self._shutdown:  # nothing is out: the epoch is over
                    if not self._persistent_workers:
                        self._shutdown_workers()
                    raise StopIteration
                result = schedule.arrived(self._receive())
                if result is None:  # it came early, or its worker ran out of batches
                    self._try_put_index()
                    continue
            schedule.handed_out(result)
            self._try_put_index()
            return self._open(result)

    def _receive(self) -> Result:
        """The next result of this epoch; raise after ``timeout`` seconds, as ``DataLoader``,
        or when a worker ended without one."""
        timeout = self._timeout
        deadline = time.monotonic() + timeout if timeout > 0 else None
        while True:
            wait = POLL_SECONDS if deadline is None else max(0.0, deadline - time.monotonic())
            result = self._pool.receive(min(wait, POLL_SECONDS))
            if result is not None:
                if result.epoch == self._epoch:
                    return result
                continue  # a task of an earlier epoch that was running when it was left
            if deadline is not None and self._pool.starting():
                deadline = time.monotonic() + timeout
            if deadline is not None and time.monotonic() >= deadline:
                raise RuntimeError(f"DataLoader timed out after {timeout} seconds")
            ended = self._pool.ended()
            if ended:  # as DataLoader says of a dead worker process
                named = ", ".join(self._pool.describe(worker) for worker in ended)
                raise RuntimeError(f"DataLoader {named} exited unexpectedly")

    def _open(self, result: Result) -> Any:
        if result.outcome is Outcome.BATCH:
            return result.payload
        if result.outcome is Outcome.FAILED:
            _reraise(result.payload)
        raise RuntimeError(
            f"DataLoader {self._pool.describe(result.worker)} exited unexpectedly: "
            f"{result.payload!r}"
        ) from result.payload

    def _shutdown_workers(self) -> None:
        """Stop the workers (once); as PyTorch's iterator's, which the loader calls."""
        if not self._shutdown:
            self._shutdown = True
            self._finalizer()
