"""Run the same workload through ``DataLoader`` and each backend, alternating runs.

With ``num_workers > 0`` each backend runs twice, with worker processes and with worker
threads (``worker_method="thread"``); ``DataLoader`` has worker processes only.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from time import perf_counter
from typing import Any, Final

from torch.utils.data import DataLoader, Dataset

from dataloaderx.bench.progress import Progress
from dataloaderx.epoch.stats import INPUT_BOUND_FRACTION, LoaderStats, TraceEvent
from dataloaderx.loader import DataLoaderX
from dataloaderx.options import backend_option_names
from dataloaderx.registry import get_backend
from dataloaderx.util.cores import usable_cores
from dataloaderx.workers.elastic.bounds import AUTO
from dataloaderx.workers.method import MULTIPROCESSING, RAY, THREAD

__all__ = [
    "BASELINE",
    "WORKER_NAMES",
    "BenchConfig",
    "BenchResult",
    "Contestant",
    "RunResult",
    "baseline_workers",
    "buffer_advice",
    "close_iterator",
    "run_bench",
    "worker_methods",
    "workers_text",
]

#: Name of the plain ``torch.utils.data.DataLoader`` contestant.
BASELINE: Final = "DataLoader"
#: A buffer that held at least this many bytes is worth capping with ``max_bytes``.
MAX_BYTES_HINT: Final = 256 * 1024**2
_MIB: Final = 1024**2
#: The ``depth`` prefetching backends use when none is given.
DEFAULT_DEPTH: Final = 2
#: How labels and tables name each worker method.
WORKER_NAMES: Final = {MULTIPROCESSING: "processes", THREAD: "threads", RAY: "Ray actors"}
_ONE_WORKER: Final = {MULTIPROCESSING: "process", THREAD: "thread", RAY: "Ray actor"}


def workers_text(num_workers: int | str, worker_method: str) -> str:
    """``"0"``, ``"1 thread"``, ``"2 processes"``, ``"auto threads"``: a table's cell."""
    if num_workers == 0:
        return "0"
    names = _ONE_WORKER if num_workers == 1 else WORKER_NAMES
    return f"{num_workers} {names[worker_method]}"


def worker_methods(
    loader: str, num_workers: int | str, extra: tuple[str, ...] = ()
) -> tuple[str, ...]:
    """The worker methods ``loader`` is tried with: processes, and threads (and ``extra``,
    such as Ray workers) for a ``DataLoaderX`` backend with workers (``DataLoader`` has no
    other workers; without workers the method changes nothing); with ``num_workers="auto"``,
    the elastic ones: threads (and ``extra``)."""
    if loader == BASELINE or num_workers == 0:
        return (MULTIPROCESSING,)
    if num_workers == AUTO:
        return (THREAD, *extra)
    return (MULTIPROCESSING, THREAD, *extra)


@dataclass(frozen=True)
class Contestant:
    """One row of the comparison: ``DataLoader`` or a backend, with its worker method."""

    loader: str
    num_workers: int | str
    worker_method: str = MULTIPROCESSING

    @property
    def label(self) -> str:
        """``loader``, with the worker method in brackets where there are workers."""
        if self.num_workers == 0:
            return self.loader
        if self.num_workers == AUTO:
            return f"{self.loader} (auto {WORKER_NAMES[self.worker_method]})"
        return f"{self.loader} ({WORKER_NAMES[self.worker_method]})"


@dataclass(frozen=True)
class BenchConfig:
    """What to run: one dataset and step, the loader settings, the backends to compare."""

    dataset: Dataset[Any]
    step: Callable[[Any], object]
    batch_size: int
    #: A count, or ``"auto"``: each backend with elastic worker threads (and the elastic
    #: pools of ``extra_methods``), against ``DataLoader`` with a worker process per core.
    num_workers: int | str
    batches: int
    backends: tuple[str, ...]
    rounds: int = 2
    #: ``depth`` and ``max_bytes`` for every backend that takes them (``None``: its default).
    depth: int | str | None = None
    max_bytes: int | None = None
    #: Worker methods tried besides processes and threads (``bench --worker-method ray``).
    extra_methods: tuple[str, ...] = ()


