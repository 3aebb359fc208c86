"""The ``cuda`` backend makes batches inline only while they are small."""

from __future__ import annotations

import threading

import pytest
import torch

from dataloaderx import DataLoaderX
from dataloaderx.backends import _adaptive
from dataloaderx.backends._copy_policy import INLINE_MAX_BYTES, SmallBatchesOnly
from dataloaderx.backends._mode_decision import INLINE, PREFETCH, Cycle
from dataloaderx.backends.cuda import CudaBackend
from tests.fake_accelerator import RecordingAccelerator
from tests.helpers import SwitchingPolicy

pytestmark = pytest.mark.timeout(60)


def test_follows_the_decision_until_a_batch_is_large() -> None:
    decision = SwitchingPolicy("I")
    policy = SmallBatchesOnly(decision, limit=100)
    policy.note(100)
    assert policy.wanted == INLINE
    assert policy.reason == "scripted"
    policy.observe(Cycle(INLINE, 0.001, 0.001))
    assert len(decision.observed) == 1
    policy.note(101)
    assert policy.wanted == PREFETCH
    assert not policy.probing
    assert policy.reason.startswith("batches of 9.63e-05 MiB: only on a side stream")
    policy.observe(Cycle(PREFETCH, 0.001, 0.0))
    policy.note(1)  # it stays: the loader has shown it makes large batches
    assert policy.wanted == PREFETCH
    assert len(decision.observed) == 1


def test_inline_cycles_are_never_taken_in_bulk() -> None:
    # Any batch of a run may be the large one, which must switch to prefetching at once.
    decision = SwitchingPolicy("I" * 40, probe_every=40)
    policy = SmallBatchesOnly(decision, limit=100)
    for _ in range(2):  # the epoch's first batch, then a probed one
        policy.observe(Cycle(INLINE, 0.001, 0.001))
    assert decision.steady_cycles() > 1
    assert policy.steady_cycles() == 0


@pytest.mark.parametrize(("numel", "inline_expected"), [(16, True), (INLINE_MAX_BYTES, False)])
def test_large_batches_are_always_copied_on_the_side_stream(
    monkeypatch: pytest.MonkeyPatch, numel: int, inline_expected: bool
) -> None:
    fake = RecordingAccelerator()
    monkeypatch.setattr(CudaBackend, "device_api", fake)
    monkeypatch.setattr(_adaptive, "new_policy", lambda: SwitchingPolicy("I"))  # wants inline
    batches = [torch.full((numel,), float(i)) for i in range(6)]
    loader = DataLoaderX(batches, batch_size=None, backend="cuda")
    got = list(loader)
    assert [float(b[0]) for b in got] == [float(i) for i in range(6)]
    main = threading.current_thread().name
    inline = [call for call in fake.ops("copy") if call.thread == main]
    # The loader's very first batch is made before its size is known.
    assert len(inline) == (6 if inline_expected else 1)
    fake.calls.clear()
    list(loader)
    inline = [call for call in fake.ops("copy") if call.thread == main]
    assert len(inline) == (6 if inline_expected else 0)
    if not inline_expected:
        assert loader.stats is not None
        assert loader.stats.mode is not None
        assert "only on a side stream does their copy overlap the step" in loader.stats.mode
