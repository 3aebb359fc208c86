"""accelerate: prepare first, then prefetch (``prepare`` rebuilds loaders as its own class)."""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader

from dataloaderx import DataLoaderX, PrefetchIterator, SizedPrefetched, prefetch
from tests.helpers import (
    FailingDataset,
    RangeDataset,
    assert_closed_source,
    assert_same_events,
    child_pids,
    run_events,
    wait_for,
    wait_until_clean,
    wait_until_run_ahead,
)

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
    assert batches.stats is None
    for epoch in range(2):
        assert_same_events(run_events(iter(batches)), expected)
        assert batches.iteration == epoch + 1
        stats = batches.stats  # recorded where the backend prefetches: the base loader
        assert stats is not None
        assert stats.batches == 4
        assert stats.backend == backend


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
    threads = set(threading.enumerate())
    children = child_pids()
    prepared = accelerator.prepare(DataLoader(RangeDataset(200), batch_size=2, num_workers=2))
    iterator = iter(prefetch(prepared, backend=backend))
    next(iterator)
    assert child_pids() - children  # its workers run
    iterator.close()
    assert_closed_source(iterator.source)
    # A read under way when close() gave up waiting releases the source as it ends.
    assert wait_for(lambda: iterator.source.released)
    assert wait_for(lambda: iterator._inner.gi_frame is None)  # type: ignore[attr-defined]
    left_threads, left_children = wait_until_clean(threads, children, within=30.0)
    assert left_threads == []
    assert left_children == set()


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
    assert batches.iteration == 3
    assert prepared.iteration == 0


def run_ahead(iterator: Iterator[Any]) -> None:
    """Let the producer of a prefetching epoch, if one runs, fill its buffer (or end)."""
    if isinstance(iterator, PrefetchIterator):
        wait_until_run_ahead(iterator)


def loop_state(batches: Iterable[torch.Tensor], gradient_state: Any) -> list[tuple[Any, ...]]:
    """What a training loop sees of accelerate's per-batch state at each step."""
    seen: list[tuple[Any, ...]] = []
    iterator = iter(batches)
    for batch in iterator:
        run_ahead(iterator)  # as it would during a training step
        seen.append(
            (int(batch[0, 0]), gradient_state.end_of_dataloader, gradient_state.in_dataloader)
        )
    seen.append(("after", gradient_state.end_of_dataloader, gradient_state.in_dataloader))
    return seen


def test_gradient_state_follows_the_batches_the_loop_sees(
    accelerator: accelerate.Accelerator, backend: str
) -> None:
    prepared = accelerator.prepare(DataLoader(RangeDataset(12), batch_size=2))
    expected = loop_state(prepared, accelerator.gradient_state)
    assert [end for _, end, _ in expected] == [False] * 5 + [True, False]
    batches = prefetch(prepared, backend=backend, backend_options=None)
    for _ in range(2):
        assert loop_state(batches, accelerator.gradient_state) == expected


def test_accumulation_syncs_on_the_same_steps(
    accelerator: accelerate.Accelerator, backend: str
) -> None:
    accelerator.gradient_accumulation_steps = 4
    model = accelerator.prepare(torch.nn.Linear(2, 1))

    def sync_steps(batches: Iterable[torch.Tensor]) -> list[bool]:
        syncs = []
        iterator = iter(batches)
        for _ in iterator:
            run_ahead(iterator)
            with accelerator.accumulate(model):
                syncs.append(accelerator.sync_gradients)
        return syncs

    prepared = accelerator.prepare(DataLoader(RangeDataset(14), batch_size=2))
    expected = sync_steps(prepared)
    assert expected == [False, False, False, True, False, False, True]
    assert sync_steps(prefetch(prepared, backend=backend)) == expected


@pytest.mark.parametrize("num_workers", [0, 2])
def test_stateful_dataloader_state_counts_the_batches_the_loop_saw(
    backend: str, num_workers: int
) -> None:
    pytest.importorskip("torchdata", reason="pip install 'dataloaderx[integrations]'")
    config = accelerate.utils.DataLoaderConfiguration(use_stateful_dataloader=True)
    stateful = accelerate.Accelerator(cpu=True, dataloader_config=config)
    try:

        def prepared() -> Any:
            return stateful.prepare(
                DataLoader(RangeDataset(40), batch_size=2, num_workers=num_workers)
            )

        expected = [batch[:, 0].tolist() for batch in prepared()]
        first = prepared()
        batches = prefetch(first, backend=backend)
        options = batches.prefetch_backend.describe()
        with iter(batches) as iterator:
            head = []
            for _ in range(5):
                head.append(next(iterator)[:, 0].tolist())
                wait_until_run_ahead(iterator)  # the producer runs ahead by up to its depth
            # What Accelerator.save_state() reads: the prepared loader's own state_dict().
            state = first.state_dict()
            assert batches.state_dict() == state
        second = prepared()
        second.load_state_dict(state)  # as Accelerator.load_state() does
        tail = [batch[:, 0].tolist() for batch in prefetch(second, backend=backend)]
        assert head + tail == expected, options
    finally:
        accelerate.state.AcceleratorState._reset_state(reset_partial_state=True)
        accelerate.state.GradientState._reset_state()


def test_prefetch_of_a_stateful_dataloader_answers_for_consumed_batches(backend: str) -> None:
    stateful_dataloader = pytest.importorskip(
        "torchdata.stateful_dataloader", reason="pip install 'dataloaderx[integrations]'"
    )

    def loader() -> Any:
        generator = torch.Generator()
        generator.manual_seed(0)
        return stateful_dataloader.StatefulDataLoader(
            RangeDataset(30), batch_size=3, shuffle=True, generator=generator
        )

    expected = [batch[:, 0].tolist() for batch in loader()]
    batches = prefetch(loader(), backend=backend)
    with iter(batches) as iterator:
        head = [next(iterator)[:, 0].tolist() for _ in range(4)]
        wait_until_run_ahead(iterator)
        state = batches.state_dict()
    assert state["_num_yielded"] == 4
    resumed = prefetch(loader(), backend=backend)
    resumed.load_state_dict(state)
    assert resumed.state_dict() == state
    assert head + [batch[:, 0].tolist() for batch in resumed] == expected
    assert not hasattr(prefetch(DataLoader(RangeDataset(4))), "state_dict")
