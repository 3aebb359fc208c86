"""``max_bytes``: the bytes of tensors held in the buffer never exceed the cap.

The one exception, a batch larger than the cap, passes through alone. Checked on the
channel itself and through every prefetching backend, with fuzzed batch sizes.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader

from dataloaderx import DataLoaderX
from dataloaderx.engine.byte_budget import ByteBudget, batch_bytes
from dataloaderx.engine.channel import new_channel
from dataloaderx.engine.stream import END, ITEM, Envelope
from tests.helpers import Pair, assert_same

pytestmark = pytest.mark.timeout(120)

CAP = 4000  # bytes: 1000 float32 elements


def within_cap(peak: int, cap: int, sizes: list[int]) -> bool:
    """Whether ``peak`` obeys the cap: at most ``cap``, or one oversized batch alone."""
    return peak <= cap or peak in {size for size in sizes if size > cap}


@st.composite
def sizes_with_one_above(draw: st.DrawFn, cap: int) -> list[int]:
    sizes = draw(st.lists(st.integers(0, cap), min_size=1, max_size=60))
    above = draw(st.integers(cap + 1, 3 * cap))
    sizes.insert(draw(st.integers(0, len(sizes))), above)
    return sizes


@settings(max_examples=40)
@given(
    data=st.data(),
    cap=st.integers(1, 5000),
    depth=st.one_of(st.integers(1, 8), st.just("auto")),
)
def test_channel_keeps_under_the_cap(data: st.DataObject, cap: int, depth: Any) -> None:
    sizes = data.draw(sizes_with_one_above(cap))
    channel = new_channel(depth, 16, cap)
    stop = threading.Event()

    def produce() -> None:
        for index, size in enumerate(sizes):
            if not channel.put((ITEM, index, None), stop, size):
                return
        channel.put((END, None, None), stop)

    thread = threading.Thread(target=produce)
    thread.start()
    received = []
    try:
        while True:
            envelope: Envelope = channel.get(thread.is_alive)
            if envelope[0] == END:
                break
            received.append(envelope[1])
    finally:
        stop.set()
        channel.clear()
        thread.join(5)
    assert received == list(range(len(sizes)))
    assert within_cap(channel.usage().peak_bytes, cap, sizes)


def test_budget_admits_an_oversized_batch_only_alone() -> None:
    budget = ByteBudget(100)
    assert budget.fits(500)  # nothing held: it passes alone
    budget.add(500)
    assert not budget.fits(1)
    budget.remove(500)
    budget.add(60)
    assert budget.fits(40)
    assert not budget.fits(41)
    assert budget.peak == 500
    assert ByteBudget(None).fits(10**12)


def test_batch_bytes_walks_nested_batches_and_counts_a_tensor_once() -> None:
    shared = torch.zeros(10)  # 40 bytes
    batch = {
        "x": shared,
        "pair": Pair(torch.zeros(2, dtype=torch.uint8), "name"),
        "again": [shared, (torch.zeros(3, dtype=torch.float64),)],
        "sparse": torch.eye(3).to_sparse(),
    }
    sparse = batch["sparse"]
    sparse_bytes = sparse._indices().nbytes + sparse._values().nbytes
    assert batch_bytes(batch) == 40 + 2 + 24 + sparse_bytes
    assert batch_bytes(batch, device_only=True) == 0
    assert batch_bytes(7) == 0


class SizedDataset(torch.utils.data.Dataset[dict[str, Any]]):
    """Item ``i`` holds ``sizes[i]`` bytes of tensors, split between two fields."""

    def __init__(self, sizes: list[int]) -> None:
        self.sizes = sizes

    def __len__(self) -> int:
        return len(self.sizes)

    def __getitem__(self, index: int) -> dict[str, Any]:
        elements = self.sizes[index] // 4
        half = elements // 2
        return {
            "a": torch.full((half,), float(index)),
            "rest": (torch.full((elements - half,), float(index)), index),
        }


PREFETCHING = ["thread", "background", "auto"]


@pytest.mark.parametrize("backend", PREFETCHING)
@settings(max_examples=10)
@given(data=st.data(), depth=st.sampled_from([2, 8, "auto"]))
def test_loader_keeps_under_the_cap(backend: str, data: st.DataObject, depth: Any) -> None:
    sizes = [4 * (size // 4) for size in data.draw(sizes_with_one_above(CAP))]
    dataset = SizedDataset(sizes)
    options = {"depth": depth, "max_bytes": CAP}
    loader = DataLoaderX(dataset, batch_size=None, backend=backend, backend_options=options)
    batches = list(loader)
    assert_same(batches, list(DataLoader(dataset, batch_size=None)))
    stats = loader.stats
    assert stats is not None
    assert stats.peak_bytes is not None
    assert within_cap(stats.peak_bytes, CAP, sizes)


@pytest.mark.parametrize("backend", PREFETCHING)
def test_producer_fills_the_buffer_up_to_the_cap(backend: str) -> None:
    # 400-byte batches, a cap of 10 of them and depth 16: the cap is what binds.
    dataset = SizedDataset([400] * 60)
    options = {"depth": 16, "max_bytes": "4000B"}
    loader = DataLoaderX(dataset, batch_size=None, backend=backend, backend_options=options)
    with iter(loader) as iterator:
        next(iterator)
        deadline = time.monotonic() + 10
        peak = 0
        while peak < 4000 and time.monotonic() < deadline:
            time.sleep(0.01)
            stats = loader.stats
            assert stats is not None
            assert stats.peak_bytes is not None
            peak = stats.peak_bytes
        assert peak == 4000  # it ran ahead to the cap, and no further
        time.sleep(0.05)
        stats = loader.stats
        assert stats is not None
        assert stats.peak_bytes == 4000
        assert len(list(iterator)) == 59


@pytest.mark.parametrize(
    ("value", "expected"),
    [(1, 1), ("2GiB", 2 * 1024**3), ("1.5GB", 1_500_000_000), ("512 mib", 512 * 1024**2)],
)
def test_max_bytes_accepts_ints_and_sizes(value: Any, expected: int) -> None:
    loader = DataLoaderX([1, 2], backend="thread", backend_options={"max_bytes": value})
    assert loader.prefetch_backend.describe()["max_bytes"] == expected
