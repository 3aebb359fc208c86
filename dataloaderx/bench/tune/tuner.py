"""``bench --tune``: the ceiling, the sweep, and the answer read from the measured rows."""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from time import perf_counter
from typing import Any, Final

import yaml

from dataloaderx.bench.progress import Progress
from dataloaderx.bench.runner import BASELINE
from dataloaderx.bench.tune.actors import KeptActors
from dataloaderx.bench.tune.cluster import RayCluster
from dataloaderx.bench.tune.grid import (
    Grid,
    Setting,
    counts_up_to,
    thread_counts,
    worker_counts,
)
from dataloaderx.bench.tune.measure import (
    Ceiling,
    Measurement,
    Workload,
    accelerator,
    measure,
    measure_ceiling,
)
from dataloaderx.bench.tune.sweep import Budget, SweepResult, run_sweep, spread
from dataloaderx.util.cores import usable_cores
from dataloaderx.workers.method import RAY

__all__ = ["NOISY_SHARE", "Answer", "TuneConfig", "TuneResult", "run_tune"]

#: A loader that slows the step by at least this share is named in the verdict.
NOISY_SHARE: Final = 0.05


@dataclass(frozen=True)
class TuneConfig:
    """The user's workload and settings, and how far the sweep may go."""

    workload: Workload
    backends: tuple[str, ...]
    #: The user's own ``num_workers``: ``DataLoader`` with it is the baseline.
    num_workers: int = 0
    budget_seconds: float = 60.0
    #: The largest ``num_workers`` tried with worker processes, and half the largest tried
    #: with worker threads (default: the cores this process may use).
    cores: int | None = None
    #: The Ray cluster whose workers are weighed too, or ``None``: no Ray workers.
    ray: RayCluster | None = None

    def grid(self) -> Grid:
        """The settings to sweep: worker processes up to the cores, worker threads up to
        ``THREADS_PER_CORE`` times the cores, the user's own count with both; with a Ray
        cluster, Ray workers up to its CPUs (the user's count too, where it fits)."""
        cores = usable_cores() if self.cores is None else self.cores
        pins = (False, True) if accelerator() is not None else (False,)
        counts = worker_counts(cores, include=self.num_workers)
        threads = thread_counts(cores, include=self.num_workers)
        ray: list[int] = []
        if self.ray is not None:
            cpus = self.ray.cpus
            ray = counts_up_to(cpus, include=self.num_workers if self.num_workers <= cpus else 0)
        return Grid(tuple(counts), self.backends, pins, tuple(threads), tuple(ray))


@dataclass(frozen=True)
class Answer:
    """The measured best setting, the runner-up, and whether the rounds tell them apart."""

    best: Setting
    runner_up: Setting | None
    #: How much faster ``best``'s median rate is than the runner-up's (0.05: 5%).
    margin: float
    #: The larger spread of the two settings' runs, or ``None`` with a single run of either.
    spread: float | None

    @property
    def within_noise(self) -> bool:
        """The margin is no larger than the spread measured (or no spread was measured)."""
        return self.spread is None or self.margin <= self.spread


@dataclass(frozen=True)
class TuneResult:
    """The grid swept, the ceiling and every run of the sweep."""

    config: TuneConfig
    grid: Grid
    ceiling: Ceiling
    sweep: SweepResult
    own: Setting

    def rate(self, setting: Setting) -> float:
        """Median batches per second of ``setting``."""
        return self.sweep.median_rate(setting)

    def step_slowdown(self, setting: Setting) -> float:
        """How much slower the step ran during ``setting``'s runs than alone (0.12: 12%)."""
        step = statistics.median(run.step_seconds for run in self.sweep.runs[setting])
        alone = self.ceiling.step_seconds
        return step / alone - 1 if alone > 0 else 0.0

    def startup_seconds(self, setting: Setting) -> float | None:
        """The longest start-up of ``setting``'s Ray actors, or ``None`` for other workers."""
        found = [run.startup_seconds for run in self.sweep.runs[setting]]
        return max((seconds for seconds in found if seconds is not None), default=None)

    def peak_bytes(self, setting: Setting) -> int | None:
        """The largest memory any run of ``setting`` reached."""
        peaks = [run.peak_bytes for run in self.sweep.runs[setting] if run.peak_bytes is not None]
        return max(peaks, default=None)

    def answer(self) -> Answer:
        """The best measured setting and the runner-up."""
        ranked = self.sweep.ranked()
        best = ranked[0]
        if len(ranked) == 1:
            return Answer(best, None, 0.0, None)
        runner = ranked[1]
        margin = self.rate(best) / self.rate(runner) - 1 if self.rate(runner) > 0 else 0.0
        spreads = [spread(self.sweep.runs[best]), spread(self.sweep.runs[runner])]
        measured = None if None in spreads else max(s for s in spreads if s is not None)
        return Answer(best, runner, margin, measured)

    def noisiest(self) -> Setting | None:
        """The setting that slowed the step most, if by at least :data:`NOISY_SHARE`."""
        worst = max(self.sweep.runs, key=self.step_slowdown)
        return worst if self.step_slowdown(worst) >= NOISY_SHARE else None


def as_code(setting: Setting, batch_size: int) -> str:
    """The constructor call of ``setting``, ready to paste."""
    kwargs = setting.loader_kwargs(batch_size)
    cls = "DataLoader" if setting.loader == BASELINE else "DataLoaderX"
    arguments = ", ".join(f"{key}={_python(value)}" for key, value in kwargs.items())
    return f"{cls}(dataset, {arguments})"


def _python(value: Any) -> str:
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_python(k)}: {_python(v)}" for k, v in value.items()) + "}"
    return json.dumps(value) if isinstance(value, str) else repr(value)


def as_yaml(setting: Setting, batch_size: int, cluster: RayCluster | None = None) -> str:
    """The same setting as a YAML mapping for ``DataLoaderX.from_config``; for Ray workers,
    with the ``cluster`` measured on as a comment."""
    kwargs = setting.loader_kwargs(batch_size)
    kwargs.setdefault("backend", "sync")
    text = yaml.safe_dump(kwargs, sort_keys=False).rstrip()
    if cluster is not None and setting.worker_method == RAY:
        text = f"# measured on a {cluster.describe()}\n{text}"
    return text


def run_tune(config: TuneConfig, *, progress: bool = True) -> TuneResult:
    """Time the ceiling, then sweep the grid within ``config.budget_seconds`` in all."""
    budget = Budget(config.budget_seconds, perf_counter)
    workload = config.workload
    own = Setting(config.num_workers, BASELINE)
    grid = config.grid()
    cpus = 0 if config.ray is None else config.ray.cpus
    with (
        Progress(config.budget_seconds, enabled=progress, unit="s") as bar,
        KeptActors(workload, cpus) as actors,
    ):
        bar.start_run("ceiling: the step on cached batches")
        ceiling = measure_ceiling(workload)
        bar.advance(budget.used())

        def run(setting: Setting) -> Measurement:
            if setting.worker_method == RAY:
                return actors.measure(setting)
            return measure(setting, workload)

        sweep = run_sweep(grid, own, run, budget=budget, progress=bar)
    return TuneResult(config, grid, ceiling, sweep, own)
