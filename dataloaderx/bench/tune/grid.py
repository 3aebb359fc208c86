"""The settings ``bench --tune`` may try: loader, ``num_workers``, ``depth``, ``pin_memory``."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

from torch.utils.data import DataLoader, Dataset

from dataloaderx.bench.runner import BASELINE
from dataloaderx.loader import DataLoaderX
from dataloaderx.options import backend_option_names
from dataloaderx.registry import get_backend

__all__ = ["DEPTHS", "Grid", "Setting", "usable_cores", "worker_counts"]

#: The depths tried for each backend that takes one: the default, and the adaptive buffer.
DEPTHS: Final[tuple[int | str, ...]] = (2, "auto")


@dataclass(frozen=True)
class Setting:
    """One loader configuration; ``depth`` is ``None`` for loaders that take none."""

    num_workers: int
    loader: str
    depth: int | str | None = None
    pin_memory: bool = False

    @property
    def label(self) -> str:
        """A short name for tables and the progress bar."""
        parts = [self.loader, f"workers={self.num_workers}"]
        if self.depth is not None:
            parts.append(f"depth={self.depth}")
        if self.pin_memory:
            parts.append("pin_memory")
        return " ".join(parts)

    def backend_options(self) -> dict[str, Any]:
        """The ``backend_options`` this setting passes (empty for ``DataLoader``)."""
        return {} if self.depth is None else {"depth": self.depth}

    def loader_kwargs(self, batch_size: int) -> dict[str, Any]:
        """The ``DataLoader`` keyword arguments this setting sets, ``backend`` included."""
        kwargs: dict[str, Any] = {"batch_size": batch_size, "num_workers": self.num_workers}
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


def usable_cores() -> int:
    """The CPU cores this process may run on."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def worker_counts(cores: int, *, include: int = 0) -> list[int]:
    """``0, 1, 2, 4, ...`` up to ``cores``, with ``include`` (the user's own count) added."""
    counts = {0, include}
    count = 1
    while count <= cores:
        counts.add(count)
        count *= 2
    return sorted(counts)


@dataclass(frozen=True)
class Grid:
    """Every setting of the sweep, grouped by ``num_workers`` (tried in increasing order)."""

    worker_counts: tuple[int, ...]
    backends: tuple[str, ...]
    #: ``(False, True)`` where an accelerator is present, else ``(False,)``.
    pin_memory: tuple[bool, ...] = (False,)

    def settings(self, num_workers: int) -> list[Setting]:
        """The settings with ``num_workers`` workers: ``DataLoader``, then each backend."""
        found = []
        for pin in self.pin_memory:
            found.append(Setting(num_workers, BASELINE, pin_memory=pin))
            for name in self.backends:
                names = backend_option_names(get_backend(name))
                takes_depth = names is None or "depth" in names
                depths: Sequence[int | str | None] = DEPTHS if takes_depth else (None,)
                found.extend(Setting(num_workers, name, depth, pin) for depth in depths)
        return found

    def all_settings(self) -> list[Setting]:
        """Every setting, as an exhaustive sweep would run them."""
        return [s for count in self.worker_counts for s in self.settings(count)]
