"""1,000 short epochs per backend: threads, child processes and memory stay flat."""

from __future__ import annotations

import gc
import threading

import psutil
import pytest
from torch.utils.data import DataLoader

from dataloaderx import DataLoaderX
from tests.helpers import child_pids, wait_until_clean
from tests.reliability_support import KindDataset

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

EPOCHS = 1_000
WARM_UP = 100
#: Every this many epochs uses 2 worker processes (they are slow to start on 2 cores).
WORKER_EVERY = 100
FAIL_AT = 3


def one_epoch(loaders: dict[str, DataLoaderX[object]], epoch: int) -> int:
    """Run epoch ``epoch``: full, left after one batch, or ended by an error; return batches."""
    workers = "workers" if epoch % WORKER_EVERY == WORKER_EVERY - 1 else "inline"
    mode = ("full", "break", "error")[epoch % 3]
    loader = loaders[f"{mode}-{workers}"]
    seen = 0
    failure = ""
    try:
        for _batch in loader:
            seen += 1
            if mode == "break":
                break
    except ValueError as exc:
        failure = str(exc)
    assert (f"bad index {FAIL_AT}" in failure) == (mode == "error"), (epoch, failure)
    return seen


def _rss() -> int:
    gc.collect()
    rss: int = psutil.Process().memory_info().rss
    return rss


def test_a_thousand_mixed_epochs_leak_nothing(backend: str) -> None:
    loaders = {
        f"{mode}-{workers}": DataLoaderX(
            KindDataset(6, "dict", frozenset({FAIL_AT}) if mode == "error" else frozenset()),
            batch_size=2,
            num_workers=2 if workers == "workers" else 0,
            backend=backend,
        )
        for mode in ("full", "break", "error")
        for workers in ("inline", "workers")
    }
    expected = {"full": len(DataLoader(KindDataset(6, "dict"), batch_size=2)), "break": 1}
    threads = set(threading.enumerate())
    children = child_pids()
    baseline = 0
    for epoch in range(EPOCHS):
        seen = one_epoch(loaders, epoch)
        mode = ("full", "break", "error")[epoch % 3]
        assert seen == expected.get(mode, FAIL_AT // 2), (epoch, mode, seen)
        if epoch % 50 == 49:
            left_threads, left_children = wait_until_clean(threads, children, within=2.0)
            assert left_threads == [], epoch
            assert left_children == set(), epoch
        if epoch == WARM_UP - 1:
            baseline = _rss()
    final = _rss()
    assert final <= baseline * 1.05, f"RSS grew from {baseline} to {final} bytes"
