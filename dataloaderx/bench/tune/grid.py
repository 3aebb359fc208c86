"""The settings ``bench --tune`` may try: loader, ``num_workers`` and ``worker_method``
(processes, threads, and Ray actors where a Ray cluster is weighed), ``depth``,
``pin_memory``."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

from torch.utils.data import DataLoader, Dataset

from dataloaderx.bench.runner import BASELINE, WORKER_NAMES, worker_methods
from dataloaderx.loader import DataLoaderX
from dataloaderx.options import backend_option_names
from dataloaderx.registry import get_backend
from dataloaderx.util.suggest import quoted
from dataloaderx.workers.elastic.bounds import AUTO
from dataloaderx.workers.method import MULTIPROCESSING, RAY, THREAD

#: The worker methods ``--tune`` tries.
_TUNED_METHODS = (MULTIPROCESSING, THREAD, RAY)

__all__ = [
    "DEPTHS",
    "THREADS_PER_CORE",
    "Grid",
    "Setting",
    "counts_up_to",
    "thread_counts",
    "worker_counts",
]

#: The depths tried for each backend that takes one: the default, and the adaptive buffer.
DEPTHS: Final[tuple[int | str, ...]] = (2, "auto")
#: The backend whose setting stands for a worker count while the counts are climbed.
PROBE_BACKEND: Final = "thread"
#: Worker threads tried go up to this many per core: a thread that waits on I/O releases
#: the GIL and its core, so loads that wait gain from more threads than cores.
THREADS_PER_CORE: Final = 2


@dataclass(frozen=True)
class Setting:
    """One loader configuration; ``depth`` is ``None`` for loaders that take none."""

    num_workers: int
    loader: str
    depth: int | str | None = None
    pin_memory: bool = False
    #: ``"thread"`` or ``"ray"``: the workers are threads or Ray actors (``DataLoaderX``
    #: backends only).
    worker_method: str = MULTIPROCESSING
    #: ``num_workers="auto"`` (worker threads only): the pool sized while it runs; the
    #: other fields are those of the fixed setting it is weighed against.
    elastic: bool = False

    def __post_init__(self) -> None:
        if self.worker_method not in _TUNED_METHODS:
            raise ValueError(
                f"worker_method must be one of {quoted(_TUNED_METHODS)}, got {self.worker_method!r}"
            )
        if self.worker_method not in worker_methods(self.loader, max(self.num_workers, 1), (RAY,)):
            raise ValueError(
                f"{self.loader} has worker processes only: worker_method="
                f"{self.worker_method!r} needs a DataLoaderX backend"
            )
        if self.elastic and self.worker_method != THREAD:
            raise ValueError(f"num_workers='auto' is tried with worker threads, not {self.label}")

    def elastic_setting(self) -> Setting:
        """This setting with ``num_workers="auto"`` instead of its fixed count."""
        return dataclasses.replace(self, elastic=True)

    @property
    def label(self) -> str:
        """A short name for tables and the progress bar."""
        parts = [self.loader, f"workers={AUTO if self.elastic else self.num_workers}"]
        if self.worker_method != MULTIPROCESSING:
            parts.append(f"({WORKER_NAMES[self.worker_method]})")
        if self.depth is not None:
            parts.append(f"depth={self.depth}")
        if self.pin_memory:
            parts.append("pin_memory")
        return " ".join(parts)

    def backend_options(self) -> dict[str, Any]:
        """The ``backend_options`` this setting passes (empty for ``DataLoader``)."""
        return {} if self.depth is None else {"depth": self.depth}

    def loader_kwargs(self, batch_size: int) -> dict[str, Any]:
        """The ``DataLoader`` keyword arguments this setting sets, ``backend`` included
        (``worker_method`` only where the workers are not processes)."""
        kwargs: dict[str, Any] = {"batch_size": batch_size, "num_workers": self.num_workers}
        if self.worker_method != MULTIPROCESSING:
            kwargs["worker_method"] = self.worker_method
        if self.elastic:
            kwargs["num_workers"] = AUTO
        if self.pin_memory:
            kwargs["pin_memory"] = True
        if self.loader != BASELINE:
            kwargs["backend"] = self.loader
            if self.depth is not None:
                kwargs["backend_options"] = self.backend_options()
        return kwargs

    def make_loader(
        self, dataset: Dataset[Any], batch_size: int, *, stats: bool = False
    ) -> DataLoader[Any]:
        """A loader of this setting over ``dataset`` (stats off unless asked for)."""
        kwargs = self.loader_kwargs(batch_size)
        if self.loader == BASELINE:
            return DataLoader(dataset, **kwargs)
        kwargs["backend_options"] = {**kwargs.get("backend_options", {}), "stats": stats}
        return DataLoaderX(dataset, **kwargs)


def worker_counts(cores: int, *, include: int = 0) -> list[int]:
    """``0, 1, 2, 4, ...`` up to ``cores``, with ``include`` (the user's own count) added."""
    counts = {0, include}
    count = 1
    while count <= cores:
        counts.add(count)
        count *= 2
    return sorted(counts)


def counts_up_to(most: int, *, include: int = 0) -> list[int]:
    """As :func:`worker_counts` up to ``most``, ``most`` itself included."""
    return sorted({*worker_counts(most, include=include), most})


def thread_counts(cores: int, *, include: int = 0) -> list[int]:
    """The worker counts tried with threads: :func:`counts_up_to` :data:`THREADS_PER_CORE`
    times ``cores``."""
    return counts_up_to(THREADS_PER_CORE * cores, include=include)


@dataclass(frozen=True)
class Grid:
    """Every setting of the sweep: per worker method, a ladder of ``num_workers`` tried in
    increasing order, each count with every loader that has that method."""

    #: The counts tried with worker processes (``DataLoader`` and every backend).
    worker_counts: tuple[int, ...]
    backends: tuple[str, ...]
    #: ``(False, True)`` where an accelerator is present, else ``(False,)``.
    pin_memory: tuple[bool, ...] = (False,)
    #: The counts tried with worker threads (the backends only); empty: no threads.
    thread_counts: tuple[int, ...] = ()
    #: The counts tried with Ray workers (the backends only); empty: no Ray.
    ray_counts: tuple[int, ...] = ()

    def ladders(self) -> dict[str, tuple[int, ...]]:
        """The counts of each worker method swept, increasing."""
        ladders = {MULTIPROCESSING: tuple(sorted(self.worker_counts))}
        for method, counts in ((THREAD, self.thread_counts), (RAY, self.ray_counts)):
            if counts:
                ladders[method] = tuple(sorted(counts))
        return ladders

    def settings(self, num_workers: int, worker_method: str = MULTIPROCESSING) -> list[Setting]:
        """The settings with ``num_workers`` workers of ``worker_method``: ``DataLoader``
        (processes only), then each backend. Without workers the method changes nothing:
        every method has the same settings at 0, those of processes."""
        method = worker_method if num_workers > 0 else MULTIPROCESSING
        found = []
        for pin in self.pin_memory:
            if method in worker_methods(BASELINE, num_workers):
                found.append(Setting(num_workers, BASELINE, pin_memory=pin))
            for name in self.backends:
                names = backend_option_names(get_backend(name))
                takes_depth = names is None or "depth" in names
                depths: Sequence[int | str | None] = DEPTHS if takes_depth else (None,)
                found.extend(Setting(num_workers, name, depth, pin, method) for depth in depths)
        return found

    def probe(self, num_workers: int, worker_method: str = MULTIPROCESSING) -> Setting:
        """The one setting of :meth:`settings` that stands for its worker count and method
        while the counts are climbed: the default backend with the default depth, where it is
        swept; else the first backend's first setting."""
        found = [s for s in self.settings(num_workers, worker_method) if s.loader != BASELINE]
        for setting in found:
            if setting.loader == PROBE_BACKEND and setting.depth == DEPTHS[0]:
                return setting
        return found[0]

    def all_settings(self) -> list[Setting]:
        """Every setting once, in the order an exhaustive sweep runs them: count by count,
        processes, then threads, then Ray actors."""
        ladders = self.ladders()
        counts = sorted({count for ladder in ladders.values() for count in ladder})
        found = [
            setting
            for count in counts
            for method, ladder in ladders.items()
            if count in ladder
            for setting in self.settings(count, method)
        ]
        return list(dict.fromkeys(found))
