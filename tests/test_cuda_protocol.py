"""The ``cuda`` backend's stream protocol, checked on a recording fake of its device API."""

from __future__ import annotations

import copy
import gc
import pickle
import threading
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader

from dataloaderx import DataLoaderX
from dataloaderx.backends.cuda import CudaBackend
from dataloaderx.engine import decision as mode_decision
from dataloaderx.util.tree import iter_tensors
from tests.fake_accelerator import KIND, Call, FakeEvent, FakeStream, RecordingAccelerator
from tests.helpers import (
    FailingDataset,
    RangeDataset,
    StructDataset,
    SwitchingPolicy,
    assert_same,
    run_events,
)

pytestmark = pytest.mark.timeout(60)

DEVICE0 = torch.device(KIND, 0)
DEVICE1 = torch.device(KIND, 1)


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> RecordingAccelerator:
    api = RecordingAccelerator()
    monkeypatch.setattr(CudaBackend, "device_api", api)
    return api


#: The producer-thread protocol; the inline mode of ``adaptive=True`` is tested apart.
THREADED = {"name": "cuda", "adaptive": False}


def cuda_loader(dataset: Any, **options: Any) -> DataLoaderX[Any]:
    batch_size = options.pop("batch_size", 2)
    return DataLoaderX(dataset, batch_size=batch_size, backend=THREADED, backend_options=options)


def position(fake: RecordingAccelerator, op: str, target: object) -> int:
    """Where the only ``op`` call about ``target`` (by identity) is in the log."""
    found = [i for i, call in enumerate(fake.calls) if call.op == op and call.target is target]
    assert len(found) == 1, f"{op} calls for one object: {len(found)}"
    return found[0]


def test_each_batch_is_copied_on_the_side_stream_and_awaited_through_its_own_event(
    fake: RecordingAccelerator,
) -> None:
    consumer = FakeStream("user", DEVICE0)
    handed: list[tuple[Any, int]] = []
    with fake.use_stream(consumer):
        for batch in cuda_loader(StructDataset(24), depth=3):
            handed.append((batch, len(fake.calls)))  # the log as the batch is handed out
    assert_same([batch for batch, _ in handed], list(DataLoader(StructDataset(24), batch_size=2)))
    [side] = fake.streams_created
    main = threading.current_thread().name
    waits = fake.ops("wait_event")
    assert len(waits) == len(handed) == 12  # one wait per batch, never wait_stream
    previous_handout = 0
    for (batch, handout), wait in zip(handed, waits, strict=True):
        tensors = list(iter_tensors(batch))
        copies = [fake.calls[position(fake, "copy", t)] for t in tensors]
        last_copy = max(position(fake, "copy", t) for t in tensors)
        assert {c.stream for c in copies} == {side}
        assert all(c.thread.startswith("dataloaderx-cuda-") for c in copies)
        assert all(c.details["source_pinned"] for c in copies)
        # The event this batch waits on is the first one recorded after its last copy.
        event: FakeEvent = wait.target
        recorded_after = [c.target for c in fake.calls[last_copy:] if c.op == "record_event"]
        assert recorded_after[0] is event
        assert event.recorded_on is side
        # The consumer waits on it, in its own thread and stream, before the hand-out.
        wait_at = fake.calls.index(wait)
        assert previous_handout <= wait_at < handout
        assert (wait.thread, wait.stream) == (main, consumer)
        # Every tensor of the batch is recorded on the consumer stream, after the wait.
        for tensor in tensors:
            at = position(fake, "record_stream", tensor)
            assert wait_at < at < handout
            assert (fake.calls[at].thread, fake.calls[at].stream) == (main, consumer)
        previous_handout = handout


