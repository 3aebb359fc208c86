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
from dataloaderx.bench.tune.grid import (
    Grid,
    Setting,
    thread_counts,
    usable_cores,
    worker_counts,
)
from dataloaderx.bench.tune.measure import (
    Ceiling,
    Workload,
    accelerator,
    measure,
    measure_ceiling,
)
from dataloaderx.bench.tune.sweep import Budget, SweepResult, run_sweep, spread

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

    def grid(self) -> Grid:
        """The settings to sweep: worker processes up to the cores, worker threads up to
        ``THREADS_PER_CORE`` times the cores, the user's own count with both."""
        cores = usable_cores() if self.cores is None else self.cores
        pins = (False, True) if accelerator() is not None else (False,)
        counts = worker_counts(cores, include=self.num_workers)
        threads = thread_counts(cores, include=self.num_workers)
        return Grid(tuple(counts), self.backends, pins, tuple(threads))


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


def as_yaml(setting: Setting, batch_size: int) -> str:
    """The same setting as a YAML mapping for ``DataLoaderX.from_config``."""
    kwargs = setting.loader_kwargs(batch_size)
    kwargs.setdefault("backend", "sync")
    return yaml.safe_dump(kwargs, sort_keys=False).rstrip()


def run_tune(config: TuneConfig, *, progress: bool = True) -> TuneResult:
    """Time the ceiling, then sweep the grid within ``config.budget_seconds`` in all."""
    budget = Budget(config.budget_seconds, perf_counter)
    workload = config.workload
    own = Setting(config.num_workers, BASELINE)
    grid = config.grid()
    with Progress(config.budget_seconds, enabled=progress, unit="s") as bar:
        bar.start_run("ceiling: the step on cached batches")
        ceiling = measure_ceiling(workload)
        bar.advance(budget.used())
        sweep = run_sweep(
            grid, own, lambda setting: measure(setting, workload), budget=budget, progress=bar
        )
    return TuneResult(config, grid, ceiling, sweep, own)
