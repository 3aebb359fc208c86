"""Shared pieces of the benchmark scripts: contestants, timing, medians and tables.

Every benchmark runs plain ``DataLoader``, the naive ``BackgroundGenerator`` subclass (the
three-line pattern copied into many repositories) and every available backend, in one
process, alternating runs, and reports medians.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from time import perf_counter
from typing import Any

import torch
from prefetch_generator import BackgroundGenerator
from torch.utils.data import DataLoader

from dataloaderx import DataLoaderX, available_backends, get_backend
from dataloaderx.options import backend_option_names

BASELINE = "DataLoader"
NAIVE = "BackgroundGenerator-naive"

LoaderFactory = Callable[[], Iterable[Any]]


class NaiveBackgroundLoader(DataLoader[Any]):
    """The pattern ``def __iter__(self): return BackgroundGenerator(super().__iter__())``."""

    max_prefetch = 2

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]
        return BackgroundGenerator(super().__iter__(), max_prefetch=self.max_prefetch)


def backend_spec(
    name: str, depth: int, stats: bool = True, always_prefetch: bool = False
) -> dict[str, Any]:
    """``{"name": ..., "depth": depth}`` for backends with a depth, plus the stats option.

    ``always_prefetch`` turns ``adaptive`` off, for benchmarks of the prefetching itself.
    """
    spec: dict[str, Any] = {"name": name}
    options = backend_option_names(get_backend(name)) or []
    if "depth" in options:
        spec["depth"] = depth
    if always_prefetch and "adaptive" in options:
        spec["adaptive"] = False
    if not stats:
        spec["stats"] = False
    return spec


def contestants(
    dataset: Any,
    *,
    depth: int = 2,
    always_prefetch: bool = False,
    only: Sequence[str] | None = None,
    worker_method: str = "multiprocessing",
    **kwargs: Any,
) -> dict[str, LoaderFactory]:
    """Factories for DataLoader, the naive pattern and every backend, same arguments.

    With ``only``, DataLoader and the contestants named there (``--only``). The backends
    get ``worker_method`` too; DataLoader and the naive pattern have worker processes.
    """

    def naive() -> Iterable[Any]:
        loader = NaiveBackgroundLoader(dataset, **kwargs)
        loader.max_prefetch = depth
        return loader

    found: dict[str, LoaderFactory] = {
        BASELINE: lambda: DataLoader(dataset, **kwargs),
        NAIVE: naive,
    }
    for name in available_backends():
        spec = backend_spec(name, depth, always_prefetch=always_prefetch)
        found[name] = lambda spec=spec: DataLoaderX(
            dataset, backend=spec, worker_method=worker_method, **kwargs
        )
    if only is None:
        return found
    unknown = sorted(set(only) - set(found))
    if unknown:
        raise SystemExit(f"--only: no contestant named {unknown!r}; choose from {list(found)!r}")
    return {name: factory for name, factory in found.items() if name == BASELINE or name in only}


def time_epoch(loader: Iterable[Any], step: Callable[[Any], object] | None = None) -> float:
    """Seconds to iterate ``loader`` to the end, calling ``step`` on each batch."""
    start = perf_counter()
    for batch in loader:
        if step is not None:
            step(batch)
    return perf_counter() - start


def rotated(names: list[str], round_number: int) -> list[str]:
    """``names`` starting ``round_number`` places further along, so no one always runs first."""
    shift = round_number % len(names)
    return names[shift:] + names[:shift]


def alternate(
    factories: dict[str, LoaderFactory], run: Callable[[Iterable[Any]], float], repeats: int
) -> dict[str, list[float]]:
    """Run every factory ``repeats`` times, round-robin, and collect the results.

    Each round starts one place further along (:func:`rotated`).
    """
    names = list(factories)
    results: dict[str, list[float]] = {name: [] for name in names}
    for round_number in range(repeats):
        for name in rotated(names, round_number):
            results[name].append(run(factories[name]()))
    return results


def bracketed(
    factories: dict[str, LoaderFactory],
    run: Callable[[Iterable[Any]], float],
    repeats: int,
    after_run: Callable[[str, Iterable[Any]], None] | None = None,
) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """Like :func:`alternate`, with a ``DataLoader`` run right before and after each other run.

    Returns the times and, for every contestant, one throughput ratio per round: the mean
    of the two ``DataLoader`` runs around it divided by its own time. A machine whose
    speed drifts by tens of percent within seconds (shared hosts, frequency scaling)
    moves both sides of each ratio alike. ``after_run(name, loader)`` is called after
    each contestant's run (for example to read ``loader.stats``).
    """
    others = [name for name in factories if name != BASELINE]
    times: dict[str, list[float]] = {name: [] for name in factories}
    ratios: dict[str, list[float]] = {name: [] for name in factories}
    for round_number in range(repeats):
        before = run(factories[BASELINE]())
        times[BASELINE].append(before)
        for name in rotated(others, round_number):
            loader = factories[name]()
            seconds = run(loader)
            if after_run is not None:
                after_run(name, loader)
            after = run(factories[BASELINE]())
            times[name].append(seconds)
            times[BASELINE].append(after)
            ratios[name].append((before + after) / 2 / seconds)
            ratios[BASELINE].append(before / after)
            before = after
    return times, ratios


def medians(results: dict[str, list[float]]) -> dict[str, float]:
    return {name: statistics.median(values) for name, values in results.items()}


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def parser(
    description: str, loaders: str | None = None, *, selectable: bool = False
) -> argparse.ArgumentParser:
    """The common options; with ``loaders``, also ``--loaders`` with that default; when
    ``selectable``, also ``--only`` (pass ``args.only`` to :func:`contestants`)."""
    result = argparse.ArgumentParser(description=description)
    result.add_argument("--repeats", type=int, default=3, help="runs per contestant (median)")
    if selectable:
        result.add_argument(
            "--only", nargs="+", metavar="NAME", help="time DataLoader and these contestants only"
        )
    if loaders is not None:
        result.add_argument(
            "--loaders",
            choices=("kept", "new"),
            default=loaders,
            help="kept: one loader per contestant for every run, after a first epoch; "
            "new: a new loader for every run (each pays for its own decision)",
        )
    return result


def kept_loaders(
    factories: dict[str, LoaderFactory],
    run: Callable[[Iterable[Any]], object],
    label: str,
    first_epochs: list[str],
) -> dict[str, LoaderFactory]:
    """One loader per contestant, for every run, after a first epoch with ``run``.

    Appends each adaptive loader's first-epoch mode line (what its decision cost) to
    ``first_epochs``.
    """
    loaders = {name: factory() for name, factory in factories.items()}
    for name, loader in loaders.items():
        run(loader)
        stats = getattr(loader, "stats", None)
        if stats is not None and stats.mode is not None:
            first_epochs.append(f"{label}, {name}, first epoch: {stats.mode}")
    return {name: lambda loader=loader: loader for name, loader in loaders.items()}


def print_machine() -> None:
    print(
        f"python {platform.python_version()}, torch {torch.__version__}, "
        f"{platform.machine()}, {torch.get_num_threads()} torch threads, "
        f"{platform.platform()}",
        file=sys.stderr,
    )
