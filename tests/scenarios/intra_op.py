"""Which intra-op thread count each thread of a loader with worker threads sees; report it.

Usage: intra_op.py BACKEND [--process N] [--init N] [--no-runtime]. With ``--process``, the
loop's thread calls ``torch.set_num_threads(N)`` first; with ``--init``, ``worker_init_fn``
does; with ``--no-runtime``, no OpenMP runtime is found (as on macOS and Windows). One
epoch of 16 batches of 2 items from 2 worker threads: each item records its worker
thread's count; the sampler records the count of each thread that draws indices from it
(the loop's, then a prefetching backend's producer); the loop records its own count and
that of a thread it starts, after the first batch and again after the epoch. Prints one
JSON line.
"""

from __future__ import annotations

import argparse
import json
import threading
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import Dataset, Sampler

import dataloaderx.workers.intra_op as intra_op
from dataloaderx import DataLoaderX

ITEMS = 32


class Counts(Dataset[torch.Tensor]):
    """Item ``i``: ``i`` and the count the worker thread that makes it sees."""

    def __len__(self) -> int:
        return ITEMS

    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.tensor([index, torch.get_num_threads()])


class RecordingSampler(Sampler[int]):
    """``range(ITEMS)``, noting the thread and its count at every index drawn."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, int]] = []

    def __len__(self) -> int:
        return ITEMS

    def __iter__(self) -> Iterator[int]:
        for index in range(ITEMS):
            self.seen.append((threading.current_thread().name, torch.get_num_threads()))
            yield index


def new_thread_count() -> int:
    """The count a thread started now sees."""
    found: list[int] = []
    thread = threading.Thread(target=lambda: found.append(torch.get_num_threads()))
    thread.start()
    thread.join()
    return found[0]


def main(backend: str, process_count: int | None, init_count: int | None, no_runtime: bool) -> None:
    if process_count is not None:
        torch.set_num_threads(process_count)
    if no_runtime:
        intra_op._loaded_runtime = lambda: None
    sampler = RecordingSampler()
    copier: list[tuple[str, int]] = []

    def record_copier(batch: torch.Tensor) -> torch.Tensor:
        copier.append((threading.current_thread().name, torch.get_num_threads()))
        return batch

    options: dict[str, Any] = {"name": backend}
    if backend in ("thread", "cuda"):
        options["adaptive"] = False  # a producer thread draws the later indices (and copies)
    if backend == "cuda":
        options["transform"] = record_copier
    init = None if init_count is None else (lambda _: torch.set_num_threads(init_count))
    loader = DataLoaderX(
        Counts(),
        batch_size=2,
        sampler=sampler,
        num_workers=2,
        worker_method="thread",
        worker_init_fn=init,
        backend=options,
    )
    report: dict[str, Any] = {
        "process": torch.get_num_threads(),
        "workers": [],
        "per_thread": intra_op.one_intra_op_thread() is not None,
    }
    for number, batch in enumerate(loader):
        report["workers"] += batch[:, 1].tolist()
        if number == 0:
            report["loop_during"] = torch.get_num_threads()
            report["new_thread_during"] = new_thread_count()
    report["loop_after"] = torch.get_num_threads()
    report["new_thread_after"] = new_thread_count()
    report["sampler"] = sampler.seen
    report["copier"] = copier
    print(json.dumps(report), flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("backend")
    parser.add_argument("--process", type=int, default=None)
    parser.add_argument("--init", type=int, default=None)
    parser.add_argument("--no-runtime", action="store_true")
    args = parser.parse_args()
    main(args.backend, args.process, args.init, args.no_runtime)
