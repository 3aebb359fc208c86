"""What the elastic workers' tests share: a dataset whose items draw from their batch's
generators, and the type of the ``script`` fixture (``conftest.py``)."""

from __future__ import annotations

import time
from collections.abc import Callable

import torch
from torch.utils.data import Dataset, get_worker_info

__all__ = ["Augmented", "Script"]

#: Installs a script of counts; returns the counts each window ran at, as they come.
Script = Callable[[list[int]], list[int]]


class Augmented(Dataset[torch.Tensor]):
    """Item ``i``: ``i``, draws from generators seeded from the batch's seed (an
    augmentation), and the id of the thread that made it; sleeps ``delay`` seconds."""

    def __init__(self, size: int = 120, delay: float = 0.0) -> None:
        self.size = size
        self.delay = delay

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> torch.Tensor:
        if self.delay:
            time.sleep(self.delay)
        info = get_worker_info()
        assert info is not None
        generator = torch.Generator().manual_seed(info.seed + index)
        draws = torch.rand(2, generator=generator)
        return torch.cat([torch.tensor([float(index)]), draws, torch.tensor([float(info.id)])])
