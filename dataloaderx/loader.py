"""``DataLoaderX``: a ``DataLoader`` whose iterator prefetches through a backend."""

from __future__ import annotations

import dataclasses
import os
import weakref
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Final, Literal, TypeVar, cast

import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset, Sampler
from torch.utils.data.dataloader import _MultiProcessingDataLoaderIter

from dataloaderx.contracts.backend import Backend
from dataloaderx.epoch.iterator import PrefetchIterator
from dataloaderx.epoch.previous import PreviousEpoch
from dataloaderx.epoch.stats import EpochStats, LoaderStats
from dataloaderx.frameworks.ray_train import warn_if_replaced
from dataloaderx.options import BackendSpec, resolve_backend
from dataloaderx.resume.tracker import ResumeTracker
from dataloaderx.workers.contract import KeptWorkers
from dataloaderx.workers.elastic.bounds import AutoWorkers
from dataloaderx.workers.elastic.iterator import ElasticWorkersIterator
from dataloaderx.workers.elastic.scaling import Scaling
from dataloaderx.workers.iterator import WorkersIterator
from dataloaderx.workers.method import (
    MULTIPROCESSING,
    THREAD,
    WorkerMethod,
    dataloader_takes_worker_method,
    resolve_workers,
)

__all__ = ["DataLoaderX"]

T_co = TypeVar("T_co", covariant=True)

#: The iterators that run workers, which a loader releases when an epoch ends early.
_WITH_WORKERS: Final = (_MultiProcessingDataLoaderIter, WorkersIterator)
_TORCH_WORKER_METHOD: Final = dataloader_takes_worker_method()


