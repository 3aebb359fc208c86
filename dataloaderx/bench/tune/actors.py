"""Runs of settings with Ray workers, on loaders kept between a setting's runs, the actors'
start-up timed apart (how and why: docs/tuning.md, "Ray workers")."""

from __future__ import annotations

from itertools import islice
from time import perf_counter
from typing import Any

from torch.utils.data import DataLoader

from dataloaderx.bench.runner import close_iterator
from dataloaderx.bench.tune.grid import Setting
from dataloaderx.bench.tune.measure import Measurement, Workload, measure_epoch
from dataloaderx.util.wrapping import ClosesOnExit

__all__ = ["KeptActors"]


def _startup_seconds(loader: DataLoader[Any], workers: int) -> float:
    """Seconds from ``iter(loader)`` until each of its ``workers`` has made a batch (the
    batches go to the workers in turn); the epoch is then left."""
    start = perf_counter()
    iterator = iter(loader)
    try:
        for _ in islice(iterator, workers):
            pass
    finally:
        close_iterator(iterator)
    return perf_counter() - start


class KeptActors(ClosesOnExit):
    """The loaders of the Ray settings run so far, their actors within the ``cpus`` of the
    cluster; ``close()`` drops them all, and their actors end with them."""

    def __init__(self, workload: Workload, cpus: int) -> None:
        self._workload = workload
        self._cpus = cpus
        #: Least recently used first.
        self._loaders: dict[Setting, DataLoader[Any]] = {}

    def measure(self, setting: Setting) -> Measurement:
        """One run of ``setting``: an epoch on its kept actors, started here if need be."""
        loader = self._loaders.pop(setting, None)
        startup = None
        if loader is None:
            self._make_room(setting.num_workers)
            loader = setting.make_loader(self._workload.dataset, self._workload.batch_size)
            startup = _startup_seconds(loader, setting.num_workers)
        self._loaders[setting] = loader
        return measure_epoch(loader, self._workload, startup_seconds=startup)

    def _make_room(self, workers: int) -> None:
        while self._loaders and self._kept() + workers > self._cpus:
            del self._loaders[next(iter(self._loaders))]

    def _kept(self) -> int:
        return sum(setting.num_workers for setting in self._loaders)

    def close(self) -> None:
        """Drop every loader kept, and with it its actors."""
        self._loaders.clear()
