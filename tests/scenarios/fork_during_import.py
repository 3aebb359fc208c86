"""Fork a loader's workers while another iterator's producer thread is importing a module.

Usage: fork_during_import.py BACKEND [--unguarded]. Items are :class:`Tagged` named tuples
from ``tests.scenarios.late_batch``, a module the main thread never imports: the workers
import it to build items, and the parent first imports it when the producer thread of the
first iterator unpickles a batch. A finder on ``sys.meta_path`` keeps any thread but the
main one executing that module for :data:`HOLD_SECONDS`; meanwhile the main thread calls
``iter()`` a second time, which forks two more workers. A worker forked at that moment
inherits the module's import lock, held by a thread it does not have, and waits forever
when it imports the module. ``--unguarded`` turns the fork guard off, to show that: the
loader's ``timeout`` then turns the stuck worker into ``DataLoader``'s own error.

Prints one JSON line: whether the first iterator has a producer thread, whether that
thread was the one importing the module, the values of both iterators' batches, and the
error that ended the loop (``null`` for none).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import json
import sys
import threading
import time
from collections.abc import Sequence
from types import ModuleType
from typing import Any

import torch
from torch.utils.data import Dataset

import dataloaderx._fork_guard
from dataloaderx import DataLoaderX

LATE_MODULE = "tests.scenarios.late_batch"
HOLD_SECONDS = 1.0
#: DataLoader's ``timeout``: how long the loop waits for a worker's batch.
BATCH_TIMEOUT_SECONDS = 15.0


class HoldImportInThreads(importlib.abc.MetaPathFinder):
    """Keeps a non-main thread executing ``module`` for :data:`HOLD_SECONDS`.

    The hold is in ``exec_module``, where the importing thread holds the module's own lock
    but not the interpreter's global import lock (which finders run under, and which
    ``fork()`` itself waits for).
    """

    def __init__(self, module: str) -> None:
        self.module = module
        self.entered = threading.Event()

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != self.module or threading.current_thread() is threading.main_thread():
            return None  # the usual finders take it from here
        spec = importlib.machinery.PathFinder.find_spec(fullname, path, target)
        if spec is not None and isinstance(spec.loader, importlib.abc.Loader):
            spec.loader = HeldLoader(spec.loader, self.entered)
        return spec


class HeldLoader(importlib.abc.Loader):
    """Runs ``inner``'s ``exec_module`` after signalling ``entered`` and sleeping."""

    def __init__(self, inner: importlib.abc.Loader, entered: threading.Event) -> None:
        self.inner = inner
        self.entered = entered

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self.inner.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self.entered.set()
        time.sleep(HOLD_SECONDS)
        self.inner.exec_module(module)


class LateDataset(Dataset[Any]):
    """Item ``i`` is ``Tagged(tensor(i))``, built in a worker (which imports the module)."""

    def __len__(self) -> int:
        return 24

    def __getitem__(self, index: int) -> Any:
        late_batch = importlib.import_module(LATE_MODULE)
        return late_batch.Tagged(torch.tensor(index))


def main(backend: str, guarded: bool) -> None:
    if not guarded:
        dataloaderx._fork_guard.wait_for_producer_imports = lambda timeout: True
    finder = HoldImportInThreads(LATE_MODULE)
    sys.meta_path.insert(0, finder)
    loader = DataLoaderX(
        LateDataset(),
        batch_size=4,
        num_workers=2,
        timeout=BATCH_TIMEOUT_SECONDS,
        backend=backend,
    )
    first = iter(loader)
    producers = [t for t in threading.enumerate() if t.name.startswith("dataloaderx-")]
    producer_imported = bool(producers) and finder.entered.wait(timeout=30.0)
    second = iter(loader)  # forks two workers while the producer is inside the import
    batches: tuple[list[list[int]], list[list[int]]] = ([], [])
    error = None
    try:
        for left, right in zip(first, second, strict=True):
            batches[0].append(left.value.tolist())
            batches[1].append(right.value.tolist())
    except RuntimeError as exc:
        error = str(exc)
    report = {
        "producer_thread": bool(producers),
        "producer_imported": producer_imported,
        "first": batches[0],
        "second": batches[1],
        "error": error,
    }
    print(json.dumps(report), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], guarded="--unguarded" not in sys.argv[2:])
