"""Print a :class:`~dataloaderx.bench.BenchResult` as a table or as JSON."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from dataloaderx.bench.runner import WORKER_NAMES, BenchResult, workers_text

__all__ = ["as_json", "as_table", "fixed_width", "without_column"]

_COLUMNS = (
    "loader",
    "workers",
    "epoch s",
    "batches/s",
    "vs DataLoader",
    "stall %",
    "first batch ms",
    "depth min/med/max",
    "held MiB",
)
_MIB = 1024**2


def fixed_width(columns: Sequence[str], body: Sequence[Sequence[str]]) -> list[str]:
    """The lines of a table: the header, a rule, then one line per row of ``body``."""
    widths = [max(len(cells[i]) for cells in [columns, *body]) for i in range(len(columns))]
    lines = [
        "  ".join(cell.ljust(width) for cell, width in zip(cells, widths, strict=True)).rstrip()
        for cells in [columns, *body]
    ]
    lines.insert(1, "  ".join("-" * width for width in widths))
    return lines


def without_column(
    columns: tuple[str, ...], body: list[tuple[str, ...]], name: str
) -> tuple[tuple[str, ...], list[tuple[str, ...]]]:
    """``columns`` and ``body`` with the column ``name`` left out."""
    index = columns.index(name)
    return columns[:index] + columns[index + 1 :], [
        cells[:index] + cells[index + 1 :] for cells in body
    ]


def _rows(result: BenchResult) -> list[dict[str, Any]]:
    rows = []
    for contestant in result.runs:
        run = result.typical(contestant)
        seconds = result.median_seconds(contestant)
        rows.append(
            {
                "loader": contestant.loader,
                "num_workers": contestant.num_workers,
                "worker_method": contestant.worker_method,
                "label": contestant.label,
                "epoch_seconds": seconds,
                "batches": run.batches,
                "batches_per_second": run.batches / seconds if seconds > 0 else 0.0,
                "speedup_vs_dataloader": result.speedup(contestant),
                "stall_percent": 100 * run.wait_fraction,
                "first_batch_ms": 1000 * run.first_batch_seconds,
                "summary": None if run.stats is None else run.stats.summary(),
                "depth_min": None if run.stats is None else run.stats.depth_min,
                "depth_median": None if run.stats is None else run.stats.depth_median,
                "depth_max": None if run.stats is None else run.stats.depth_max,
                "peak_bytes_held": None if run.stats is None else run.stats.peak_bytes,
                "mode": None if run.stats is None else run.stats.mode,
                "workers_over_time": None
                if run.stats is None or not run.stats.workers
                else " -> ".join(str(workers) for _, workers, _ in run.stats.workers),
                "runs_seconds": [r.seconds for r in result.runs[contestant]],
            }
        )
    return rows


def _depths(row: dict[str, Any]) -> str:
    if row["depth_min"] is None:
        return "-"
    return f"{row['depth_min']}/{row['depth_median']}/{row['depth_max']}"


def as_table(result: BenchResult) -> str:
    """A fixed-width table with one row per contestant, then the recommendation; the
    ``workers`` column (processes or threads) only where there are workers."""
    columns: tuple[str, ...] = _COLUMNS
    body: list[tuple[str, ...]] = [
        (
            row["loader"],
            workers_text(row["num_workers"], row["worker_method"]),
            f"{row['epoch_seconds']:.3f}",
            f"{row['batches_per_second']:.1f}",
            f"{row['speedup_vs_dataloader']:.2f}x",
            f"{row['stall_percent']:.0f}",
            f"{row['first_batch_ms']:.1f}",
            _depths(row),
            "-" if row["peak_bytes_held"] is None else f"{row['peak_bytes_held'] / _MIB:.1f}",
        )
        for row in _rows(result)
    ]
    config = result.config
    if config.num_workers == 0:
        columns, body = without_column(columns, body, "workers")
    lines = fixed_width(columns, body)
    header = (
        f"batch_size={config.batch_size} num_workers={config.num_workers} "
        f"batches={config.batches} rounds={config.rounds} (median of rounds)"
    )
    for option in ("depth", "max_bytes"):
        if getattr(config, option) is not None:
            header += f" {option}={getattr(config, option)!r}"
    modes = [f"{row['label']} ran {row['mode']}" for row in _rows(result) if row["mode"]]
    counts = [
        f"{row['label']} ran {row['workers_over_time']} {WORKER_NAMES[row['worker_method']]} "
        "over the epoch"
        for row in _rows(result)
        if row["workers_over_time"]
    ]
    return "\n".join([header, "", *lines, "", *modes, *counts, result.recommendation()])


def as_json(result: BenchResult) -> str:
    """The same figures as :func:`as_table`, machine-readable."""
    config = result.config
    best = result.best()
    document = {
        "config": {
            "batch_size": config.batch_size,
            "num_workers": config.num_workers,
            "batches": config.batches,
            "rounds": config.rounds,
            "backends": list(config.backends),
            "depth": config.depth,
            "max_bytes": config.max_bytes,
        },
        "results": _rows(result),
        "best": best.loader,
        "best_worker_method": best.worker_method,
        "recommendation": result.recommendation(),
    }
    return json.dumps(document, indent=2)
