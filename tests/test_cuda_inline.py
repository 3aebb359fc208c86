"""Batches the ``cuda`` backend makes inline, checked on a recording fake of its device API:
small ones copied on the loop's stream, larger ones staged and copied on the side stream, all
in the loop's thread, whatever their size when the decision says inline."""

from __future__ import annotations

import threading
from collections.abc import Sequence

import pytest
import torch

from dataloaderx import DataLoaderX
from dataloaderx.backends.cuda import CudaBackend
from dataloaderx.device import inline_copy
from dataloaderx.device.host_copy import Segment
from dataloaderx.device.inline_copy import SMALL_BATCH_BYTES
from dataloaderx.engine import decision as mode_decision
from tests.fake_accelerator import KIND, RecordingAccelerator
from tests.helpers import SwitchingPolicy

pytestmark = pytest.mark.timeout(60)

#: float32 elements of a batch just over, and of one at, the small-batch limit.
LARGE = SMALL_BATCH_BYTES // 4 + 1
SMALL = SMALL_BATCH_BYTES // 4


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> RecordingAccelerator:
    api = RecordingAccelerator()
    monkeypatch.setattr(CudaBackend, "device_api", api)
    return api


@pytest.fixture
def host_copies(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The thread of each inline staging copy (the real copy still runs)."""
    threads: list[str] = []
    real = inline_copy.copy_with_own_pool

    def recording(segments: Sequence[Segment]) -> None:
        threads.append(threading.current_thread().name)
        real(segments)

    monkeypatch.setattr(inline_copy, "copy_with_own_pool", recording)
    return threads


def scripted(monkeypatch: pytest.MonkeyPatch, pattern: str) -> None:
    monkeypatch.setattr(mode_decision, "new_policy", lambda: SwitchingPolicy(pattern))


def test_large_and_small_batches_made_inline(
    fake: RecordingAccelerator, host_copies: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    scripted(monkeypatch, "I")
    sizes = [LARGE, SMALL, LARGE, 16, LARGE, LARGE]
    batches = [torch.full((n,), float(i)) for i, n in enumerate(sizes)]
    loader = DataLoaderX(batches, batch_size=None, backend="cuda")
    before = set(threading.enumerate())
    got = []
    for batch in loader:
        assert set(threading.enumerate()) == before  # no producer, no copy thread
        got.append(batch)
    assert [(b.numel(), float(b[0])) for b in got] == [(n, float(i)) for i, n in enumerate(sizes)]
    main = threading.current_thread().name
    assert {call.thread for call in fake.calls} == {main}
    assert host_copies == [main] * sizes.count(LARGE)
    assert not fake.ops("set_device")  # the loop's current device is left alone
    copies = fake.ops("copy")
    assert [call.stream.name for call in copies] == [  # type: ignore[union-attr]
        "side-0" if n == LARGE else "default" for n in sizes
    ]
    for handed, call in zip(got, copies, strict=True):
        if call.stream.name == "default":  # type: ignore[union-attr]
            continue
        assert call.details["source_pinned"]
        at = next(i for i, c in enumerate(fake.calls) if c is call)
        recorded = next(c for c in fake.calls[at:] if c.op == "record_event")
        waited = next(c for c in fake.calls[at:] if c.op == "wait_event")
        assert recorded.target is waited.target
        assert waited.stream.name == "default"  # type: ignore[union-attr]
        assert [c for c in fake.ops("record_stream") if c.target is handed]
    assert len(fake.ops("wait_event")) == sizes.count(LARGE)
    assert len(fake.ops("pin_buffer")) <= 3  # depth 2: at most depth + 1 staging slots


def test_large_batches_follow_the_decision(
    fake: RecordingAccelerator, host_copies: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    scripted(monkeypatch, "IPPIPPPIIIIP")
    batches = [torch.full((LARGE,), float(i)) for i in range(24)]
    loader = DataLoaderX(batches, batch_size=None, backend="cuda")
    for _ in range(2):
        fake.calls.clear()
        host_copies.clear()
        got = list(loader)
        assert [float(b[0]) for b in got] == [float(i) for i in range(24)]
        main = threading.current_thread().name
        inline = [call for call in fake.ops("copy") if call.thread == main]
        prefetched = [call for call in fake.ops("copy") if call.thread != main]
        assert inline
        assert prefetched
        assert len(inline) + len(prefetched) == 24
        assert len(host_copies) == len(inline)
        # Both modes share the loader's one side stream and its staging slots.
        assert {call.stream.name for call in fake.ops("copy")} == {"side-0"}  # type: ignore[union-attr]
    assert fake.peak_pinned_bytes <= 3 * (LARGE * 4 + 4096)


def test_inline_copies_go_to_the_configured_device(
    fake: RecordingAccelerator, host_copies: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    scripted(monkeypatch, "I")
    batches = [torch.full((LARGE,), float(i)) for i in range(3)]
    loader = DataLoaderX(batches, batch_size=None, backend="cuda", backend_options={"device": 1})
    assert [float(b[0]) for b in loader] == [0.0, 1.0, 2.0]
    device = torch.device(KIND, 1)
    assert {call.details["device"] for call in fake.ops("copy")} == {device}
    assert [stream.device for stream in fake.streams_created] == [device]
    assert {call.stream.device for call in fake.ops("wait_event")} == {device}  # type: ignore[union-attr]
    assert fake.current_device_index() == 0
    assert not fake.ops("set_device")


def test_a_failed_staging_copy_frees_its_slot_and_raises_in_the_loop(
    fake: RecordingAccelerator, monkeypatch: pytest.MonkeyPatch
) -> None:
    scripted(monkeypatch, "I")

    def failing(segments: Sequence[Segment]) -> None:
        raise ValueError("staging failed")

    monkeypatch.setattr(inline_copy, "copy_with_own_pool", failing)
    batches = [torch.full((LARGE,), float(i)) for i in range(2)]
    loader = DataLoaderX(batches, batch_size=None, backend="cuda", backend_options={"depth": 1})
    for _ in range(3):  # each attempt needs a free slot: the failed ones were given back
        with pytest.raises(ValueError, match="staging failed"):
            next(iter(loader))
    assert len(fake.ops("pin_buffer")) <= 2
