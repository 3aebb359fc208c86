"""Pinned staging and copy threads of the ``cuda`` backend, on the recording fake device."""

from __future__ import annotations

import gc
import os
import threading
from typing import Any

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch.utils.data import DataLoader

from dataloaderx import DataLoaderX
from dataloaderx.backends.cuda import CudaBackend
from dataloaderx.device.host_copy import MIN_SPLIT_BYTES, CopyThreads, plan
from dataloaderx.device.staging import StagingPool, dense_span
from tests.fake_accelerator import RecordingAccelerator
from tests.helpers import RangeDataset, assert_same

pytestmark = pytest.mark.timeout(60)

#: Staging serves the producer thread: ``adaptive=False`` keeps the loader prefetching.
THREADED = {"name": "cuda", "adaptive": False}


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> RecordingAccelerator:
    api = RecordingAccelerator()
    monkeypatch.setattr(CudaBackend, "device_api", api)
    return api


def odd_tensors() -> list[torch.Tensor]:
    """One of each layout and dtype the staging must copy bit for bit."""
    return [
        torch.randn(700, 1000),  # large, contiguous: split across threads
        torch.randn(4, 3, 16, 16).contiguous(memory_format=torch.channels_last),
        torch.randn(300, 300)[:, ::3],  # a slice with gaps
        torch.arange(5).expand(4, 5),  # stride 0
        torch.randn(1000, 600).to(torch.bfloat16),
        torch.rand(100, 100) > 0.5,
        torch.randn(50, 50, dtype=torch.complex128),
        torch.tensor(3.5),  # zero-dimensional
    ]


def test_staged_views_equal_their_tensors_and_keep_dense_layouts() -> None:
    api = RecordingAccelerator()
    pool = StagingPool(api, slots=2)
    threads = CopyThreads(4, name="test")
    tensors = odd_tensors()
    try:
        slot, views, segments = pool.stage(tensors)
        threads.copy(segments)
        for tensor, view in zip(tensors, views, strict=True):
            assert torch.equal(view, tensor)
            assert api.is_pinned(view)
            if dense_span(tensor):
                assert view.stride() == tensor.stride()
            assert (view.data_ptr() - slot.buffer.data_ptr()) % 512 == 0
        pool.release(slot)
    finally:
        threads.close()
        pool.close()
    assert api.pinned_bytes == 0


def test_dense_span_tells_permuted_layouts_from_gaps() -> None:
    assert dense_span(torch.empty(2, 3, 4, 5))
    assert dense_span(torch.empty(2, 3, 4, 5).permute(0, 2, 3, 1))
    assert dense_span(torch.empty(1, 3, 1, 5)[:, :, :, :])
    assert not dense_span(torch.empty(4, 6)[:, :3])
    assert not dense_span(torch.empty(1, 5).expand(4, 5))