@dataclass(frozen=True)
class RunResult:
    """One epoch (``batches`` batches) of one contestant."""

    name: str
    seconds: float
    batches: int
    wait_seconds: float
    first_batch_seconds: float
    stats: LoaderStats | None = field(default=None, repr=False)

    @property
    def wait_fraction(self) -> float:
        """Fraction of the epoch the loop waited for data."""
        return self.wait_seconds / self.seconds if self.seconds > 0 else 0.0


@dataclass(frozen=True)
class BenchResult:
    """Every run, grouped by contestant in the order they were run (``DataLoader`` first)."""

    config: BenchConfig
    runs: dict[Contestant, list[RunResult]]

    @property
    def baseline(self) -> Contestant:
        """The ``DataLoader`` contestant."""
        return Contestant(BASELINE, baseline_workers(self.config.num_workers))

    def median_seconds(self, contestant: Contestant) -> float:
        """Median epoch time of ``contestant``."""
        return statistics.median(run.seconds for run in self.runs[contestant])

    def typical(self, contestant: Contestant) -> RunResult:
        """The run of ``contestant`` whose time is the median (the lower one for an even
        count)."""
        ordered = sorted(self.runs[contestant], key=lambda run: run.seconds)
        return ordered[(len(ordered) - 1) // 2]

    def speedup(self, contestant: Contestant) -> float:
        """``DataLoader``'s median time divided by ``contestant``'s."""
        return self.median_seconds(self.baseline) / self.median_seconds(contestant)

    def best(self) -> Contestant:
        """The contestant with the lowest median time."""
        return min(self.runs, key=self.median_seconds)

    def recommendation(self) -> str:
        """One line: which backend (and worker method) to use, and what limits the loop."""
        best = self.best()
        if best.loader == BASELINE or self.speedup(best) < 1.05:
            typical = self.typical(self.baseline)
            if typical.wait_fraction < INPUT_BOUND_FRACTION:
                return "keep DataLoader: the loop is compute-bound, no backend makes it faster"
            return (
                "no backend helps here: the loop waits for data but loading and the step "
                f"compete for the CPU; try num_workers>={max(2, 2 * self.baseline.num_workers)}"
            )
        run = self.typical(best)
        arguments = f"backend={best.loader!r}"
        if best.num_workers == AUTO:
            arguments = f"num_workers={AUTO!r}, {arguments}"
        if best.worker_method != MULTIPROCESSING:
            arguments += f", worker_method={best.worker_method!r}"
        line = f"use DataLoaderX({arguments}): {self.speedup(best):.2f}x DataLoader's throughput"
        if run.stats is not None:
            line += f"; with it, {run.stats.summary()}"
            advice = buffer_advice(run.stats)
            if advice:
                line += f"\n{advice}"
        return line


def buffer_advice(stats: LoaderStats) -> str:
    """What to set ``depth`` and ``max_bytes`` to, when they matter ("" otherwise).

    Depth matters when ``depth="auto"`` grew past the default of 2 (pin its largest value
    to fix the buffer) or
    when a fixed depth left the loop waiting while the producer idled (bursty loading);
    ``max_bytes`` when the buffer held at least :data:`MAX_BYTES_HINT`.
    """
    if stats.depth_min is None or stats.depth_max is None or stats.peak_bytes is None:
        return ""
    parts = []
    if stats.depth is None:
        if stats.depth_max > DEFAULT_DEPTH:
            parts.append(
                f"depth='auto' used {stats.depth_min} to {stats.depth_max} batches (median "
                f"{stats.depth_median}); depth={stats.depth_max} fixes the buffer at its largest"
            )
    elif stats.advice().startswith("try depth"):
        parts.append(
            f"the producer idled while the loop waited: try depth='auto' "
            f"(or depth>={2 * stats.depth})"
        )
    if stats.peak_bytes >= MAX_BYTES_HINT:
        parts.append(
            f"the buffer held up to {stats.peak_bytes / _MIB:.0f} MiB; "
            f"max_bytes='{math.ceil(stats.peak_bytes / _MIB)}MiB' caps it there"
        )
    return "; ".join(parts)


def _make_loader(contestant: Contestant, config: BenchConfig) -> DataLoader[Any]:
    common: dict[str, Any] = {
        "batch_size": config.batch_size,
        "num_workers": contestant.num_workers,
    }
    if contestant.loader == BASELINE:
        return DataLoader(config.dataset, **common)
    if contestant.worker_method != MULTIPROCESSING:
        common["worker_method"] = contestant.worker_method
    options: dict[str, Any] = {"stats": "trace"}
    accepted = backend_option_names(get_backend(contestant.loader)) or []
    for option in ("depth", "max_bytes"):
        value = getattr(config, option)
        if value is not None and option in accepted:
            options[option] = value
    return DataLoaderX(config.dataset, backend=contestant.loader, backend_options=options, **common)


def close_iterator(iterator: Iterator[Any]) -> None:
    """Stop a loader's iterator now: ``close()`` for ``DataLoaderX``, the worker shutdown
    for ``DataLoader``."""
    close = getattr(iterator, "close", None) or getattr(iterator, "_shutdown_workers", None)
    if close is not None:
        close()


def run_once(contestant: Contestant, config: BenchConfig, progress: Progress) -> RunResult:
    """Run ``config.batches`` batches (or the whole epoch if shorter) of ``contestant``."""
    loader = _make_loader(contestant, config)
    waited = 0.0
    first = 0.0
    count = 0
    start = perf_counter()
    iterator: Iterator[Any] = iter(loader)
    try:
        while count < config.batches:
            before = perf_counter()
            try:
                batch = next(iterator)
            except StopIteration:
                break
            after = perf_counter()
            waited += after - before
            if count == 0:
                first = after - start
            config.step(batch)
            count += 1
            progress.advance()
    finally:
        close_iterator(iterator)
    seconds = perf_counter() - start
    stats = loader.stats if isinstance(loader, DataLoaderX) else None
    return RunResult(contestant.label, seconds, count, waited, first, stats)


def baseline_workers(num_workers: int | str) -> int:
    """``DataLoader``'s worker processes against ``num_workers``: the same count, or a
    process per core this process may use against ``"auto"``."""
    return usable_cores() if num_workers == AUTO else int(num_workers)


def contestants(
    backends: Sequence[str], num_workers: int | str, extra: tuple[str, ...] = ()
) -> list[Contestant]:
    """``DataLoader`` first, then each backend once per worker method."""
    return [
        Contestant(name, baseline_workers(num_workers) if name == BASELINE else num_workers, method)
        for name in [BASELINE, *dict.fromkeys(backends)]
        for method in worker_methods(name, num_workers, extra)
    ]


def run_bench(config: BenchConfig, *, progress: bool = True) -> BenchResult:
    """Run every contestant ``config.rounds`` times, alternating, and collect the runs."""
    everyone = contestants(config.backends, config.num_workers, config.extra_methods)
    runs: dict[Contestant, list[RunResult]] = {contestant: [] for contestant in everyone}
    total = config.rounds * len(everyone) * config.batches
    with Progress(total, enabled=progress) as bar:
        for round_number in range(1, config.rounds + 1):
            for contestant in everyone:
                bar.start_run(f"{contestant.label} (round {round_number}/{config.rounds})")
                runs[contestant].append(run_once(contestant, config, bar))
    return BenchResult(config, runs)


def trace_of(run: RunResult) -> tuple[TraceEvent, ...]:
    """The timeline recorded for ``run`` (empty for ``DataLoader``)."""
    return () if run.stats is None else run.stats.trace
