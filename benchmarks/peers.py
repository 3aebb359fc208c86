"""dataloaderx against the other PyTorch loaders, side by side, in one run.

What is measured. Five workloads (batch size 32, ``--num-workers`` workers, default 2, two
epochs of ``--batches`` batches, default 64; the copy-on-read epochs are 32 times longer,
as its items are a hundred times cheaper), on these loaders, each used as its docs show:

- ``DataLoader`` and ``DataLoader (persistent)``: PyTorch's, with worker processes;
- ``StatefulDataLoader``: torchdata's drop-in ``DataLoader`` with ``state_dict()``;
- ``nodes (thread)`` and ``nodes (process)``: torchdata.nodes, the graph its migration
  guide builds for a map-style dataset: ``SamplerWrapper`` over a ``BatchSampler``, a
  ``ParallelMapper`` that fetches and collates each batch (``method="thread"`` or
  ``"process"``), a ``Prefetcher``, a ``Loader``;
- ``SPDL``: SPDL's pipeline (``PipelineBuilder``): the batch sampler as its source, one
  ``pipe`` that fetches and collates a batch with ``concurrency`` = the worker count, in
  input order, on a thread pool of that size; one pipeline per epoch;
- ``dataloaderx threads``, ``dataloaderx processes`` and ``dataloaderx processes
  (persistent)``: ``DataLoaderX`` with its default backend, ``worker_method="thread"``,
  worker processes, and worker processes kept between epochs (the counterpart of
  ``DataLoader (persistent)``: the same workers, with dataloaderx's backend on top);
- ``dataloaderx tuned``: the setting ``dataloaderx bench --tune`` recommends for the
  workload (no step, ``--tune-budget`` seconds), as the YAML it prints, through
  ``DataLoaderX.from_config``.

Two tables per workload:

- **equal settings**: every loader with ``--num-workers`` workers (``dataloaderx tuned``
  left out): like for like;
- **best settings**: every loader with the worker count that made it fastest in a sweep
  of ``--sweep`` counts (default 0, 1, 2 and 4, where the loader takes them; one run
  each, both epochs), and
  ``dataloaderx tuned``. The peers' one setting here is the worker count; each keeps its
  other defaults. ``--no-sweep`` leaves this table out.

Each run is a fresh process that builds the dataset, then the loader, iterates both epochs
and reports (``workloads.run_epochs``): batches/s over both epochs with start-up, each
epoch's batches/s, the start-up (building the loader), the first batch of each epoch, the
time from an epoch's last batch to the end of its loop, peak PSS of the process and its
child processes, and the CPU time they spent per batch (which other jobs on a shared machine
move far less than the throughput).
Rounds alternate the loaders (``--rounds``, default 3); the tables give medians, with each
loader's throughput against ``DataLoader`` and against the best peer (every loader that is
not dataloaderx's). The verdict lines per workload compare dataloaderx's fastest loader
with the best peer in each table, over both epochs and in each epoch.

The workloads:

1. ``torch ops``: a 3x128x128 uint8 image from the index, cropped, flipped, to float,
   resized (``interpolate``) and normalised: torch releases the GIL;
2. ``JPEG decode``: a 256x256 JPEG decoded by Pillow and centre-cropped to 224x224;
3. ``pure Python``: about 1 ms of integer arithmetic per item, holding the GIL;
4. ``I/O latency``: 2 ms of waiting per item without the GIL (a read from remote storage);
5. ``copy-on-read``: 1,000,000 Python dicts held by the dataset, one read per item.

How to run (from the repository root; the peers are the ``peers`` extra)::

    pip install -e '.[peers]'
    python benchmarks/peers.py                      # ~60-90 min on 2 cores
    python benchmarks/peers.py --no-sweep           # equal settings only, ~25-40 min
    python benchmarks/peers.py --quick              # 8 batches, 1 round, no tuning or sweep
    python benchmarks/peers.py --workloads "torch ops" --loaders "nodes (thread)" \\
        "dataloaderx threads"
    python benchmarks/peers.py --json > peers.json
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import json
import os
import statistics
import subprocess
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import _common as bench
import torch
import workloads
import yaml
from torch.utils.data import BatchSampler, DataLoader, Dataset, SequentialSampler, default_collate
from workloads import COPY_ON_READ, IO_LATENCY, JPEG, PURE_PYTHON, TORCH_OPS

from dataloaderx import DataLoaderX

WORKLOADS = (
    TORCH_OPS,
    JPEG,
    PURE_PYTHON,
    IO_LATENCY,
    COPY_ON_READ,
)
#: Where dataloaderx's best is to be at least as fast as the best peer, and where 0.97x.
FULL_TARGET = (TORCH_OPS, JPEG, IO_LATENCY, COPY_ON_READ)
GIL_TARGET = 0.97

DATALOADER = "DataLoader"
PERSISTENT = "DataLoader (persistent)"
STATEFUL = "StatefulDataLoader"
NODES_THREAD = "nodes (thread)"
NODES_PROCESS = "nodes (process)"
SPDL = "SPDL"
X_THREADS = "dataloaderx threads"
X_PROCESSES = "dataloaderx processes"
X_PERSISTENT = "dataloaderx processes (persistent)"
X_TUNED = "dataloaderx tuned"
PEERS = (DATALOADER, PERSISTENT, STATEFUL, NODES_THREAD, NODES_PROCESS, SPDL)
OURS = (X_THREADS, X_PROCESSES, X_PERSISTENT, X_TUNED)
LOADERS = (*PEERS, *OURS)
#: The module each peer needs, for the note on a peer that is not installed.
NEEDS = {STATEFUL: "torchdata", NODES_THREAD: "torchdata", NODES_PROCESS: "torchdata"}
NEEDS[SPDL] = "spdl"

BATCH_SIZE = 32
BATCHES = 64
QUICK_BATCHES = 8
EPOCHS = 2
ROUNDS = 3
COPY_ON_READ_SCALE = 32
TUNE_BUDGET = 60.0
TUNE_BATCHES = 40
SWEEP = (0, 1, 2, 4)
#: The fewest workers a loader takes (persistent workers and SPDL's thread pool need one).
LEAST_WORKERS = {PERSISTENT: 1, X_PERSISTENT: 1, SPDL: 1}
CHILD_TIMEOUT = 900.0


def make_dataset(workload: str, size: int) -> Dataset[torch.Tensor]:
    if workload == TORCH_OPS:
        return workloads.TorchOps(size, image=128, crop=96, normalise=True)
    if workload == JPEG:
        return workloads.JpegDecode(size, crop=224)
    if workload == PURE_PYTHON:
        return workloads.PurePython(size)
    if workload == IO_LATENCY:
        return workloads.IoLatency(size, seconds=0.002)
    if workload == COPY_ON_READ:
        return workloads.CopyOnRead(size, records=1_000_000)
    raise SystemExit(f"no workload named {workload!r}")


def epoch_batches(workload: str, batches: int) -> int:
    return batches * COPY_ON_READ_SCALE if workload == COPY_ON_READ else batches


def tune_dataset(workload: str) -> Dataset[torch.Tensor]:
    """The dataset ``bench --tune`` sweeps: enough items for its runs."""
    return make_dataset(workload, TUNE_BATCHES * BATCH_SIZE)


#: ``MODULE:NAME`` factories for ``dataloaderx bench --tune --dataset``, by workload.
tune_torch_ops = functools.partial(tune_dataset, TORCH_OPS)
tune_jpeg = functools.partial(tune_dataset, JPEG)
tune_pure_python = functools.partial(tune_dataset, PURE_PYTHON)
tune_io_latency = functools.partial(tune_dataset, IO_LATENCY)
tune_copy_on_read = functools.partial(tune_dataset, COPY_ON_READ)
TUNE_FACTORIES = {
    TORCH_OPS: "tune_torch_ops",
    JPEG: "tune_jpeg",
    PURE_PYTHON: "tune_pure_python",
    IO_LATENCY: "tune_io_latency",
    COPY_ON_READ: "tune_copy_on_read",
}


# --- the loaders ----------------------------------------------------------------------------


class FetchAndCollate:
    """A batch of indices to a collated batch: the map function of torchdata.nodes' and
    SPDL's batch-level pipelines."""

    def __init__(self, dataset: Dataset[Any]) -> None:
        self.dataset = dataset

    def __call__(self, indices: list[int]) -> Any:
        return default_collate([self.dataset[index] for index in indices])


