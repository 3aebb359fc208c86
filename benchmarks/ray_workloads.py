"""Ray workers against worker processes on one node, workload by workload.

What is measured. The five workloads of ``benchmarks/worker_method.py`` and the 2 ms I/O
latency of ``benchmarks/peers.py``, 2 workers, batch size 32 (64 for 1 MB tensors), 3
epochs of ``--batches`` batches (``copy-on-read``: 32 times as many, as in
``worker_method.py``), on three loaders:

- ``processes``: ``DataLoader(num_workers=2)``, workers forked anew for every epoch;
- ``persistent``: the same with ``persistent_workers=True``;
- ``ray``: ``DataLoaderX(num_workers=2, worker_method="ray", backend="sync")``, actors on
  the local Ray (kept between epochs, re-seeded each epoch as a fresh worker).

The figure is batches per second over epochs 2 and 3 (the mean of the two), the median of
``--rounds`` alternated rounds; epoch 1 (a fork, or new actors) is reported apart as its
time to the first batch. Ray is started once, before anything is timed (``ray.init``: the
"Ray already running" of a training job on a cluster), with ``benchmarks/`` on its
workers' ``PYTHONPATH`` so that actors import the datasets. Memory is not sampled (none
is reported here; ``ray_workers.py`` measures it): each sample costs CPU the loaders
share.

Targets (``docs/ray-workers.md``): Ray >= 0.97x processes on I/O latency, >= 0.8x on torch
ops, and on 1 MB tensors (64 MiB batches: the hand-over) >= 1.0x.

How to run (from the repository root)::

    python benchmarks/ray_workloads.py                  # 3 rounds: ~10-15 min
    python benchmarks/ray_workloads.py --quick --workloads "torch ops" "I/O latency"
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import ray
import torch
import worker_method
import workloads
from torch.utils.data import DataLoader, Dataset
from worker_method import COPY_ON_READ_SCALE, batch_size

from dataloaderx import DataLoaderX

HERE = Path(__file__).resolve().parent
WORKERS = 2
EPOCHS = 3
TARGETS = {workloads.IO_LATENCY: 0.97, workloads.TORCH_OPS: 0.8, workloads.BIG_TENSORS: 1.0}

DATASETS: dict[str, Callable[[int], Dataset[torch.Tensor]]] = {
    **worker_method.DATASETS,
    workloads.IO_LATENCY: workloads.IoLatency,
}
LOADERS: dict[str, Callable[[Dataset[torch.Tensor], int], Iterable[Any]]] = {
    "processes": lambda data, size: DataLoader(data, batch_size=size, num_workers=WORKERS),
    "persistent": lambda data, size: DataLoader(
        data, batch_size=size, num_workers=WORKERS, persistent_workers=True
    ),
    "ray": lambda data, size: DataLoaderX(
        data, batch_size=size, num_workers=WORKERS, worker_method="ray", backend="sync"
    ),
}


def one_run(workload: str, dataset: Dataset[torch.Tensor], name: str) -> tuple[float, float]:
    """Batches per second over the epochs after the first, and epoch 1's first batch (ms)."""
    result = workloads.run_epochs(
        lambda: LOADERS[name](dataset, batch_size(workload)), EPOCHS, memory=False
    )
    later = result["epoch_batches_per_s"][1:]
    return statistics.fmean(later), result["first_batch_ms"][0]


def measure(workload: str, batches: int, rounds: int) -> dict[str, tuple[float, float]]:
    scale = COPY_ON_READ_SCALE if workload == workloads.COPY_ON_READ else 1
    dataset = DATASETS[workload](batches * scale * batch_size(workload))
    names = list(LOADERS)
    runs: dict[str, list[tuple[float, float]]] = {name: [] for name in names}
    for round_number in range(rounds):
        for name in names[round_number % len(names) :] + names[: round_number % len(names)]:
            runs[name].append(one_run(workload, dataset, name))
    return {
        name: (
            statistics.median(rate for rate, _ in results),
            statistics.median(first for _, first in results),
        )
        for name, results in runs.items()
    }


def report(workload: str, medians: dict[str, tuple[float, float]]) -> str:
    processes, persistent, ray_rate = (medians[name][0] for name in LOADERS)
    ratio = ray_rate / processes
    target = TARGETS.get(workload)
    verdict = ""
    if target is not None:
        verdict = f" (target >= {target:.2f}x: {'met' if ratio >= target else 'not met'})"
    return (
        f"| {workload} | {processes:.1f} | {persistent:.1f} | {ray_rate:.1f} | "
        f"{ratio:.2f}x{verdict} | {ray_rate / persistent:.2f}x | "
        f"{medians['processes'][1]:.0f} / {medians['ray'][1]:.0f} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", nargs="+", choices=list(DATASETS), default=list(DATASETS))
    parser.add_argument("--batches", type=int, default=64, help="batches per epoch")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="16 batches, 1 round")
    arguments = parser.parse_args()
    batches, rounds = (16, 1) if arguments.quick else (arguments.batches, arguments.rounds)
    path = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HERE), path]))
    ray.init(address="local", include_dashboard=False, logging_level="ERROR")
    print(f"torch {torch.__version__}, ray {ray.__version__}, {os.cpu_count()} CPUs")
    print(f"\n## {WORKERS} workers, batches/s over epochs 2-{EPOCHS} (median of {rounds})\n")
    print(
        "| workload | processes | persistent | Ray | Ray / processes | Ray / persistent "
        "| epoch 1 first batch ms, processes / Ray |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for workload in arguments.workloads:
        if workload == workloads.JPEG and not workloads.jpeg_available():
            print(f"| {workload} | skipped: Pillow is not installed |", file=sys.stderr)
            continue
        print(report(workload, measure(workload, batches, rounds)), flush=True)


if __name__ == "__main__":
    main()