class DataLoaderX(DataLoader[T_co]):
    """A drop-in ``torch.utils.data.DataLoader`` that prefetches batches.

    Every ``DataLoader`` argument works unchanged; three keyword-only ones pick how batches are
    made and prefetched. They are validated here, before any thread or worker process starts,
    and kept as the attributes of the same names, so that frameworks which rebuild a loader
    from its attributes keep them.

    Args:
        worker_method: ``"multiprocessing"`` (the default): ``num_workers`` worker processes,
            as ``DataLoader``; ``"thread"``: ``num_workers`` worker threads in this process,
            with the same batches, order and worker contract (``docs/thread-workers.md``);
            ``"ray"``: ``num_workers`` Ray actors, on this machine or a Ray cluster's
            (``docs/ray-workers.md``); or a plugin's. A ``DataLoader`` of a torch that takes
            ``worker_method`` itself is given ``"thread"`` and ``"multiprocessing"``. With
            ``num_workers="auto"``, worker threads and Ray workers are as many as the loop
            needs, sized while it runs (``docs/elastic-workers.md``).
        worker_options: options for the workers of ``worker_method``; for ``"ray"``, the
            actors' ``num_cpus``, ``memory``, ``resources``, ``scheduling_strategy``,
            ``runtime_env``, ... (``docs/ray-workers.md``).
        backend: a registered backend name such as ``"thread"``, ``"background"`` or
            ``"sync"``; a mapping with a ``"name"`` key plus options, such as
            ``{"name": "thread", "depth": 4}``; or ``None`` for the ``DATALOADERX_BACKEND``
            environment variable, else ``"thread"``.
        backend_options: options for the backend, merged over those in a ``backend`` mapping.
    """

    backend: BackendSpec
    backend_options: Mapping[str, Any] | None
    worker_method: WorkerMethod
    worker_options: Mapping[str, Any] | None

    def __init__(
        self,
        dataset: Dataset[T_co],
        batch_size: int | None = 1,
        shuffle: bool | None = None,
        sampler: Sampler[Any] | Iterable[Any] | None = None,
        batch_sampler: Sampler[list[Any]] | Iterable[list[Any]] | None = None,
        num_workers: int | Literal["auto"] = 0,
        collate_fn: Callable[[list[Any]], Any] | None = None,
        pin_memory: bool = False,
        drop_last: bool = False,
        timeout: float = 0,
        worker_init_fn: Callable[[int], None] | None = None,
        multiprocessing_context: Any = None,
        generator: torch.Generator | None = None,
        *,
        prefetch_factor: int | None = None,
        persistent_workers: bool = False,
        pin_memory_device: str = "",
        in_order: bool = True,
        worker_method: WorkerMethod = "multiprocessing",
        worker_options: Mapping[str, Any] | None = None,
        backend: BackendSpec = None,
        backend_options: Mapping[str, Any] | None = None,
    ) -> None:
        self._prefetch_backend, common = resolve_backend(backend, backend_options)
        self._workers = resolve_workers(
            worker_method,
            worker_options,
            num_workers=num_workers,
            dataset=dataset,
            multiprocessing_context=multiprocessing_context,
        )
        self.worker_method = self._workers.method
        self.worker_options = worker_options
        bounds = self._workers.bounds
        #: With ``num_workers="auto"``, the pool's count across epochs; else ``None``.
        self._scaling = None if bounds is None else Scaling(bounds)
        #: Workers a worker method keeps between epochs; released with the loader.
        self._kept_workers = KeptWorkers()
        weakref.finalize(self, self._kept_workers.close)
        # A torch whose DataLoader has worker threads of its own runs them.
        torch_runs = _TORCH_WORKER_METHOD and self.worker_method in (MULTIPROCESSING, THREAD)
        torch_arguments = {"worker_method": self.worker_method} if torch_runs else {}
        self._stats = EpochStats(common.stats)
        self.backend = backend
        self.backend_options = backend_options
        #: With persistent workers, the epoch the next one ends first.
        self._previous = PreviousEpoch()
        self._resume = ResumeTracker()
        super().__init__(
            dataset,
            batch_size,
            shuffle,
            sampler,
            batch_sampler,
            # An int but "auto" (checked above) is DataLoader's to check.
            cast(int, num_workers) if bounds is None else AutoWorkers(bounds.max_workers),
            collate_fn,
            pin_memory,
            drop_last,
            timeout,
            worker_init_fn,
            multiprocessing_context,
            generator,
            prefetch_factor=prefetch_factor,
            persistent_workers=persistent_workers,
            pin_memory_device=pin_memory_device,
            in_order=in_order,
            **torch_arguments,
        )
        warn_if_replaced(self)

    @property
    def prefetch_backend(self) -> Backend:
        """The configured backend instance (resolved name and validated options)."""
        return self._prefetch_backend

    @property
    def stats(self) -> LoaderStats | None:
        """Stall statistics of the latest (or current) epoch; ``None`` before the first epoch
        and with ``backend_options={"stats": False}``. ``loader.stats.summary()`` says whether
        training waited for data.
        """
        stats = self._stats.latest()
        if stats is None or self._scaling is None:
            return stats
        return dataclasses.replace(stats, workers=self._scaling.history())

    @classmethod
    def from_config(
        cls, dataset: Dataset[T_co], config: Mapping[str, Any] | str | os.PathLike[str]
    ) -> DataLoaderX[T_co]:
        """Build a loader from a mapping or a ``.yaml``/``.yml``, ``.toml`` or ``.json`` file.

        It holds ``DataLoaderX`` keyword arguments (``batch_size``, ``num_workers``, ...,
        ``backend``, ``backend_options``); a Hydra-style ``_target_`` naming this class is
        accepted. Unknown keys raise :class:`~dataloaderx.ConfigError` naming each of them.
        """
        from dataloaderx.config import loader_kwargs

        return cls(dataset, **loader_kwargs(config, cls))

    def __iter__(self) -> PrefetchIterator[T_co]:  # type: ignore[override]
        reuses_workers = self.persistent_workers and self.num_workers > 0
        if reuses_workers:  # ``super().__iter__()`` resets their iterator
            self._previous.end()
        resumed = self._resume.pending_workers()
        if resumed is not None and self._scaling is not None:
            self._scaling.resume_with(resumed)
        with self._resume.epoch(self) as tracking:
            inner = super().__iter__()
        release = None
        if isinstance(inner, _WITH_WORKERS) and not reuses_workers:
            release = inner._shutdown_workers
        iterator = PrefetchIterator(
            inner,
            self._prefetch_backend,
            release,
            stats=self._stats,
            tracking=tracking,
            num_workers=self.num_workers,
            resized=None if self._scaling is None else self._scaling.resized,
        )
        if reuses_workers:
            self._previous.remember(iterator)
        return iterator

    def _get_iterator(self) -> Any:
        # If the backend pins every batch itself, DataLoader's pin-memory thread would only copy
        # each one more time (on one thread): it is left out (``pin_memory`` reads True after).
        # Without an accelerator, or with the deprecated ``pin_memory_device``, DataLoader only
        # warns; that is left to it, so that the same warnings appear.
        pins = self.pin_memory and not self.pin_memory_device and torch.accelerator.is_available()
        if not (pins and self._prefetch_backend.pins_host_memory()):
            return self._new_iterator()
        self.pin_memory = False
        try:
            return self._new_iterator()
        finally:
            self.pin_memory = True

    def _new_iterator(self) -> Any:
        workers = self._workers
        if self.num_workers > 0 and workers.pool is not None:
            if self._scaling is not None:
                return ElasticWorkersIterator(
                    self,
                    workers.pool,
                    workers.options,
                    self._kept_workers,
                    scaling=self._scaling,
                    origin=self._resume.origin,
                )
            return WorkersIterator(self, workers.pool, workers.options, self._kept_workers)
        return super()._get_iterator()

    def check_worker_number_rationality(self) -> None:
        # DataLoader warns of more worker processes than cores; threads waiting on I/O, or
        # actors on other machines, may well outnumber this machine's cores.
        if self._workers.counts_as_cores():
            super().check_worker_number_rationality()

    @property
    def _index_sampler(self) -> Any:
        # DataLoader reads its indices from here; a resumed epoch skips the consumed ones.
        sampler = super()._index_sampler
        resume: ResumeTracker | None = self.__dict__.get("_resume")
        return sampler if resume is None else resume.index_sampler(sampler)

    def state_dict(self) -> dict[str, Any]:
        """The position after the last batch handed to the training loop.

        Batches prefetched but not yet handed out are not counted. The state is plain
        data (ints, strings, dicts and generator-state tensors) that ``torch.save`` writes
        and ``torch.load(weights_only=True)`` reads; see "Resuming mid-epoch" in the docs.
        """
        scaling = self._scaling
        iterable = isinstance(self.dataset, IterableDataset)
        workers = scaling.epoch_workers if scaling is not None and iterable else None
        return self._resume.state_dict(self, workers)

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Make the next ``iter(loader)`` continue the epoch ``state_dict`` describes.

        Raises :class:`~dataloaderx.ResumeStateError` if the state was saved by a loader
        with other arguments, is corrupt, or has a newer format version.
        """
        self._resume.load_state_dict(self, state_dict)