def batch_sampler(dataset: Dataset[Any]) -> BatchSampler:
    return BatchSampler(SequentialSampler(dataset), BATCH_SIZE, drop_last=False)  # type: ignore[arg-type]


def nodes_loader(dataset: Dataset[Any], workers: int, method: str) -> Iterable[Any]:
    import torchdata.nodes as tn

    node: Any = tn.SamplerWrapper(batch_sampler(dataset))
    node = tn.ParallelMapper(
        node, map_fn=FetchAndCollate(dataset), num_workers=workers, method=method, in_order=True
    )
    if workers > 0:  # with none, the mapper maps inline, and nothing is made ahead
        node = tn.Prefetcher(node, prefetch_factor=2 * workers)
    return tn.Loader(node)


class SpdlLoader:
    """An SPDL pipeline per epoch, stopped when the epoch's loop ends."""

    def __init__(self, dataset: Dataset[Any], workers: int) -> None:
        self.dataset = dataset
        self.workers = workers

    def __iter__(self) -> Iterator[Any]:
        from spdl.pipeline import PipelineBuilder

        pipeline = (
            PipelineBuilder()
            .add_source(batch_sampler(self.dataset))
            .pipe(FetchAndCollate(self.dataset), concurrency=self.workers, output_order="input")
            .add_sink(2 * self.workers)
            .build(num_threads=self.workers)
        )
        with pipeline.auto_stop():
            yield from pipeline.get_iterator(timeout=CHILD_TIMEOUT)


