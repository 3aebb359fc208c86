"""Draw throughput against ``num_workers``, one line per loader, and the ceiling."""

from __future__ import annotations

import os

from dataloaderx.bench.plot import pyplot, save_figure
from dataloaderx.bench.tune.tuner import TuneResult

__all__ = ["save_plot"]


def save_plot(result: TuneResult, path: str | os.PathLike[str]) -> None:
    """Write a PNG: for each loader, its best median batches/s at each worker count measured
    (over depths and ``pin_memory``), with the ceiling as a horizontal line."""
    plt = pyplot()
    best: dict[str, dict[int, float]] = {}
    for setting in result.sweep.runs:
        line = best.setdefault(setting.loader, {})
        rate = result.rate(setting)
        line[setting.num_workers] = max(rate, line.get(setting.num_workers, 0.0))
    figure, axis = plt.subplots(figsize=(8, 4.5))
    for loader, points in best.items():
        counts = sorted(points)
        axis.plot(counts, [points[count] for count in counts], marker="o", label=loader)
    axis.axhline(result.ceiling.rate, color="black", linestyle="--", label="ceiling")
    axis.set_xlabel("num_workers")
    axis.set_ylabel("batches/s (median of runs)")
    axis.set_title("Throughput by num_workers (best depth per loader)")
    axis.legend()
    save_figure(plt, figure, path)
