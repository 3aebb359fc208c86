"""Draw throughput against ``num_workers``, one line per loader and worker method, and the
ceiling."""

from __future__ import annotations

import os
from typing import Any, Final

from dataloaderx.bench.plot import pyplot, save_figure
from dataloaderx.bench.runner import WORKER_NAMES
from dataloaderx.bench.tune.tuner import TuneResult
from dataloaderx.workers.method import MULTIPROCESSING, RAY, THREAD

__all__ = ["draw", "save_plot"]

_STYLES: Final = {
    MULTIPROCESSING: {"linestyle": "-", "marker": "o"},
    THREAD: {"linestyle": ":", "marker": "s"},
    RAY: {"linestyle": "-.", "marker": "^"},
}


def _lines(result: TuneResult) -> dict[tuple[str, str], dict[int, float]]:
    """Per loader and worker method, the best median rate at each worker count (over depths
    and ``pin_memory``). The settings without workers start every line of their loader."""
    lines: dict[tuple[str, str], dict[int, float]] = {}
    fixed = [setting for setting in result.sweep.runs if not setting.elastic]  # by count
    workers_first = sorted(fixed, key=lambda setting: setting.num_workers == 0)
    for setting in workers_first:  # so that a loader's lines exist by its count 0
        if setting.num_workers == 0:
            keys = [key for key in lines if key[0] == setting.loader]
            keys = keys or [(setting.loader, MULTIPROCESSING)]
        else:
            keys = [(setting.loader, setting.worker_method)]
        for key in keys:
            line = lines.setdefault(key, {})
            rate = result.rate(setting)
            line[setting.num_workers] = max(rate, line.get(setting.num_workers, 0.0))
    return lines


def draw(result: TuneResult, plt: Any) -> Any:
    """The figure: for each loader and worker method, its best median batches/s at each
    worker count measured, ticks at those counts, and the ceiling as a horizontal line."""
    figure, axis = plt.subplots(figsize=(8, 4.5))
    lines = _lines(result)
    loaders = list(dict.fromkeys(loader for loader, _ in lines))
    for (loader, method), points in sorted(lines.items()):
        counts = sorted(points)
        label = f"{loader} ({WORKER_NAMES[method]})" if counts[-1] > 0 else loader
        axis.plot(
            counts,
            [points[count] for count in counts],
            label=label,
            color=f"C{loaders.index(loader)}",  # a colour per loader, a style per method
            **_STYLES[method],
        )
    axis.axhline(result.ceiling.rate, color="black", linestyle="--", label="ceiling")
    axis.set_xticks(sorted({setting.num_workers for setting in result.sweep.runs}))
    axis.set_xlabel("num_workers")
    axis.set_ylabel("batches/s (median of runs)")
    axis.set_title("Throughput by num_workers (best depth per loader and worker method)")
    axis.legend(fontsize="small")
    return figure


def save_plot(result: TuneResult, path: str | os.PathLike[str]) -> None:
    """Write :func:`draw`'s figure as a PNG to ``path``."""
    plt = pyplot()
    save_figure(plt, draw(result, plt), path)
