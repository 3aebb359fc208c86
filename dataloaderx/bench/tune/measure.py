"""Time one setting on the user's dataset and step, and the step alone on cached batches."""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from itertools import islice
from time import perf_counter
from typing import Any, Final

import torch
from torch.utils.data import DataLoader, Dataset

from dataloaderx.bench.errors import BenchError
from dataloaderx.bench.runner import close_iterator
from dataloaderx.bench.tune.grid import Setting
from dataloaderx.bench.tune.memory import PeakMemory
from dataloaderx.util.tree import map_tensors

__all__ = [
    "CACHED_BATCHES",
    "Ceiling",
    "Measurement",
    "Workload",
    "measure",
    "measure_ceiling",
    "measure_epoch",
]

#: Batches made once for the ceiling run, then replayed.
CACHED_BATCHES: Final = 4


@dataclass(frozen=True)
class Workload:
    """What every run does: ``batches`` batches of ``batch_size`` from ``dataset``, each
    passed to ``step``."""

    dataset: Dataset[Any]
    step: Callable[[Any], object]
    batch_size: int
    batches: int


@dataclass(frozen=True)
class Measurement:
    """One run of one setting. ``rate`` is batches per second from the first batch's arrival
    to the last step's end (a loader's start-up, worker processes included, is
    ``first_batch_seconds``); ``step_seconds`` is the median time inside the step.
    ``startup_seconds`` is the workers' start-up where the run measured a later epoch
    (Ray actors starting), else ``None``."""

    batches: int
    rate: float
    step_seconds: float
    first_batch_seconds: float
    peak_bytes: int | None = None
    startup_seconds: float | None = None


def accelerator() -> torch.device | None:
    """The accelerator batches go to, or ``None`` on a CPU-only machine."""
    found = torch.accelerator.current_accelerator(check_available=True)
    return None if found is None else torch.device(found.type)


def _synchronize() -> None:
    """Wait for the accelerator's queued work, so that a step's time includes it."""
    if accelerator() is not None:
        torch.accelerator.synchronize()


def _time_steps(batches: Iterator[Any], step: Callable[[Any], object]) -> Measurement:
    """Pass every batch of ``batches`` to ``step``; time the whole and each step."""
    start = perf_counter()
    first: float | None = None
    steps = []
    for batch in batches:
        if first is None:
            first = perf_counter()
        before = perf_counter()
        step(batch)
        steps.append(perf_counter() - before)
    _synchronize()
    end = perf_counter()
    if first is None:
        return Measurement(0, 0.0, 0.0, end - start)
    rate = len(steps) / (end - first) if end > first else 0.0
    return Measurement(len(steps), rate, statistics.median(steps), first - start)


def measure_epoch(
    loader: DataLoader[Any], workload: Workload, *, startup_seconds: float | None = None
) -> Measurement:
    """Run ``workload.batches`` batches of an epoch of ``loader`` through the step."""
    with PeakMemory() as memory:
        iterator = iter(loader)
        try:
            timed = _time_steps(islice(iterator, workload.batches), workload.step)
        finally:
            close_iterator(iterator)
    return Measurement(
        timed.batches,
        timed.rate,
        timed.step_seconds,
        timed.first_batch_seconds,
        memory.peak_bytes,
        startup_seconds,
    )


def measure(setting: Setting, workload: Workload) -> Measurement:
    """Run ``workload.batches`` batches of ``setting`` through the step, in a new loader."""
    return measure_epoch(setting.make_loader(workload.dataset, workload.batch_size), workload)


@dataclass(frozen=True)
class Ceiling:
    """The step on :data:`CACHED_BATCHES` batches made once and replayed, with nothing
    loading: the throughput no loader can beat, and the step's own time."""

    rate: float
    step_seconds: float
    batches: int


def measure_ceiling(workload: Workload) -> Ceiling:
    """Make a few batches with ``DataLoader``, put them where the ``cuda`` backend would (on
    the accelerator, if any), then time ``workload.batches`` steps replaying them."""
    device = accelerator()
    loader = DataLoader(workload.dataset, batch_size=workload.batch_size)
    try:
        made = list(islice(loader, CACHED_BATCHES))
    except Exception as exc:
        raise BenchError(f"--dataset: making a batch raised {exc!r}") from exc
    if not made:
        raise BenchError("--dataset: the dataset gave no batch")
    if device is not None:
        made = [map_tensors(lambda tensor: tensor.to(device), batch) for batch in made]
    replay = (made[index % len(made)] for index in range(workload.batches))
    try:
        timed = _time_steps(replay, workload.step)
    except Exception as exc:
        raise BenchError(f"--step: the step raised on a batch of the dataset: {exc!r}") from exc
    return Ceiling(timed.rate, timed.step_seconds, timed.batches)