@given(
    sizes=st.lists(st.integers(1, 3 * MIN_SPLIT_BYTES // 4), min_size=1, max_size=12),
    threads=st.integers(1, 8),
)
def test_plan_covers_every_byte_once_and_never_splits_small_copies(
    sizes: list[int], threads: int
) -> None:
    segments = [(torch.empty(n // 4 + 1), torch.empty(n // 4 + 1)) for n in sizes]
    groups = plan(segments, threads)
    total = sum(s.numel() * 4 for _, s in segments)
    assert 1 <= len(groups) <= max(1, min(threads, total // MIN_SPLIT_BYTES))
    covered: dict[int, int] = {}
    for group in groups:
        for destination, source in group:
            assert destination.shape == source.shape
            covered[source.untyped_storage().data_ptr()] = (
                covered.get(source.untyped_storage().data_ptr(), 0) + source.numel()
            )
    assert sorted(covered.values()) == sorted(s.numel() for _, s in segments)


def test_a_slot_is_reused_only_after_its_copies_event_completed() -> None:
    api = RecordingAccelerator()
    pool = StagingPool(api, slots=2)
    batch = [torch.zeros(1000)]
    first, _, _ = pool.stage(batch)
    event = api.new_event(torch.device("privateuseone", 0))
    api.pending_events.add(event.number)
    pool.release_after(first, event)
    second, _, _ = pool.stage(batch)
    assert second is not first  # the first one's copy has not ended
    pool.release(second)
    third, _, _ = pool.stage(batch)
    assert third is second
    api.pending_events.clear()
    pool.release(third)
    fourth, _, _ = pool.stage(batch)
    fifth, _, _ = pool.stage(batch)
    assert {fourth, fifth} == {first, second}
    assert len(api.ops("pin_buffer")) == 2
    pool.release(fourth)
    pool.release(fifth)
    pool.close()
    assert api.pinned_bytes == 0


@pytest.mark.parametrize(
    ("ended_by", "message"),
    [("closing the pool", "used after close()"), ("closing the epoch", "epoch closed")],
)
def test_waiting_for_a_slot_ends(ended_by: str, message: str) -> None:
    api = RecordingAccelerator()
    pool = StagingPool(api, slots=1)
    pool.stage([torch.zeros(10)])  # reserved and never released
    epoch_closed = threading.Event()
    errors: list[BaseException] = []

    def wait() -> None:
        try:
            pool.stage([torch.zeros(10)], stop=epoch_closed.is_set)
        except RuntimeError as exc:
            errors.append(exc)

    waiter = threading.Thread(target=wait)
    waiter.start()
    waiter.join(0.2)
    assert waiter.is_alive()
    if ended_by == "closing the pool":
        pool.close()
    else:
        epoch_closed.set()
    waiter.join(5)
    assert not waiter.is_alive()
    assert message in str(errors[0])
    pool.close()


def test_pinned_memory_is_bounded_by_depth_plus_one_batches_and_kept_across_epochs(
    fake: RecordingAccelerator,
) -> None:
    loader = DataLoaderX(RangeDataset(64), batch_size=8, backend=THREADED)
    slot_bytes = max(4096, 8 * 8)  # eight int64 indices, in whole pages
    for _ in range(3):
        assert_same(list(loader), list(DataLoader(RangeDataset(64), batch_size=8)))
        assert 0 < fake.pinned_bytes <= (2 + 1) * slot_bytes
    assert fake.peak_pinned_bytes <= (2 + 1) * slot_bytes
    assert len(fake.ops("pin_buffer")) <= 2 + 1  # later epochs reuse the first one's slots
    loader.prefetch_backend.close()
    assert fake.pinned_bytes == 0
    loader.prefetch_backend.close()  # twice is fine
    assert_same(list(loader), list(DataLoader(RangeDataset(64), batch_size=8)))
    assert fake.pinned_bytes > 0  # the next epoch pinned new slots


def test_pinned_memory_is_given_back_when_the_loader_is_collected(
    fake: RecordingAccelerator,
) -> None:
    loader = DataLoaderX(RangeDataset(64), batch_size=8, backend=THREADED)
    list(loader)
    assert fake.pinned_bytes > 0
    del loader
    gc.collect()
    assert fake.pinned_bytes == 0


def test_a_forked_child_never_gives_back_the_parents_pinned_memory(
    fake: RecordingAccelerator, monkeypatch: pytest.MonkeyPatch
) -> None:
    backend = CudaBackend(adaptive=False)
    pool = backend._device.staging_pool(torch.device("privateuseone", 0))
    slot, _, _ = pool.stage([torch.zeros(10)])
    pool.release(slot)
    monkeypatch.setattr(os, "getpid", lambda: -1)  # as seen from a forked child
    backend.close()
    assert fake.pinned_bytes > 0
    assert not fake.ops("unpin_buffer")


def test_a_batch_that_outgrows_its_slot_replaces_it(fake: RecordingAccelerator) -> None:
    class Growing(torch.utils.data.Dataset[torch.Tensor]):
        def __len__(self) -> int:
            return 6

        def __getitem__(self, index: int) -> torch.Tensor:
            return torch.full((2000 * (index + 1),), index, dtype=torch.float32)

    batches = list(DataLoaderX(Growing(), batch_size=None, backend=THREADED))
    assert [int(b[0]) for b in batches] == list(range(6))
    assert fake.peak_pinned_bytes <= 3 * 4096 * -(-6 * 2000 * 4 // 4096)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_pin_memory_true_leaves_pinning_to_the_backend(
    fake: RecordingAccelerator, monkeypatch: pytest.MonkeyPatch, num_workers: int
) -> None:
    # DataLoader pins only where an accelerator is available; pretend there is one.
    monkeypatch.setattr(torch.accelerator, "is_available", lambda: True)
    options: dict[str, Any] = {"batch_size": 2, "num_workers": num_workers, "pin_memory": True}
    ours = DataLoaderX(RangeDataset(8), backend=THREADED, **options)
    with iter(ours) as iterator:
        assert iterator._pin_memory is False
        assert not hasattr(iterator, "_pin_memory_thread")
        batches = list(iterator)
    assert ours.pin_memory is True
    assert_same(batches, list(DataLoader(RangeDataset(8), batch_size=2)))
    if num_workers == 0:  # (with workers, DataLoader's own pin thread needs a real device)
        plain = DataLoaderX(RangeDataset(8), backend="thread", **options)
        assert plain._get_iterator()._pin_memory is True  # not iterated: that would pin


def test_copy_threads_end_with_the_epoch(fake: RecordingAccelerator) -> None:
    class Big(torch.utils.data.Dataset[torch.Tensor]):
        def __len__(self) -> int:
            return 8

        def __getitem__(self, index: int) -> torch.Tensor:
            return torch.full((3 * MIN_SPLIT_BYTES // 4,), index, dtype=torch.float32)

    loader = DataLoaderX(
        Big(), batch_size=None, backend=THREADED, backend_options={"pin_threads": 3}
    )
    seen: set[str] = set()
    for index, batch in enumerate(loader):
        seen.update(t.name for t in threading.enumerate() if "-pin-copy-" in t.name)
        assert int(batch[-1]) == index
    assert len(seen) == 2  # the producer copies one share itself
    with iter(loader) as iterator:
        next(iterator)
    assert not [t for t in threading.enumerate() if "-pin-copy-" in t.name and t.is_alive()]
