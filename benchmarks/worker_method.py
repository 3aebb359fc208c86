"""Worker threads against worker processes: ``DataLoaderX(worker_method="thread")``.

What is measured. Five workloads, each with ``num_workers`` N in ``--num-workers`` (default
2; ``--num-workers 1 2 4`` for the full set), on these loaders:

- ``processes``: ``DataLoader(num_workers=N, multiprocessing_context="fork")``, workers
  forked anew for every epoch;
- ``processes (persistent)``: the same with ``persistent_workers=True``;
- ``threads``: ``DataLoaderX(num_workers=N, worker_method="thread", backend="sync")``: the
  workers are threads of the loader's process and no prefetch thread runs on top, so that
  the workers alone are compared;
- ``loop thread``: ``DataLoader(num_workers=0)``, every item made by the training loop;
- with ``--backend NAME``, also ``threads + NAME backend``: worker threads under that
  prefetching backend (``--backend thread``: the default one).

Each run is a fresh process (this script with a hidden ``--child`` mode) that builds the
dataset, then builds the loader and iterates it for 2 epochs, and prints one JSON line:

- batches per second over both epochs, start-up included (building the loader, forking);
- time from ``iter(loader)`` to the first batch, in ms, of epoch 1 and of epoch 2 (the
  second shows what persistent workers save: no fork, no dataset hand-over);
- peak PSS, in MiB, of the process plus its worker processes, sampled every 100 ms by a
  background thread (``workloads.run_epochs``, with ``psutil``); PSS splits each shared
  page between the processes that map it, so the sum is the memory the run really holds,
  the fair figure for copy-on-read. Shared-memory batches that no process maps at the
  moment of a sample (in transit from a worker process) are not in it.

Why. Worker processes cost what threads do not: a fork per epoch (unless persistent);
every batch pickled through shared memory and a file descriptor to the loop; and memory
that grows as forked workers touch Python objects, whose reference counts dirty the pages
they live on and make the kernel copy them (copy-on-read, PyTorch issue 13246). Threads
share the GIL instead, so work that holds it does not run in parallel.

The workloads (batch size 32 unless stated; ``--batches`` batches per epoch, default 64):

1. ``copy-on-read``: 2,000,000 Python dicts held by the dataset; each item reads one of
   them and returns a 3-element tensor. Its items are about a hundred times cheaper than
   the others', so its epochs have ``COPY_ON_READ_SCALE`` (32) times ``--batches``: an
   epoch reads 65,536 dicts spread over the whole list, as an epoch over a large index of
   records does. A forked worker copies the pages its reads write reference counts to: here
   almost every page of the dicts' headers and of the strings, about 175 MiB per worker
   (the dicts' key tables are never written). Four times the reads grew the processes'
   peak PSS by 5% more, so the figure is of a worker that read the whole list;
2. ``torch ops``: a 3x224x224 uint8 image made from the index, cropped, flipped, converted
   to float and resized to 224x224 (``interpolate``): torch releases the GIL. Worker
   processes run torch with one intra-op thread each; worker threads and the loop thread
   use the process's setting (``--torch-threads N`` sets it; on a loaded 2-core host, two
   intra-op threads made the loop thread's torch calls several times slower);
3. ``JPEG decode``: one of 64 pre-encoded 256x256 JPEGs decoded by Pillow (skipped, with a
   note, where Pillow is not installed);
4. ``pure Python``: about 1 ms of integer arithmetic holding the GIL per item: threads are
   expected to lose to processes here;
5. ``1 MB tensors``: batch size 64, each item a fresh 1 MiB float32 tensor: the hand-over
   cost of worker processes.

Rounds (``--rounds``, default 3) alternate: each round runs every loader once, in an order
that starts one place further along each round, and the tables give medians per loader,
with ratios against non-persistent and persistent processes. At the end, one verdict line
per workload on the targets at N=2: ``threads`` throughput >= 1.3x ``processes`` and >=
1.2x ``processes (persistent)`` on workloads 1, 2, 3 and 5; peak PSS on workload 1 <= 0.6x
``processes``; time to the first batch of both epochs no slower than ``processes`` on every
workload; on workload 4, the ratio alone.

How to run (from the repository root)::

    python benchmarks/worker_method.py                         # N=2, 3 rounds: ~6-15 min
    python benchmarks/worker_method.py --num-workers 1 2 4     # the full set: ~20-45 min
    python benchmarks/worker_method.py --quick                 # 8 batches, 1 round: ~2-3 min
    python benchmarks/worker_method.py --quick --workloads "torch ops" "pure Python"
    python benchmarks/worker_method.py --backend thread --json # also under the thread backend
    python benchmarks/worker_method.py --tune 90               # what bench --tune picks: ~8 min

Times are of a shared 2-core machine; each run costs a Python and torch start-up (1-2 s)
plus, for ``copy-on-read``, building the 2,000,000 dicts (2-4 s), plus its 2 epochs. A
64-batch epoch of worker processes is meant to take 1-3 s; with the host's load average
at 5-8 it took about 7 s on workloads 2, 4 and 5 (the longer times above).

``--tune SECONDS`` runs ``dataloaderx bench --tune`` on each workload instead (no step, so
loading alone sets the pace) and prints its pick and runner-up, and whether it chose worker
threads (or no workers, where the loop's thread alone is faster), or worker processes on
the pure-Python workload, where threads hold the GIL.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import subprocess
import sys
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import _common as bench
import torch
from torch.utils.data import DataLoader, Dataset
from workloads import (
    BIG_TENSORS,
    COPY_ON_READ,
    JPEG,
    PURE_PYTHON,
    TORCH_OPS,
    BigTensors,
    CopyOnRead,
    JpegDecode,
    PurePython,
    TorchOps,
    jpeg_available,
    run_epochs,
    tune_recommendation,
)

from dataloaderx import DataLoaderX, available_backends
from dataloaderx.workers.method import MULTIPROCESSING, THREAD

WORKLOADS = (COPY_ON_READ, TORCH_OPS, JPEG, PURE_PYTHON, BIG_TENSORS)
#: The workloads on which threads are to be faster than processes (all but pure Python).
SPEED_TARGETS = (COPY_ON_READ, TORCH_OPS, JPEG, BIG_TENSORS)

PROCESSES = "processes"
PERSISTENT = "processes (persistent)"
THREADS = "threads"
LOOP = "loop thread"
#: ``threads + NAME backend`` with ``--backend NAME``.
BACKEND_PREFIX = "threads + "
BACKEND_SUFFIX = " backend"

BATCH_SIZE = 32
BIG_BATCH_SIZE = 64
BATCHES = 64
QUICK_BATCHES = 8
EPOCHS = 2
ROUNDS = 3
CHILD_TIMEOUT = 900.0

#: Batches per run of ``--tune``.
TUNE_BATCHES = 40
#: What ``--tune`` should pick: worker processes where the work holds the GIL; else worker
#: threads, or no workers where the loop's thread alone is faster still.
THREAD_PICK = "threads or no workers (processes on pure Python)"
#: The copy-on-read workload's epochs are this many times longer (see the docstring).
COPY_ON_READ_SCALE = 32

# Targets, at num_workers=2.
TARGET_WORKERS = 2
TARGET_VS_PROCESSES = 1.3
TARGET_VS_PERSISTENT = 1.2
TARGET_PSS = 0.6


# --- the datasets ---------------------------------------------------------------------------


DATASETS: dict[str, Callable[[int], Dataset[torch.Tensor]]] = {
    COPY_ON_READ: CopyOnRead,
    TORCH_OPS: TorchOps,
    JPEG: JpegDecode,
    PURE_PYTHON: PurePython,
    BIG_TENSORS: BigTensors,
}


def batch_size(workload: str) -> int:
    return BIG_BATCH_SIZE if workload == BIG_TENSORS else BATCH_SIZE


def tune_dataset(workload: str) -> Dataset[torch.Tensor]:
    """The dataset ``bench --tune`` sweeps, for ``--tune``: enough items for its runs."""
    return DATASETS[workload](TUNE_BATCHES * batch_size(workload))


#: ``MODULE:NAME`` factories for ``dataloaderx bench --tune --dataset``, by workload.
tune_copy_on_read = functools.partial(tune_dataset, "copy-on-read")
tune_torch_ops = functools.partial(tune_dataset, "torch ops")
tune_jpeg_decode = functools.partial(tune_dataset, "JPEG decode")
tune_pure_python = functools.partial(tune_dataset, "pure Python")
tune_big_tensors = functools.partial(tune_dataset, "1 MB tensors")
TUNE_FACTORIES = {
    "copy-on-read": "tune_copy_on_read",
    "torch ops": "tune_torch_ops",
    "JPEG decode": "tune_jpeg_decode",
    "pure Python": "tune_pure_python",
    "1 MB tensors": "tune_big_tensors",
}


# --- the loaders ----------------------------------------------------------------------------


def backend_loader(backend: str) -> str:
    return f"{BACKEND_PREFIX}{backend}{BACKEND_SUFFIX}"


def loader_names(backend: str | None) -> list[str]:
    names = [PROCESSES, PERSISTENT, THREADS, LOOP]
    return names if backend is None else [*names, backend_loader(backend)]


def make_loader(
    name: str, dataset: Dataset[torch.Tensor], workers: int, size: int
) -> Iterable[Any]:
    if name == PROCESSES:
        return DataLoader(
            dataset, batch_size=size, num_workers=workers, multiprocessing_context="fork"
        )
    if name == PERSISTENT:
        return DataLoader(
            dataset,
            batch_size=size,
            num_workers=workers,
            multiprocessing_context="fork",
            persistent_workers=True,
        )
    if name == THREADS:
        return DataLoaderX(
            dataset, batch_size=size, num_workers=workers, worker_method="thread", backend="sync"
        )
    if name == LOOP:
        return DataLoader(dataset, batch_size=size, num_workers=0)
    if name.startswith(BACKEND_PREFIX) and name.endswith(BACKEND_SUFFIX):
        backend = name[len(BACKEND_PREFIX) : -len(BACKEND_SUFFIX)]
        return DataLoaderX(
            dataset, batch_size=size, num_workers=workers, worker_method="thread", backend=backend
        )
    raise SystemExit(f"no loader named {name!r}")


# --- one run, in a fresh process ------------------------------------------------------------


def child(workload: str, name: str, workers: int, batches: int, torch_threads: int) -> None:
    if torch_threads > 0:
        torch.set_num_threads(torch_threads)
    size = batch_size(workload)
    if workload == COPY_ON_READ:
        batches *= COPY_ON_READ_SCALE
    dataset = DATASETS[workload](batches * size)
    result = run_epochs(lambda: make_loader(name, dataset, workers, size), EPOCHS)
    print(json.dumps(result), flush=True)


def run_child(
    workload: str, name: str, workers: int, batches: int, torch_threads: int, seen: set[str]
) -> dict[str, Any]:
    command = [sys.executable, __file__, "--child", workload, name, str(workers), str(batches)]
    command += ["--torch-threads", str(torch_threads)]
    output = subprocess.run(command, capture_output=True, text=True, timeout=CHILD_TIMEOUT)
    for line in output.stderr.splitlines():
        if line.strip() and line not in seen:  # warnings, each once
            seen.add(line)
            print(f"  [{workload}, {name}, N={workers}] {line}", file=sys.stderr)
    if output.returncode != 0:
        raise SystemExit(
            f"{workload!r}, {name!r}, num_workers={workers}: the run failed "
            f"(exit {output.returncode})"
        )
    return dict(json.loads(output.stdout.strip().splitlines()[-1]))


# --- summaries, tables and verdicts ---------------------------------------------------------


def summary(runs: list[dict[str, Any]]) -> dict[str, float]:
    return {
        "batches_per_s": statistics.median(run["batches_per_s"] for run in runs),
        "first_batch_ms_1": statistics.median(run["first_batch_ms"][0] for run in runs),
        "first_batch_ms_2": statistics.median(run["first_batch_ms"][1] for run in runs),
        "peak_pss_mib": statistics.median(run["peak_pss_mib"] for run in runs),
        "dataset_pss_mib": statistics.median(run["dataset_pss_mib"] for run in runs),
    }


def ratios(medians: dict[str, dict[str, float]], name: str) -> dict[str, float]:
    mine, processes = medians[name], medians[PROCESSES]
    persistent = medians[PERSISTENT]
    return {
        "vs_processes": mine["batches_per_s"] / processes["batches_per_s"],
        "vs_persistent": mine["batches_per_s"] / persistent["batches_per_s"],
        "pss_vs_processes": mine["peak_pss_mib"] / processes["peak_pss_mib"],
    }


def table(workload_results: dict[int, dict[str, dict[str, float]]]) -> str:
    header = [
        "workers",
        "loader",
        "batches/s",
        "vs processes",
        "vs persistent",
        "first batch ms (epoch 1 / 2)",
        "peak PSS MiB",
        "PSS vs processes",
    ]
    rows: list[list[str]] = []
    for workers, medians in workload_results.items():
        for name, values in medians.items():
            ratio = ratios(medians, name)
            rows.append(
                [
                    "0" if name == LOOP else str(workers),
                    name,
                    f"{values['batches_per_s']:.1f}",
                    f"{ratio['vs_processes']:.2f}x",
                    f"{ratio['vs_persistent']:.2f}x",
                    f"{values['first_batch_ms_1']:.1f} / {values['first_batch_ms_2']:.1f}",
                    f"{values['peak_pss_mib']:.0f}",
                    f"{ratio['pss_vs_processes']:.2f}x",
                ]
            )
    return bench.markdown_table(header, rows)


def mark(met: bool) -> str:
    return "yes" if met else "NO"


def verdict(workload: str, medians: dict[str, dict[str, float]] | None) -> tuple[str, bool | None]:
    """One line on the targets at num_workers=2, and whether they are met (None: no target)."""
    if medians is None:
        return f"{workload}: not measured at num_workers={TARGET_WORKERS}", None
    threads, processes = medians[THREADS], medians[PROCESSES]
    ratio = ratios(medians, THREADS)
    parts: list[str] = []
    checks: list[bool] = []
    if workload in SPEED_TARGETS:
        fast = ratio["vs_processes"] >= TARGET_VS_PROCESSES
        fast_persistent = ratio["vs_persistent"] >= TARGET_VS_PERSISTENT
        checks += [fast, fast_persistent]
        parts.append(
            f"{ratio['vs_processes']:.2f}x processes (>= {TARGET_VS_PROCESSES}: {mark(fast)}), "
            f"{ratio['vs_persistent']:.2f}x persistent "
            f"(>= {TARGET_VS_PERSISTENT}: {mark(fast_persistent)})"
        )
    else:
        parts.append(
            f"{ratio['vs_processes']:.2f}x processes, {ratio['vs_persistent']:.2f}x persistent "
            "(no target: GIL-bound)"
        )
    if workload == COPY_ON_READ:
        small = ratio["pss_vs_processes"] <= TARGET_PSS
        checks.append(small)
        parts.append(
            f"peak PSS {ratio['pss_vs_processes']:.2f}x processes (<= {TARGET_PSS}: {mark(small)})"
        )
    quick = all(threads[key] <= processes[key] for key in ("first_batch_ms_1", "first_batch_ms_2"))
    checks.append(quick)
    parts.append(
        f"first batch {threads['first_batch_ms_1']:.1f} / {threads['first_batch_ms_2']:.1f} ms "
        f"against {processes['first_batch_ms_1']:.1f} / {processes['first_batch_ms_2']:.1f} ms "
        f"(no slower: {mark(quick)})"
    )
    met = all(checks)
    return f"{workload}: threads at N={TARGET_WORKERS}: " + "; ".join(parts) + (
        " -> met" if met else " -> NOT met"
    ), met


# --- the main process -----------------------------------------------------------------------


def arguments() -> argparse.ArgumentParser:
    result = argparse.ArgumentParser(
        description=(__doc__ or "").split("\n\n", 1)[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    result.add_argument(
        "--workloads",
        nargs="+",
        choices=WORKLOADS,
        default=list(WORKLOADS),
        metavar="NAME",
        help=f"workloads to run, of {', '.join(repr(name) for name in WORKLOADS)} (all)",
    )
    result.add_argument(
        "--num-workers",
        nargs="+",
        type=int,
        default=[TARGET_WORKERS],
        metavar="N",
        help="worker counts (2; the full set: 1 2 4)",
    )
    result.add_argument(
        "--batches",
        type=int,
        default=None,
        help=f"batches per epoch ({BATCHES}; {QUICK_BATCHES} with --quick)",
    )
    result.add_argument(
        "--rounds",
        "--repeats",
        dest="rounds",
        type=int,
        default=None,
        help=f"runs per loader, alternated (median; {ROUNDS}, 1 with --quick)",
    )
    result.add_argument(
        "--backend",
        choices=available_backends(),
        default=None,
        help="also time worker threads under this prefetching backend",
    )
    result.add_argument(
        "--quick", action="store_true", help="a smoke run: fewer batches and 1 round"
    )
    result.add_argument(
        "--torch-threads",
        type=int,
        default=0,
        metavar="N",
        help="torch.set_num_threads(N) in the loader's process (worker processes always use 1; "
        "default: torch's own setting)",
    )
    result.add_argument("--json", action="store_true", help="print the results as JSON")
    result.add_argument(
        "--tune",
        type=float,
        default=None,
        metavar="SECONDS",
        help="instead: ask `dataloaderx bench --tune` (this budget each) to choose on each "
        "workload, with no step, and say whether it picks as expected: "
        f"{THREAD_PICK}",
    )
    result.add_argument(
        "--child",
        nargs=4,
        metavar=("WORKLOAD", "LOADER", "N", "BATCHES"),
        help=argparse.SUPPRESS,
    )
    return result


def measure(
    workloads: Sequence[str],
    counts: Sequence[int],
    names: list[str],
    batches: int,
    rounds: int,
    torch_threads: int,
) -> dict[str, dict[int, dict[str, list[dict[str, Any]]]]]:
    """Every run's result, by workload, worker count and loader."""
    seen: set[str] = set()
    results: dict[str, dict[int, dict[str, list[dict[str, Any]]]]] = {}
    for workload in workloads:
        results[workload] = {}
        for workers in counts:
            runs: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
            for round_number in range(rounds):
                for name in bench.rotated(names, round_number):
                    run = run_child(workload, name, workers, batches, torch_threads, seen)
                    runs[name].append(run)
                    first_1, first_2 = run["first_batch_ms"]
                    print(
                        f"  {workload}, N={workers}, round {round_number + 1}/{rounds}, "
                        f"{name}: {run['batches_per_s']:.1f} batches/s, first batch "
                        f"{first_1:.1f} / {first_2:.1f} ms, peak PSS "
                        f"{run['peak_pss_mib']:.0f} MiB",
                        file=sys.stderr,
                        flush=True,
                    )
            results[workload][workers] = runs
    return results


