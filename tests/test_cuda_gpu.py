"""The ``cuda`` backend on a real GPU (marker ``cuda``; skipped without one)."""

from __future__ import annotations

import gc
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from dataloaderx import DataLoaderX
from dataloaderx.engine import decision as mode_decision
from tests.helpers import RangeDataset, SwitchingPolicy

pytestmark = [pytest.mark.cuda, pytest.mark.timeout(300)]


class ShiftedDataset(Dataset[torch.Tensor]):
    """Item ``i`` (a whole batch) is ``arange(numel) % 1000 + i`` as int32.

    Its sum, ``base_sum + numel * i``, differs for every item, so a batch read before
    its copy ended, or after its memory was reused or overwritten, fails the checksum.
    """

    def __init__(self, size: int, numel: int) -> None:
        self.size = size
        self.numel = numel
        self.base = torch.arange(numel, dtype=torch.int32) % 1000
        self.base_sum = int(self.base.sum(dtype=torch.int64))

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> torch.Tensor:
        return self.base + index

    def checksum(self, index: int) -> int:
        return self.base_sum + self.numel * index


def sleep_cycles_per_ms() -> float:
    """GPU clock cycles per millisecond of ``torch.cuda._sleep``, measured."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(1_000_000)
    start.record()
    torch.cuda._sleep(20_000_000)
    end.record()
    end.synchronize()
    return 20_000_000 / start.elapsed_time(end)


@pytest.mark.parametrize("mode", ["prefetched", "inline", "decided"])
def test_no_race_between_copies_and_the_consumer_over_2000_batches(
    mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Alternates two phases of 50 batches, each aimed at one kind of missing safety, with
    batches made by a producer thread, inline (staged and copied on the side stream in the
    loop's thread), or as the adaptive decision chooses.

    * idle consumer stream (synchronised every step): each batch is read as soon as it
      is handed out, while its copy may still run; a missing wait reads a partial copy.
    * busy consumer stream (a 10 ms kernel first, so the stream falls far behind): each
      batch is read, then zeroed, long after Python dropped it; without allocator
      safety its memory is reused by later copies before those kernels run.
    """
    if mode == "inline":
        monkeypatch.setattr(mode_decision, "new_policy", lambda: SwitchingPolicy("I"))
    dataset = ShiftedDataset(2_000, 4_000_000)  # 16 MB batches
    options = {"depth": 3, "adaptive": mode != "prefetched"}
    loader = DataLoaderX(dataset, batch_size=None, backend="cuda", backend_options=options)
    cycles = int(sleep_cycles_per_ms() * 10)
    stream = torch.cuda.current_stream()
    sums = []
    for index, batch in enumerate(loader):
        if (index // 50) % 2 == 0:
            sums.append(batch.sum(dtype=torch.int64))
            stream.synchronize()
        else:
            torch.cuda._sleep(cycles)
            sums.append(batch.sum(dtype=torch.int64))
            batch.zero_()
        del batch
    got = torch.stack(sums).cpu().tolist()
    expected = [dataset.checksum(index) for index in range(len(dataset))]
    wrong = [index for index, (a, b) in enumerate(zip(got, expected, strict=True)) if a != b]
    assert wrong == [], f"{len(wrong)} corrupted batches, first at {wrong[:5]}"


def collect_garbage(worker_id: int) -> None:
    gc.collect()


def test_workers_forked_while_device_batches_are_garbage_release_none_of_them() -> None:
    """Workers forked while a cycle holds handed-out device batches (each with the loop's
    stream recorded) and a loader's events collect garbage as they start: releasing any of
    those would call into CUDA, which aborts a forked child. The workers' epoch completes."""
    dataset = ShiftedDataset(8, 250_000)  # 1 MB batches: staged, copied on the side stream
    gc.disable()  # so that the cycles reach the workers
    try:
        for options in ({"adaptive": False}, {}):
            loader = DataLoaderX(dataset, batch_size=None, backend="cuda", backend_options=options)
            cycle: list[Any] = [list(loader), loader]
            cycle.append(cycle)
            del loader, cycle
        workers = DataLoader(
            RangeDataset(8), batch_size=2, num_workers=2, worker_init_fn=collect_garbage
        )
        assert len(list(workers)) == 4
    finally:
        gc.enable()


def test_reserved_memory_is_flat_after_the_second_epoch() -> None:
    dataset = ShiftedDataset(40, 4_000_000)
    batch_bytes = dataset.numel * 4
    loader = DataLoaderX(dataset, batch_size=None, backend="cuda")
    stream = torch.cuda.current_stream()
    reserved = []
    for epoch in range(6):
        for index, batch in enumerate(loader):
            assert int(batch.sum(dtype=torch.int64)) == dataset.checksum(index)
            stream.synchronize()
            if epoch % 2 and index == 5:
                break  # early exits must not leak streams or memory either
        torch.cuda.synchronize()
        reserved.append(torch.cuda.memory_reserved())
    growth = [value - reserved[1] for value in reserved[1:]]
    assert max(growth) <= batch_bytes, f"reserved bytes per epoch: {reserved}"
    assert len(loader.prefetch_backend._device._streams) == 1  # type: ignore[attr-defined]


@pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs two GPUs"
)
@pytest.mark.parametrize("device", ["cuda:1", 1, torch.device("cuda", 1)])
def test_non_default_device(device: object) -> None:
    torch.cuda.set_device(0)
    allocated_on_0 = torch.cuda.memory_allocated(0)
    loader = DataLoaderX(
        RangeDataset(40), batch_size=4, backend="cuda", backend_options={"device": device}
    )
    batches = list(loader)
    assert {batch.device for batch in batches} == {torch.device("cuda", 1)}
    expected = torch.cat(list(DataLoader(RangeDataset(40), batch_size=4)))
    assert torch.equal(torch.cat([batch.cpu() for batch in batches]), expected)
    assert torch.cuda.current_device() == 0
    assert torch.cuda.memory_allocated(0) == allocated_on_0
    streams = loader.prefetch_backend._device._streams  # type: ignore[attr-defined]
    assert list(streams) == [torch.device("cuda", 1)]