def make_loader(
    name: str, dataset: Dataset[Any], workers: int, tuned: dict[str, Any] | None
) -> Iterable[Any]:
    common: dict[str, Any] = {"batch_size": BATCH_SIZE, "num_workers": workers}
    if name == DATALOADER:
        return DataLoader(dataset, **common)
    if name == PERSISTENT:
        return DataLoader(dataset, persistent_workers=True, **common)
    if name == STATEFUL:
        from torchdata.stateful_dataloader import StatefulDataLoader

        return StatefulDataLoader(dataset, **common)
    if name in (NODES_THREAD, NODES_PROCESS):
        return nodes_loader(dataset, workers, "thread" if name == NODES_THREAD else "process")
    if name == SPDL:
        return SpdlLoader(dataset, workers)
    if name == X_THREADS:
        return DataLoaderX(dataset, worker_method="thread", **common)
    if name == X_PROCESSES:
        return DataLoaderX(dataset, **common)
    if name == X_PERSISTENT:
        return DataLoaderX(dataset, persistent_workers=True, **common)
    if name == X_TUNED:
        if tuned is None:
            raise SystemExit("dataloaderx tuned needs bench --tune's recommendation")
        return DataLoaderX.from_config(dataset, tuned)
    raise SystemExit(f"no loader named {name!r}")


# --- runs, each in a fresh process ----------------------------------------------------------


def child(workload: str, name: str, workers: str, batches: str, *, tuned: str | None) -> None:
    """One run, in this process: the arguments as the command line gives them."""
    dataset = make_dataset(workload, epoch_batches(workload, int(batches)) * BATCH_SIZE)
    setting = None if tuned is None else json.loads(tuned)
    result = workloads.run_epochs(lambda: make_loader(name, dataset, int(workers), setting), EPOCHS)
    print(json.dumps(result), flush=True)


def run_child(
    workload: str, name: str, workers: int, batches: int, tuned: dict[str, Any] | None
) -> dict[str, Any]:
    command = [sys.executable, __file__, "--child", workload, name, str(workers), str(batches)]
    if tuned is not None:
        command += ["--tuned", json.dumps(tuned)]
    output = subprocess.run(command, capture_output=True, text=True, timeout=CHILD_TIMEOUT)
    if output.returncode != 0:
        raise SystemExit(f"{workload!r}, {name!r}: the run failed:\n{output.stderr}")
    return dict(json.loads(output.stdout.strip().splitlines()[-1]))


def tuned_setting(workload: str, workers: int, budget: float) -> dict[str, Any]:
    """``bench --tune``'s recommendation for ``workload``, as ``from_config`` takes it."""
    recommendation = workloads.tune_recommendation(
        f"peers:{TUNE_FACTORIES[workload]}",
        batch_size=BATCH_SIZE,
        batches=TUNE_BATCHES,
        budget=budget,
        num_workers=workers,
    )
    return dict(yaml.safe_load(recommendation["yaml"]))


# --- summaries ------------------------------------------------------------------------------


def summary(runs: list[dict[str, Any]]) -> dict[str, float]:
    def median(key: str, index: int | None = None) -> float:
        return statistics.median(run[key] if index is None else run[key][index] for run in runs)

    return {
        "batches_per_s": median("batches_per_s"),
        "epoch_batches_per_s_1": median("epoch_batches_per_s", 0),
        "epoch_batches_per_s_2": median("epoch_batches_per_s", 1),
        "startup_ms": median("startup_ms"),
        "first_batch_ms_1": median("first_batch_ms", 0),
        "first_batch_ms_2": median("first_batch_ms", 1),
        "tail_ms_1": median("tail_ms", 0),
        "tail_ms_2": median("tail_ms", 1),
        "peak_pss_mib": median("peak_pss_mib"),
        "cpu_ms": median("cpu_ms"),
    }


