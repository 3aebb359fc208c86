"""Which modules producer threads import while they receive batches from worker processes.

Usage: producer_imports.py BACKEND [--no-warm-up] [--always-prefetch]. In a fresh process,
runs two epochs of a
``DataLoaderX`` with two workers and records every module that a thread named
``dataloaderx-*`` starts to import. ``--no-warm-up`` skips importing the hand-off modules
in the consumer's thread, to show what a producer would import otherwise;
``--always-prefetch`` turns ``adaptive`` off, so that a producer receives the first batch
(adaptive, the consumer makes it inline).

Prints one JSON line: whether ``hmac`` was still to be imported when the loader started,
the number of batches of each epoch, and the modules the producer threads imported.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import json
import sys
import threading
from collections.abc import Sequence
from types import ModuleType

import dataloaderx.epoch.iterator
from dataloaderx import DataLoaderX
from tests.helpers import RangeDataset, always_prefetching


class ProducerImports(importlib.abc.MetaPathFinder):
    """Records the imports that producer threads start; finds nothing itself."""

    def __init__(self) -> None:
        self.names: list[str] = []

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if threading.current_thread().name.startswith("dataloaderx-"):
            self.names.append(fullname)
        return None


def main(backend: str, warm_up: bool, always_prefetch: bool) -> None:
    if not warm_up:
        dataloaderx.epoch.iterator.import_handoff_modules = lambda: None
    fresh = "hmac" not in sys.modules
    recorder = ProducerImports()
    sys.meta_path.insert(0, recorder)
    options = always_prefetching(backend) if always_prefetch else {}
    loader = DataLoaderX(
        RangeDataset(20), batch_size=4, num_workers=2, backend=backend, backend_options=options
    )
    batches = [len(list(loader)) for _ in range(2)]
    print(json.dumps({"fresh": fresh, "batches": batches, "imported": recorder.names}))


if __name__ == "__main__":
    main(
        sys.argv[1],
        warm_up="--no-warm-up" not in sys.argv[2:],
        always_prefetch="--always-prefetch" in sys.argv[2:],
    )
