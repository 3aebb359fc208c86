"""What the elastic workers' tests share: a dataset whose items draw from their batch's
generators, the type of the ``script`` fixture (``conftest.py``), and a policy fed the
windows of a steady workload."""

from __future__ import annotations

import time
from collections.abc import Callable

import torch
from torch.utils.data import Dataset, get_worker_info

from dataloaderx.workers.elastic.policy import Change, ScalePolicy, Window

__all__ = ["Augmented", "Script", "climb"]

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


def climb(
    policy: ScalePolicy,
    n: int,
    rate: Callable[[int], float],
    wait: float,
    windows: int,
    *,
    turns: bool = False,
) -> list[tuple[int, Change]]:
    """Feed ``windows`` windows of 1 s in which ``n`` workers make ``rate(n)`` batches/s and
    the loader waits ``wait`` of the time (where ``turns``, two threads or more take turns
    on one core); the changes, with the window of each."""
    changes = []
    for index in range(windows):
        change = policy.observe(Window(n, int(rate(n)), 1.0, wait, turns=turns and n >= 2))
        if change is not None:
            changes.append((index, change))
            n = change.workers
    return changes
