"""Loaders used from several threads at once: every stream complete and correct.

The tests rely on locks and events only, never on the GIL; run them under a free-threaded
Python with ``PYTHON_GIL=0`` where one is available.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader

from dataloaderx import DataLoaderX
from tests.helpers import assert_same
from tests.reliability_support import ITEM_KINDS, KindDataset

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

THREADS = 8
EPOCHS = 3


def _options(index: int) -> dict[str, Any]:
    return {"batch_size": 1 + index % 4, "shuffle": index % 2 == 0, "drop_last": index % 3 == 0}


def test_eight_loaders_in_eight_threads(backend: str) -> None:
    datasets = [KindDataset(40 + 7 * i, ITEM_KINDS[i % len(ITEM_KINDS)]) for i in range(THREADS)]
    expected = []
    for index, dataset in enumerate(datasets):
        generator = torch.Generator().manual_seed(index)
        reference = DataLoader(dataset, generator=generator, **_options(index))
        expected.append([list(reference) for _ in range(EPOCHS)])
    results: list[list[list[Any]] | None] = [None] * THREADS
    errors: list[BaseException] = []
    start = threading.Barrier(THREADS)

    def run(index: int) -> None:
        try:
            generator = torch.Generator().manual_seed(index)
            loader = DataLoaderX(
                datasets[index], generator=generator, backend=backend, **_options(index)
            )
            start.wait(timeout=30)
            results[index] = [list(loader) for _ in range(EPOCHS)]
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not any(thread.is_alive() for thread in threads)
    assert errors == []
    for index in range(THREADS):
        assert_same(results[index], expected[index], f"loader[{index}]")


@pytest.mark.parametrize("num_workers", [0, 2])
def test_two_interleaved_iterators_of_one_loader(backend: str, num_workers: int) -> None:
    dataset = KindDataset(37, "namedtuple")
    expected = list(DataLoader(dataset, batch_size=3))
    loader = DataLoaderX(dataset, batch_size=3, num_workers=num_workers, backend=backend)
    first, second = iter(loader), iter(loader)
    got_first, got_second = [], []
    for left, right in zip(first, second, strict=True):
        got_first.append(left)
        got_second.append(right)
    assert_same(got_first, expected, "first")
    assert_same(got_second, expected, "second")


def test_two_interleaved_shuffled_iterators_each_cover_the_dataset(backend: str) -> None:
    # Both iterators draw their order from the loader's one generator; which draws first
    # is up to the producer threads, so check completeness rather than order.
    dataset = KindDataset(50, "int")
    loader = DataLoaderX(
        dataset,
        batch_size=4,
        shuffle=True,
        generator=torch.Generator().manual_seed(5),
        backend=backend,
    )
    first, second = iter(loader), iter(loader)
    seen: tuple[list[int], list[int]] = ([], [])
    for left, right in zip(first, second, strict=True):
        seen[0].extend(left.tolist())
        seen[1].extend(right.tolist())
    assert sorted(seen[0]) == sorted(seen[1]) == list(range(50))
