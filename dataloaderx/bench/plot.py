"""Draw the results: a throughput bar chart and a producer/consumer timeline."""

from __future__ import annotations

import os
from typing import Any

from dataloaderx.bench.errors import BenchError
from dataloaderx.bench.runner import BenchResult, trace_of

__all__ = ["pyplot", "save_figure", "save_plot"]


def pyplot() -> Any:
    """``matplotlib.pyplot`` on the non-interactive backend, or a :class:`BenchError`."""
    try:
        import matplotlib
    except ImportError:
        raise BenchError(
            "--plot needs matplotlib; install it with `pip install 'dataloaderx[plot]'`"
        ) from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_plot(result: BenchResult, path: str | os.PathLike[str]) -> None:
    """Write a PNG with batches/s per loader and, per backend, when batches were made
    (producer) and when the training loop waited for one (consumer); with
    ``num_workers="auto"``, the worker count over the same time."""
    plt = pyplot()
    traced = [each for each in result.runs if trace_of(result.typical(each))]
    figure, axes = plt.subplots(
        1 + len(traced),
        1,
        figsize=(9, 3 + 1.4 * len(traced)),
        squeeze=False,
        gridspec_kw={"height_ratios": [2, *[1] * len(traced)]},
    )
    everyone = list(result.runs)
    rates = [result.typical(c).batches / result.median_seconds(c) for c in everyone]
    bars = axes[0][0]
    bars.bar([c.label for c in everyone], rates, color="tab:blue")
    bars.set_ylabel("batches/s")
    bars.set_title("Throughput (median of rounds)")
    if any(c.num_workers for c in everyone):  # labels with "(processes)" are long
        bars.tick_params(axis="x", labelrotation=20)
    for row, contestant in enumerate(traced, start=1):
        axis = axes[row][0]
        events = trace_of(result.typical(contestant))
        origin = min(start for _, start, _ in events)
        for lane, kind, color in ((1, "produce", "tab:green"), (0, "wait", "tab:red")):
            spans = [(s - origin, e - s) for k, s, e in events if k == kind]
            axis.broken_barh(spans, (lane - 0.4, 0.8), color=color)
        axis.set_yticks([0, 1], ["loop waits", "producer"])
        axis.set_title(f"{contestant.label}: timeline")
        axis.set_xlabel("seconds")
        stats = result.typical(contestant).stats
        if stats is not None and stats.workers:  # num_workers="auto": the count over time
            _draw_workers(axis, stats.workers, origin, max(end for _, _, end in events))
    save_figure(plt, figure, path)


def _draw_workers(
    axis: Any, counts: tuple[tuple[float, int, str], ...], origin: float, end: float
) -> None:
    """The worker count over the timeline of ``axis``, on a scale of its own."""
    times = [max(0.0, at - origin) for at, _, _ in counts] + [end - origin]
    workers = [count for _, count, _ in counts]
    twin = axis.twinx()
    twin.step(times, [*workers, workers[-1]], where="post", color="tab:purple")
    twin.set_ylim(0, max(workers) + 1)
    twin.set_ylabel("workers", color="tab:purple")


def save_figure(plt: Any, figure: Any, path: str | os.PathLike[str]) -> None:
    """Lay out ``figure``, write it to ``path`` and close it."""
    figure.tight_layout()
    try:
        figure.savefig(path)
    except OSError as exc:
        raise BenchError(f"cannot write the plot to {str(path)!r}: {exc}") from exc
    finally:
        plt.close(figure)
