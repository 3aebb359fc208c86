"""Epochs left early, each followed by the next epoch's fork of its workers.

Usage: left_epochs.py LOADER EPOCHS [--leave HOW ...] [--adaptive BOOL] [--collect-in-workers]

LOADER is ``DataLoader`` (the reference), ``prefetch`` (``prefetch()`` around a
``DataLoader``) or a backend name. EPOCHS epochs are left early each way HOW (default: all):

* ``error``: its first batch raises ``ValueError``, which ends the ``for`` loop, as an
  exception leaves a training loop;
* ``break``: after its first batch;
* ``close``: ``close()`` after its first batch, the iterator still referenced;
* ``collect``: after its first batch, the iterator dropped and garbage collected;
* ``keep`` (not in the default, the control of the thread count): after its first batch,
  the iterator still referenced and open, as a second epoch running beside the next.

Then one clean epoch runs. Every epoch forks two workers. ``--collect-in-workers`` makes
each worker collect garbage as it starts, so that an iterator it inherited in a reference
cycle would be finalized there at once if nothing kept it alive.

stderr carries whatever the children print; stdout's last line is a JSON report: the
errors the epochs raised, the batches of the clean epoch, and for each fork the names of
the package's threads alive at that moment.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import threading
from typing import Any

from torch.utils.data import DataLoader

from dataloaderx import DataLoaderX, prefetch
from tests.helpers import FailingDataset

SIZE = 8
at_fork: list[list[str]] = []


def note_threads() -> None:
    names = [thread.name for thread in threading.enumerate()]
    at_fork.append(sorted(name for name in names if name.startswith("dataloaderx")))


def collect(worker_id: int) -> None:
    gc.collect()


def make_loader(args: argparse.Namespace, dataset: FailingDataset) -> Any:
    init = collect if args.collect_in_workers else None
    arguments: dict[str, Any] = {"batch_size": 2, "num_workers": 2, "worker_init_fn": init}
    if args.loader == "DataLoader":
        return DataLoader(dataset, **arguments)
    if args.loader == "prefetch":
        return prefetch(DataLoader(dataset, **arguments))
    options = {} if args.adaptive is None else {"adaptive": args.adaptive == "True"}
    return DataLoaderX(dataset, backend=args.loader, backend_options=options, **arguments)


def leave(loader: Any, how: str) -> Any:
    """One epoch, left early ``how``; returns the iterator if it is to stay referenced."""
    if how in ("error", "break"):
        for _batch in loader:
            break
        return None
    iterator = iter(loader)
    next(iterator)
    if how in ("close", "keep"):
        if how == "close":
            iterator.close()
        return iterator
    del iterator
    gc.collect()
    return None


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("loader")
    parser.add_argument("epochs", type=int)
    ways = ["error", "break", "close", "collect"]
    parser.add_argument("--leave", nargs="+", default=ways, choices=[*ways, "keep"])
    parser.add_argument("--adaptive", choices=["True", "False"])
    parser.add_argument("--collect-in-workers", action="store_true")
    args = parser.parse_args()
    os.register_at_fork(before=note_threads)
    dataset = FailingDataset(SIZE, frozenset())
    loader = make_loader(args, dataset)
    errors: list[str] = []
    kept = []  # the closed and kept iterators stay referenced until the end
    for how in args.leave:
        dataset.fail_at = frozenset({0}) if how == "error" else frozenset()
        for _ in range(args.epochs):
            try:
                kept.append(leave(loader, how))
            except Exception as exc:  # noqa: BLE001 - recorded
                errors.append(type(exc).__name__)
    del kept
    dataset.fail_at = frozenset()
    clean = [batch.tolist() for batch in loader]
    report = {"errors": errors, "clean": clean, "threads_at_fork": at_fork}
    print(json.dumps(report), flush=True)


if __name__ == "__main__":
    main()