def test_one_side_stream_per_loader_reused_across_epochs(fake: RecordingAccelerator) -> None:
    loader = cuda_loader(RangeDataset(20))
    other = cuda_loader(RangeDataset(4))
    assert fake.calls == []  # constructing touches no device
    assert len(list(loader)) == 10
    with iter(loader) as early:
        next(early)
    assert len(list(loader)) == 10
    assert len(fake.streams_created) == 1
    assert {call.stream for call in fake.ops("copy")} == set(fake.streams_created)
    list(other)
    assert len(fake.streams_created) == 2


def test_device_is_set_first_in_the_producer_thread(fake: RecordingAccelerator) -> None:
    list(cuda_loader(RangeDataset(6), device=1))
    main = threading.current_thread().name
    producer = fake.calls[0].thread
    assert producer != main
    assert producer.startswith("dataloaderx-cuda-")
    assert fake.calls[0] == Call("set_device", producer, target=DEVICE1)
    assert {call.details["device"] for call in fake.ops("copy")} == {DEVICE1}
    assert fake.streams_created[0].device == DEVICE1
    assert fake.current_device_index() == 0  # the consumer's device is left alone


def test_default_device_is_the_consumers_current_device(fake: RecordingAccelerator) -> None:
    loader = cuda_loader(RangeDataset(4))
    fake.set_device(DEVICE1)  # as torch.cuda.set_device(rank) in the training script
    fake.calls.clear()
    list(loader)
    assert fake.calls[0].op == "set_device"
    assert fake.calls[0].target == DEVICE1
    assert {call.details["device"] for call in fake.ops("copy")} == {DEVICE1}


def test_only_unpinned_host_tensors_are_staged_in_pinned_memory(
    fake: RecordingAccelerator,
) -> None:
    def pinned_collate(items: list[torch.Tensor]) -> torch.Tensor:
        return fake.pin(torch.stack(items))

    loader = cuda_loader(RangeDataset(6))
    list(loader)
    copies = fake.ops("copy")
    assert len(copies) == 3
    assert all(call.details["source_pinned"] for call in copies)
    assert all(call.thread.startswith("dataloaderx-cuda-") for call in fake.ops("pin_buffer"))
    assert fake.pinned_bytes > 0  # kept for the next epoch
    del loader
    gc.collect()
    assert fake.pinned_bytes == 0  # given back with the loader
    fake.calls.clear()
    list(cuda_loader(RangeDataset(6), non_blocking=False))
    assert fake.ops("pin_buffer") == []
    assert not any(call.details["source_pinned"] for call in fake.ops("copy"))
    assert {call.details["non_blocking"] for call in fake.ops("copy")} == {False}
    loader = DataLoaderX(RangeDataset(6), batch_size=2, collate_fn=pinned_collate, backend=THREADED)
    fake.calls.clear()
    list(loader)
    assert fake.ops("pin_buffer") == []  # already pinned by the collate function
    assert all(call.details["source_pinned"] for call in fake.ops("copy"))
    assert {call.details["non_blocking"] for call in fake.ops("copy")} == {True}


def test_transform_runs_on_the_side_stream_before_the_event(fake: RecordingAccelerator) -> None:
    seen: list[tuple[str, FakeStream, int]] = []

    def transform(batch: torch.Tensor) -> dict[str, torch.Tensor]:
        seen.append(
            (threading.current_thread().name, fake.current_stream(DEVICE0), len(fake.calls))
        )
        return {"scaled": batch.float() / 2, "raw": batch}

    batches = list(cuda_loader(RangeDataset(6), transform=transform))
    [side] = fake.streams_created
    assert [thread[:16] for thread, _, _ in seen] == ["dataloaderx-cuda"] * 3
    assert {stream for _, stream, _ in seen} == {side}
    events = [call.target for call in fake.ops("wait_event")]
    for (_, _, at), event, batch in zip(seen, events, batches, strict=True):
        assert event.recorded_at >= at  # logged after all calls made before the transform
        assert torch.equal(batch["scaled"], batch["raw"].float() / 2)
        for tensor in batch.values():  # new tensors made by the transform included
            position(fake, "record_stream", tensor)