def best(medians: dict[str, dict[str, float]], names: Iterable[str], key: str) -> str | None:
    present = [name for name in names if name in medians]
    return max(present, key=lambda name: medians[name][key], default=None)


def table(medians: dict[str, dict[str, float]]) -> str:
    peer = best(medians, PEERS, "batches_per_s")
    base = medians.get(DATALOADER, {}).get("batches_per_s")
    top = None if peer is None else medians[peer]["batches_per_s"]

    def ratio(to: float | None) -> Callable[[dict[str, float]], str]:
        return lambda values: "-" if to is None else f"{values['batches_per_s'] / to:.2f}x"

    def pair(key: str, digits: int) -> Callable[[dict[str, float]], str]:
        return lambda values: f"{values[key + '1']:.{digits}f} / {values[key + '2']:.{digits}f}"

    columns: dict[str, Callable[[dict[str, float]], str]] = {
        "batches/s": lambda values: f"{values['batches_per_s']:.1f}",
        "epoch 1 / 2 batches/s": pair("epoch_batches_per_s_", 1),
        "vs DataLoader": ratio(base),
        "vs best peer": ratio(top),
        "start-up ms": lambda values: f"{values['startup_ms']:.1f}",
        "first batch ms (1 / 2)": pair("first_batch_ms_", 0),
        "after last batch ms (1 / 2)": pair("tail_ms_", 0),
        "peak PSS MiB": lambda values: f"{values['peak_pss_mib']:.0f}",
        "CPU ms per batch": lambda values: f"{values['cpu_ms']:.1f}",
    }
    rows = [
        [name] + [cell(values) for cell in columns.values()] for name, values in medians.items()
    ]
    return bench.markdown_table(["loader", *columns], rows)


def verdict(workload: str, medians: dict[str, dict[str, float]], settings: str) -> str:
    """dataloaderx's fastest loader against the best peer at ``settings`` (``"equal"`` or
    ``"best"``): both epochs, and each epoch."""
    target = 1.0 if workload in FULL_TARGET else GIL_TARGET
    parts: list[str] = []
    met = True
    for key, label in (
        ("batches_per_s", "both epochs"),
        ("epoch_batches_per_s_1", "epoch 1"),
        ("epoch_batches_per_s_2", "epoch 2"),
    ):
        ours, peer = best(medians, OURS, key), best(medians, PEERS, key)
        if ours is None or peer is None:
            return f"{workload}, {settings} settings: no comparison (a side left out)"
        ratio = medians[ours][key] / medians[peer][key]
        met = met and ratio >= target
        parts.append(f"{label} {ratio:.2f}x ({ours} against {peer})")
    return (
        f"{workload}, {settings} settings: dataloaderx / best peer: {'; '.join(parts)}; "
        f"target >= {target}: " + ("met" if met else "NOT met")
    )


# --- the main process -----------------------------------------------------------------------


