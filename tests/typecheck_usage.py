"""Checked by ``mypy --strict`` in CI (not executed): DataLoaderX is generic like DataLoader."""

from __future__ import annotations

import torch
from torch.utils.data import DataLoader, Dataset
from typing_extensions import assert_type

from dataloaderx import DataLoaderX, PrefetchIterator


def loader_annotations(dataset: Dataset[torch.Tensor]) -> None:
    loader: DataLoader[torch.Tensor] = DataLoaderX(dataset, batch_size=2, backend="thread")
    typed = DataLoaderX[torch.Tensor](dataset, backend={"name": "thread", "depth": 4})
    assert_type(typed, DataLoaderX[torch.Tensor])
    iterator = iter(typed)
    assert_type(iterator, PrefetchIterator[torch.Tensor])
    assert_type(next(iterator), torch.Tensor)
    with iter(typed) as scoped:
        for batch in scoped:
            assert_type(batch, torch.Tensor)
    assert len(loader) >= 0


def buffer_options(dataset: Dataset[torch.Tensor]) -> None:
    options = {"depth": "auto", "max_bytes": "2GiB"}
    loader = DataLoaderX[torch.Tensor](dataset, backend="thread", backend_options=options)
    stats = loader.stats
    if stats is not None:
        assert_type(stats.depth_median, int | None)
        assert_type(stats.peak_bytes, int | None)


def elastic_workers(dataset: Dataset[torch.Tensor]) -> None:
    loader = DataLoaderX[torch.Tensor](
        dataset, num_workers="auto", worker_method="thread", worker_options={"max_workers": 8}
    )
    stats = loader.stats
    if stats is not None:
        for at, workers, why in stats.workers:
            assert_type(workers, int)
            assert_type(why, str)
            assert at >= 0