class ImageDataset(Dataset[torch.Tensor]):
    """Item ``i`` is a 3x8x8 uint8 image filled with ``i``."""

    def __len__(self) -> int:
        return 24

    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.full((3, 8, 8), index, dtype=torch.uint8)


def test_transform_runs_on_the_side_stream_and_user_stream_waits() -> None:
    seen: list[tuple[int, int]] = []

    def transform(batch: torch.Tensor) -> torch.Tensor:
        stream = torch.cuda.current_stream()
        seen.append((stream.stream_id, stream.device_index))
        return batch.float() / 255

    # adaptive=False: batches this small are otherwise copied inline, on the user's stream.
    options = {"transform": transform, "memory_format": torch.channels_last, "adaptive": False}
    loader = DataLoaderX(ImageDataset(), batch_size=4, backend="cuda", backend_options=options)
    user = torch.cuda.Stream()
    with torch.cuda.stream(user):
        batches = [batch * 255 for batch in loader]  # computed on the user's stream
        results = [batch.round().to(torch.uint8).cpu() for batch in batches]
    device = torch.device("cuda", torch.cuda.current_device())
    side = loader.prefetch_backend._device.side_stream(device)  # type: ignore[attr-defined]
    assert set(seen) == {(side.stream_id, side.device_index)}
    assert (user.stream_id, user.device_index) not in seen
    assert (torch.cuda.default_stream().stream_id, device.index) not in seen
    expected = list(DataLoader(ImageDataset(), batch_size=4))
    for result, want, batch in zip(results, expected, batches, strict=True):
        assert torch.equal(result, want)
        assert batch.is_contiguous(memory_format=torch.channels_last)


@pytest.mark.parametrize("backend", ["cuda", "auto"])
def test_depth_auto_and_max_bytes_count_device_bytes(backend: str) -> None:
    """The cap holds for device bytes; host tensors (pinned copies) are not counted."""
    numel = 1 << 18  # 1 MiB of int32 a batch
    dataset = ShiftedDataset(60, numel)
    options = {"depth": "auto", "max_bytes": "3MiB"}
    loader = DataLoaderX(dataset, batch_size=None, backend=backend, backend_options=options)
    sums = []
    for batch in loader:
        assert batch.is_cuda
        torch.cuda._sleep(200_000)  # a step on the GPU, so the buffer fills
        sums.append(int(batch.sum(dtype=torch.int64)))
    assert sums == [dataset.checksum(i) for i in range(60)]
    stats = loader.stats
    assert stats is not None
    assert stats.peak_bytes is not None
    assert 4 * numel <= stats.peak_bytes <= 3 * 4 * numel


def test_staging_memory_is_bounded_kept_flat_over_10_epochs_and_given_back() -> None:
    from dataloaderx.backends.cuda import CudaBackend

    api: Any = CudaBackend.device_api
    dataset = ShiftedDataset(12, 2_000_000)  # 8 MB pageable batches
    loader = DataLoaderX(dataset, batch_size=None, backend="cuda")
    batch_bytes = dataset.numel * 4
    before = api.pinned_bytes
    peaks, held = [], []
    for _ in range(10):
        api.peak_pinned_bytes = api.pinned_bytes
        for index, batch in enumerate(loader):
            assert int(batch.sum(dtype=torch.int64)) == dataset.checksum(index)
        peaks.append(api.peak_pinned_bytes - before)
        held.append(api.pinned_bytes - before)
    assert max(peaks) <= (2 + 1) * batch_bytes + 3 * 4096, peaks
    assert held[0] > 0
    assert held == [held[0]] * 10  # the slots are reused, epoch after epoch
    loader.prefetch_backend.close()
    assert api.pinned_bytes == before


@pytest.mark.parametrize("num_workers", [0, 2])
def test_pin_memory_true_batches_arrive_on_the_device_without_dataloaders_pin_thread(
    num_workers: int,
) -> None:
    dataset = ShiftedDataset(16, 100_000)
    loader = DataLoaderX(
        dataset, batch_size=4, num_workers=num_workers, pin_memory=True, backend="cuda"
    )
    with iter(loader) as iterator:
        assert not hasattr(iterator, "_pin_memory_thread")
        batches = list(iterator)
    expected = list(DataLoader(dataset, batch_size=4))
    assert all(batch.device.type == "cuda" for batch in batches)
    assert all(torch.equal(b.cpu(), e) for b, e in zip(batches, expected, strict=True))


@pytest.mark.parametrize("backend", ["sync", "thread", "cuda"])
def test_worker_threads_pin_and_copy_as_worker_processes_do(backend: str) -> None:
    """Worker threads pin each batch in the thread that made it, on the loop's current device
    (a new thread starts on device 0); with ``cuda`` the backend pins, and they do not."""
    dataset = ShiftedDataset(24, 100_000)
    options = {"batch_size": 4, "num_workers": 2, "pin_memory": True}
    loader = DataLoaderX(dataset, backend=backend, worker_method="thread", **options)
    batches = list(loader)
    expected = list(DataLoader(dataset, **options))
    assert len(batches) == len(expected) == 6
    for batch, want in zip(batches, expected, strict=True):
        if backend == "cuda":
            assert batch.device.type == "cuda"
        else:
            assert batch.is_pinned()
        assert torch.equal(batch.cpu(), want)