def arguments() -> argparse.ArgumentParser:
    result = argparse.ArgumentParser(
        description=(__doc__ or "").split("\n\n", 1)[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    result.add_argument("--workloads", nargs="+", choices=WORKLOADS, default=list(WORKLOADS))
    result.add_argument("--loaders", nargs="+", choices=LOADERS, default=list(LOADERS))
    result.add_argument("--num-workers", type=int, default=2)
    result.add_argument("--batches", type=int, default=None, help=f"per epoch ({BATCHES})")
    result.add_argument("--rounds", type=int, default=None, help=f"alternated ({ROUNDS})")
    result.add_argument(
        "--tune-budget",
        type=float,
        default=TUNE_BUDGET,
        help=f"seconds of bench --tune per workload, for {X_TUNED!r} ({TUNE_BUDGET:.0f})",
    )
    result.add_argument(
        "--sweep",
        type=int,
        nargs="+",
        default=list(SWEEP),
        help="worker counts each loader's best setting is picked from (0 1 2 4)",
    )
    result.add_argument("--no-sweep", action="store_true", help="equal settings only")
    result.add_argument(
        "--quick", action="store_true", help="8 batches, 1 round, no tuning or sweep"
    )
    result.add_argument("--json", action="store_true", help="print the results as JSON")
    result.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    result.add_argument("--tuned", default=None, help=argparse.SUPPRESS)
    return result


def available(names: Sequence[str], quick: bool) -> tuple[list[str], list[str]]:
    """The loaders that can run here, and a note on each left out."""
    kept: list[str] = []
    notes: list[str] = []
    for name in names:
        module = NEEDS.get(name)
        if module is not None and importlib.util.find_spec(module) is None:
            notes.append(f"{name}: left out, {module} is not installed (the 'peers' extra)")
        elif name == X_TUNED and quick:
            notes.append(f"{name}: left out with --quick")
        else:
            kept.append(name)
    return kept, notes


def main() -> None:
    args = arguments().parse_args()
    if args.child:
        child(*args.child, tuned=args.tuned)
        return
    rounds = args.rounds or (1 if args.quick else ROUNDS)
    batches = args.batches or (QUICK_BATCHES if args.quick else BATCHES)
    names, notes = available([name for name in LOADERS if name in args.loaders], args.quick)
    for note in notes:
        print(f"note: {note}", file=sys.stderr)
    bench.print_machine()
    load = os.getloadavg()
    print(
        f"{os.cpu_count()} CPUs, load average {load[0]:.1f}; batch size {BATCH_SIZE}, "
        f"num_workers {args.num_workers}, {batches} batches per epoch, {EPOCHS} epochs, "
        f"{rounds} round(s)",
        file=sys.stderr,
    )
    document: dict[str, Any] = {"notes": notes, "workloads": {}}
    equal_names = [name for name in names if name != X_TUNED]
    sweep = [] if args.quick or args.no_sweep else args.sweep
    for workload in (name for name in WORKLOADS if name in args.workloads):
        found: dict[str, Any] = {}
        rounds_of = functools.partial(alternated_rounds, workload, rounds, batches)
        counts = dict.fromkeys(equal_names, args.num_workers)
        found["equal"] = table_of(workload, "equal", rounds_of(counts, None))
        if sweep:
            counts = best_counts(workload, equal_names, sweep, batches)
            tuned = None
            if X_TUNED in names:
                print(f"  bench --tune on {workload} ...", file=sys.stderr, flush=True)
                tuned = tuned_setting(workload, args.num_workers, args.tune_budget)
                print(f"  {X_TUNED} on {workload}: {tuned}", file=sys.stderr, flush=True)
                counts[X_TUNED] = int(tuned.get("num_workers", 0))  # (for the table)
            found["best"] = table_of(workload, "best", rounds_of(counts, tuned))
            found["best"].update(counts=counts, tuned=tuned)
        document["workloads"][workload] = found
        if not args.json:
            for settings, part in found.items():
                print(f"\n{workload}, {settings} settings: medians of {rounds} round(s)\n")
                print(table(part["medians"]))
                if settings == "best":
                    print(f"\nworker counts: {part['counts']}; {X_TUNED}: {part['tuned']}")
    if args.json:
        print(json.dumps(document, indent=2))
        return
    print()
    for found in document["workloads"].values():
        for part in found.values():
            print(part["verdict"])


def alternated_rounds(
    workload: str,
    rounds: int,
    batches: int,
    counts: dict[str, int],
    tuned: dict[str, Any] | None,
) -> dict[str, list[dict[str, Any]]]:
    """``rounds`` rounds of every loader in ``counts`` with its worker count, alternated."""
    names = list(counts)
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
    for round_number in range(rounds):
        for name in bench.rotated(names, round_number):
            run = run_child(workload, name, counts[name], batches, tuned)
            runs[name].append(run)
            print(
                f"  {workload}, round {round_number + 1}/{rounds}, {name} "
                f"({counts[name]} workers): {run['batches_per_s']:.1f} batches/s",
                file=sys.stderr,
                flush=True,
            )
    return runs


def best_counts(
    workload: str, names: list[str], sweep: Sequence[int], batches: int
) -> dict[str, int]:
    """Each loader's fastest worker count (both epochs) among ``sweep``, one run each."""
    counts: dict[str, int] = {}
    for name in names:
        least = LEAST_WORKERS.get(name, 0)
        rates = {
            count: run_child(workload, name, count, batches, None)
            for count in sweep
            if count >= least
        }
        counts[name] = max(rates, key=lambda count: rates[count]["batches_per_s"])
        print(
            f"  {workload}, sweep, {name}: "
            + ", ".join(f"{count}: {run['batches_per_s']:.1f}" for count, run in rates.items())
            + f" batches/s: {counts[name]} workers",
            file=sys.stderr,
            flush=True,
        )
    return counts


def table_of(workload: str, settings: str, runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    medians = {name: summary(found) for name, found in runs.items()}
    return {"medians": medians, "runs": runs, "verdict": verdict(workload, medians, settings)}


if __name__ == "__main__":
    main()
