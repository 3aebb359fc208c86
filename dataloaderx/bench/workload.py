"""The embedded default workload: no download, roughly balanced loading and training."""

from __future__ import annotations

import time
from typing import Final

import torch
from torch.utils.data import Dataset

__all__ = [
    "DEFAULT_BATCHES",
    "DEFAULT_BATCH_SIZE",
    "SyntheticImages",
    "default_dataset",
    "fake_step",
]

#: Seconds of emulated storage latency per image (a GIL-releasing wait).
STORAGE_SECONDS: Final = 0.001
#: Seconds of emulated accelerator time per batch (a GIL-releasing wait).
STEP_SECONDS: Final = 0.02
DEFAULT_BATCH_SIZE: Final = 16
DEFAULT_BATCHES: Final = 40
_MEAN: Final = 0.5
_STD: Final = 0.25


class SyntheticImages(Dataset[tuple[torch.Tensor, int]]):
    """Images "read" with a storage latency, then decoded and augmented with torch ops.

    Item ``i`` is always the same image and label, so runs are comparable.
    """

    def __init__(self, size: int, *, side: int = 64, storage_seconds: float = STORAGE_SECONDS):
        self.size = size
        self.side = side
        self.storage_seconds = storage_seconds

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        if not 0 <= index < self.size:
            raise IndexError(f"index {index} out of range for {self.size} images")
        time.sleep(self.storage_seconds)
        generator = torch.Generator().manual_seed(index)
        raw = torch.randint(
            0, 256, (3, self.side, self.side), dtype=torch.uint8, generator=generator
        )
        image = raw.float().div_(255)
        if index % 2:
            image = image.flip(-1)
        image = image.sub_(_MEAN).div_(_STD)
        return image, index % 10


def default_dataset() -> SyntheticImages:
    """The dataset ``dataloaderx bench`` profiles when no ``--dataset`` is given."""
    return SyntheticImages(DEFAULT_BATCH_SIZE * DEFAULT_BATCHES)


def fake_step(batch: object) -> None:
    """A training step that waits :data:`STEP_SECONDS` without holding the GIL."""
    time.sleep(STEP_SECONDS)
