"""Datasets and steps named by ``--dataset`` / ``--step`` in the CLI tests."""

from __future__ import annotations

import torch
from torch.utils.data import Dataset

from tests.helpers import RangeDataset

NOT_CALLABLE = 42


def tiny() -> Dataset[torch.Tensor]:
    return RangeDataset(40)


def empty() -> Dataset[torch.Tensor]:
    return RangeDataset(0)


def not_a_dataset() -> object:
    return 3


def broken() -> Dataset[torch.Tensor]:
    raise OSError("the data directory is missing")


def noop(batch: object) -> None:
    return None


def fails(batch: object) -> None:
    raise ValueError("the step cannot take this batch")