def tune(workloads: Sequence[str], budget: float) -> None:
    """Ask ``dataloaderx bench --tune`` (no step: loading alone) to choose on each workload,
    and print its pick, the runner-up and the peak memory of both."""
    rows = []
    for workload in workloads:
        print(f"  bench --tune on {workload} ...", file=sys.stderr, flush=True)
        pick = tune_recommendation(
            f"worker_method:{TUNE_FACTORIES[workload]}",
            batch_size=batch_size(workload),
            batches=TUNE_BATCHES,
            budget=budget,
        )
        if workload == PURE_PYTHON:
            expected = pick["num_workers"] > 0 and pick["worker_method"] == MULTIPROCESSING
        else:
            expected = pick["num_workers"] == 0 or pick["worker_method"] == THREAD
        rows.append(
            [
                workload,
                pick["setting"],
                pick["runner_up"] or "-",
                f"{100 * pick['margin']:.1f}%",
                "yes" if expected else "NO",
            ]
        )
    header = ["workload", "--tune's pick", "runner-up", "margin", f"picks {THREAD_PICK}"]
    print(bench.markdown_table(header, rows))


def main() -> None:
    args = arguments().parse_args()
    if args.tune:
        bench.print_machine()
        tune([name for name in WORKLOADS if name in args.workloads], args.tune)
        return
    if args.child:
        workload, name, workers, batches = args.child
        child(workload, name, int(workers), int(batches), args.torch_threads)
        return
    batches = args.batches or (QUICK_BATCHES if args.quick else BATCHES)
    rounds = args.rounds or (1 if args.quick else ROUNDS)
    workloads = [name for name in WORKLOADS if name in args.workloads]
    notes: list[str] = []
    if JPEG in workloads and not jpeg_available():
        workloads.remove(JPEG)
        notes.append(f"{JPEG}: skipped, Pillow is not installed")
        print(f"note: {notes[-1]}", file=sys.stderr)
    names = loader_names(args.backend)
    bench.print_machine()
    load = os.getloadavg()
    print(
        f"{os.cpu_count()} CPUs, load average {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}; "
        f"{batches} batches per epoch, {EPOCHS} epochs, {rounds} round(s), "
        f"{args.torch_threads or torch.get_num_threads()} torch threads in the loader's process, "
        f"num_workers {' '.join(map(str, args.num_workers))}",
        file=sys.stderr,
    )
    runs = measure(workloads, args.num_workers, names, batches, rounds, args.torch_threads)
    medians = {
        workload: {
            workers: {name: summary(by_name[name]) for name in names}
            for workers, by_name in by_workers.items()
        }
        for workload, by_workers in runs.items()
    }
    verdicts: dict[str, tuple[str, bool | None]] = {
        workload: verdict(workload, medians[workload].get(TARGET_WORKERS)) for workload in workloads
    }
    if args.json:
        document = {
            "settings": {
                "batches": batches,
                "epochs": EPOCHS,
                "rounds": rounds,
                "num_workers": args.num_workers,
                "loaders": names,
                "python": sys.version.split()[0],
                "torch": torch.__version__,
                "torch_threads": args.torch_threads or torch.get_num_threads(),
                "cpus": os.cpu_count(),
            },
            "notes": notes,
            "workloads": {
                workload: {
                    str(workers): {
                        name: {
                            **medians[workload][workers][name],
                            **ratios(medians[workload][workers], name),
                            "runs": runs[workload][workers][name],
                        }
                        for name in names
                    }
                    for workers in medians[workload]
                }
                for workload in workloads
            },
            "verdicts": {
                workload: {"line": line, "met": met} for workload, (line, met) in verdicts.items()
            },
        }
        print(json.dumps(document, indent=2))
        return
    for workload in workloads:
        size = batch_size(workload)
        dataset = statistics.median(
            values[LOOP]["dataset_pss_mib"] for values in medians[workload].values()
        )
        print(
            f"\n{workload}: batch size {size}, {batches} batches per epoch, {EPOCHS} epochs, "
            f"medians of {rounds} round(s); PSS with the dataset built, before any loader: "
            f"{dataset:.0f} MiB\n"
        )
        print(table(medians[workload]))
    print()
    for note in notes:
        print(note)
    for line, _ in verdicts.values():
        print(line)


if __name__ == "__main__":
    main()
