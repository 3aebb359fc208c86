"""``ElasticWorkersIterator``: ``DataLoader``'s iterator over an elastic pool, which tells the
loader's :class:`~dataloaderx.workers.elastic.scaling.Scaling` each wait for the pool's next
batch and each batch handed out, resizes the pool where the scaling decides to, and tells
the pool when it idles until the next epoch."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from torch.utils.data import DataLoader

from dataloaderx.workers.contract import KeptWorkers, Result, WorkerPool
from dataloaderx.workers.elastic.scaling import Scaling
from dataloaderx.workers.iterator import WorkersIterator
from dataloaderx.workers.schedule import Schedule

__all__ = ["ElasticWorkersIterator"]


class ElasticWorkersIterator(WorkersIterator):
    """A :class:`WorkersIterator` whose pool ``scaling`` sizes (``num_workers`` is the most
    workers); ``origin`` says which epoch of the loader starts, and after how many of its
    batches (a resumed one), for each batch's seed."""

    def __init__(
        self,
        loader: DataLoader[Any],
        pool_class: type[WorkerPool],
        options: Any,
        kept: KeptWorkers | None,
        *,
        scaling: Scaling,
        origin: Callable[[], tuple[int, int]],
    ) -> None:
        self._scaling = scaling
        self._origin = origin
        super().__init__(loader, pool_class, options, kept, workers=scaling.workers)

    def _start_epoch(self, first_iter: bool) -> None:
        pool, scaling = self._pool, self._scaling
        pool.resize(scaling.workers)  # before the epoch: an iterable dataset's count changes there
        scaling.new_epoch()
        if not first_iter:
            self._epoch = pool.new_epoch()
        pool.set_origin(*self._origin())
        self._schedule = Schedule(pool.scheduled_workers(), self._prefetch_factor, self._in_order)
        self._schedule.limit = self._prefetch_factor * pool.resize(scaling.workers)

    def _next_data(self) -> Any:
        try:
            return super()._next_data()
        except StopIteration:
            if not self._shutdown:  # persistent workers: the pool stays open, idle
                self._rest(self._scaling.bounds.min_workers)
            raise

    def _shutdown_workers(self) -> None:
        if not self._shutdown:
            super()._shutdown_workers()
            self._rest(0)

    def _rest(self, keep: int) -> None:
        """Until the next epoch, the pool may end its workers idle, but ``keep``: an open
        pool's ``min_workers``, none of a closed one's (workers not persistent)."""
        self._pool.idle(keep, self._scaling.idled)

    def _receive(self) -> Result:
        start = time.perf_counter()
        try:
            return super()._receive()
        finally:
            self._scaling.waited(time.perf_counter() - start)

    def _open(self, result: Result) -> Any:
        pool, scaling = self._pool, self._scaling
        running = pool.resize(scaling.workers)
        workers = scaling.handed_out(running, pool.resizing(), pool.cpu_seconds())
        if workers is None and scaling.sizing:
            share = pool.cpu_share()
            if share is not None:
                workers = scaling.size(share)
        if workers is not None:
            running = pool.resize(workers)
        self._schedule.limit = self._prefetch_factor * running
        return super()._open(result)