def test_memory_format_applies_to_tensors_of_matching_rank(fake: RecordingAccelerator) -> None:
    def collate(items: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        stacked = torch.stack(items)
        return stacked.reshape(len(items), 1, 1, 2).expand(len(items), 3, 2, 2), stacked

    loader = DataLoaderX(
        RangeDataset(4),
        batch_size=2,
        collate_fn=collate,
        backend=THREADED,
        backend_options={"memory_format": "channels_last"},
    )
    for images, flat in loader:
        assert images.is_contiguous(memory_format=torch.channels_last)
        assert flat.dim() == 2
    formats = [call.details["memory_format"] for call in fake.ops("copy")]
    assert formats == [torch.channels_last, torch.preserve_format] * 2


def test_transform_error_is_that_batchs_error(fake: RecordingAccelerator) -> None:
    def transform(batch: torch.Tensor) -> torch.Tensor:
        if int(batch[0]) == 4:
            raise ValueError("cannot transform batch 4")
        return batch

    events = run_events(iter(cuda_loader(FailingDataset(8, frozenset()), transform=transform)))
    assert [kind for kind, _, _ in events] == ["batch", "batch", "error", "batch"]
    assert events[2][1:] == (ValueError, "cannot transform batch 4")


def test_device_selection_failure_reaches_the_consumer(
    fake: RecordingAccelerator, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(device: torch.device) -> None:
        raise RuntimeError(f"cannot select {device}")

    loader = cuda_loader(RangeDataset(4))
    monkeypatch.setattr(fake, "set_device", broken)
    with pytest.raises(RuntimeError, match="cannot select privateuseone:0"):
        next(iter(loader))
    assert fake.ops("copy") == []


def test_empty_loader_enqueues_nothing(fake: RecordingAccelerator) -> None:
    assert list(cuda_loader(RangeDataset(0))) == []
    assert [call.op for call in fake.calls] == ["set_device", "new_stream"]


def test_backend_copies_and_pickles_without_its_streams(fake: RecordingAccelerator) -> None:
    loader = cuda_loader(RangeDataset(4), depth=3, memory_format="channels_last")
    list(loader)
    backend = loader.prefetch_backend
    text = repr(backend)
    assert text == (
        "CudaBackend(device=None, depth=3, non_blocking=True, transform=None, "
        "memory_format=torch.channels_last, pin_threads=None, max_depth=None, max_bytes=None, "
        "adaptive=False)"
    )
    for clone in (copy.deepcopy(backend), pickle.loads(pickle.dumps(backend))):
        assert repr(clone) == text
    assert len(list(copy.deepcopy(loader))) == 2
    assert len(fake.streams_created) == 2  # the copy made its own stream


def test_inline_batches_are_copied_in_the_training_thread_on_its_stream(
    fake: RecordingAccelerator, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(mode_decision, "new_policy", lambda: SwitchingPolicy("IIPPI"))
    consumer = FakeStream("user", DEVICE0)
    loader = DataLoaderX(StructDataset(20), batch_size=2, backend="cuda")
    with fake.use_stream(consumer):
        batches = list(loader)
    assert_same(batches, list(DataLoader(StructDataset(20), batch_size=2)))
    main = threading.current_thread().name
    inline_copies = [call for call in fake.ops("copy") if call.thread == main]
    threaded_copies = [call for call in fake.ops("copy") if call.thread != main]
    assert inline_copies
    assert threaded_copies
    assert {call.stream for call in inline_copies} == {consumer}  # no side stream inline
    assert {call.stream for call in threaded_copies} == set(fake.streams_created)
    assert not any(call.details["source_pinned"] for call in inline_copies)  # not staged
    # One wait per prefetched batch only; inline batches need none.
    tensors_per_batch = len(list(iter_tensors(batches[0])))
    assert len(fake.ops("wait_event")) * tensors_per_batch == len(threaded_copies)
    assert all(call.thread.startswith("dataloaderx-cuda-") for call in fake.ops("set_device"))
    assert fake.current_device_index() == 0
