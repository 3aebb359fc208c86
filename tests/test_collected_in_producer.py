"""An abandoned iterator may be garbage collected in its own producer thread: nothing hangs."""

from __future__ import annotations

import gc
import threading

import pytest
import torch
from torch.utils.data import Dataset

from dataloaderx import DataLoaderX, get_backend
from dataloaderx.options import backend_option_names
from tests.helpers import wait_until_clean

pytestmark = pytest.mark.timeout(60)


class CollectingDataset(Dataset[torch.Tensor]):
    """From index 2 on, waits for ``go`` and then runs the garbage collector."""

    def __init__(self, size: int, go: threading.Event) -> None:
        self.size = size
        self.go = go

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> torch.Tensor:
        if index >= 2 and self.go.wait(timeout=10.0):
            gc.collect()
        return torch.tensor(index)


def test_iterator_collected_in_its_producer_thread_stops(backend: str) -> None:
    threads = set(threading.enumerate())
    go = threading.Event()
    options = backend_option_names(get_backend(backend))
    depth = {"depth": 1} if options is None or "depth" in options else {}
    loader = DataLoaderX(
        CollectingDataset(50, go), batch_size=1, backend=backend, backend_options=depth
    )
    iterator = iter(loader)
    assert int(next(iterator)) == 0
    iterator.cycle = iterator  # only the garbage collector can free it now
    del iterator
    go.set()  # the producer, making batch 2 with its buffer full, runs the collector
    left, _ = wait_until_clean(threads, set(), within=2.0)
    assert left == []
