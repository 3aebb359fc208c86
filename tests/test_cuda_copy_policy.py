"""The ``cuda`` backend makes batches inline only while they are small."""

from __future__ import annotations

import threading

import pytest
import torch

from dataloaderx import DataLoaderX
from dataloaderx.backends.cuda import CudaBackend
from dataloaderx.contracts.policy import INLINE, PREFETCH, Cycles
from dataloaderx.device.small_batches import INLINE_MAX_BYTES, SmallBatchesOnly
from dataloaderx.engine import decision as mode_decision
from tests.fake_accelerator import RecordingAccelerator
from tests.helpers import SwitchingPolicy

pytestmark = pytest.mark.timeout(60)


def test_follows_the_decision_until_a_batch_is_large() -> None:
    decision = SwitchingPolicy("I")
    policy = SmallBatchesOnly(decision, limit=100)
    policy.note(100)
    assert policy.start_epoch(helper_processes=False).mode == INLINE
    assert policy.reason == "scripted"
    assert policy.observe(Cycles(INLINE, 1, (0.001,))).mode == INLINE
    assert len(decision.observed) == 1
    policy.note(101)
    verdict = policy.observe(Cycles(INLINE, 1, (0.001,)))
    assert verdict.mode == PREFETCH
    assert not verdict.measure
    assert policy.reason.startswith("batches of 9.63e-05 MiB: only on a side stream")
    assert len(decision.observed) == 1  # the decision is asked no more
    policy.note(1)  # it stays: the loader has shown it makes large batches
    assert policy.start_epoch(helper_processes=False).mode == PREFETCH
    assert policy.observe(Cycles(PREFETCH, 1, (0.001,))).mode == PREFETCH
    assert len(decision.observed) == 1


def test_inline_cycles_are_never_reported_in_runs() -> None:
    # Any batch of a run may be the large one, which must switch to prefetching at once.
    decision = SwitchingPolicy("I" * 40, probe_every=40)
    policy = SmallBatchesOnly(decision, limit=100)
    policy.start_epoch(helper_processes=False)
    policy.observe(Cycles(INLINE, 0))  # the epoch's first batch
    verdict = policy.observe(Cycles(INLINE, 1, (0.001,)))  # then a measured one
    assert decision.verdict().cycles > 1
    assert verdict.cycles == 1


def test_sizes_are_noted_from_any_thread() -> None:
    policy = SmallBatchesOnly(SwitchingPolicy("I"), limit=1000)
    threads = [
        threading.Thread(target=lambda size=size: policy.note(size)) for size in (10, 2000, 3000)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert policy.large in (2000, 3000)  # the first large batch noted, whichever it was


@pytest.mark.parametrize(("numel", "inline_expected"), [(16, True), (INLINE_MAX_BYTES, False)])
def test_large_batches_are_always_copied_on_the_side_stream(
    monkeypatch: pytest.MonkeyPatch, numel: int, inline_expected: bool
) -> None:
    fake = RecordingAccelerator()
    monkeypatch.setattr(CudaBackend, "device_api", fake)
    monkeypatch.setattr(mode_decision, "new_policy", lambda: SwitchingPolicy("I"))  # wants inline
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
