"""accelerate: prepare first, then prefetch (``prepare`` rebuilds loaders as its own class)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from torch.utils.data import DataLoader

from dataloaderx import DataLoaderX, SizedPrefetched, prefetch
from tests.helpers import FailingDataset, RangeDataset, assert_same_events, run_events

accelerate = pytest.importorskip(
    "accelerate", reason="accelerate is not installed: pip install 'dataloaderx[integrations]'"
)


@pytest.fixture
def accelerator() -> Iterator[accelerate.Accelerator]:
    yield accelerate.Accelerator(cpu=True)
    accelerate.state.AcceleratorState._reset_state(reset_partial_state=True)
    accelerate.state.GradientState._reset_state()


@pytest.mark.parametrize("num_workers", [0, 2])
def test_prepared_loader_prefetches_every_epoch(
    accelerator: accelerate.Accelerator, backend: str, num_workers: int
) -> None:
    prepared = accelerator.prepare(
        DataLoader(RangeDataset(10), batch_size=3, num_workers=num_workers)
    )
    expected = run_events(iter(DataLoader(RangeDataset(10), batch_size=3)))
    batches = prefetch(prepared, backend=backend)
    assert isinstance(batches, SizedPrefetched)
    assert len(batches) == len(prepared) == 4
    for epoch in range(2):
        assert_same_events(run_events(iter(batches)), expected)
        assert prepared.iteration == epoch + 1


def test_prepare_then_prefetch_keeps_a_dataloaderx_configuration(
    accelerator: accelerate.Accelerator, backend: str
) -> None:
    loader = DataLoaderX(RangeDataset(6), batch_size=2, backend=backend)
    prepared = accelerator.prepare(loader)
    batches = prefetch(prepared, backend=loader.backend, backend_options=loader.backend_options)
    assert batches.prefetch_backend.name == loader.prefetch_backend.name
    assert_same_events(run_events(iter(batches)), run_events(iter(loader)))


def test_break_closes_the_prepared_loader_and_its_workers(
    accelerator: accelerate.Accelerator, backend: str
) -> None:
    prepared = accelerator.prepare(DataLoader(RangeDataset(200), batch_size=2, num_workers=2))
    iterator = iter(prefetch(prepared, backend=backend))
    next(iterator)
    iterator.close()
    assert iterator.source.released
    assert iterator._inner.gi_frame is None  # type: ignore[attr-defined]


def test_errors_match_the_prepared_loader(
    accelerator: accelerate.Accelerator, backend: str
) -> None:
    prepared = accelerator.prepare(DataLoader(FailingDataset(8, frozenset({5})), batch_size=2))
    expected = run_events(iter(prepared))
    assert expected[-1] == ("error", ValueError, "bad index 5")
    assert_same_events(run_events(iter(prefetch(prepared, backend=backend))), expected)


def test_set_epoch_reaches_the_prepared_loader(accelerator: accelerate.Accelerator) -> None:
    prepared = accelerator.prepare(DataLoader(RangeDataset(4), batch_size=2))
    batches = prefetch(prepared, backend="thread")
    batches.set_epoch(3)
    assert prepared.iteration == 3
