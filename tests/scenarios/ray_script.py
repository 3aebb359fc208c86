"""A training script's own dataset and ``worker_init_fn``, defined in ``__main__``: the
init function sets a global of the script that the dataset reads, and the dataset writes to
a numpy array of its own, as code written for worker processes does.

Usage: ray_script.py RAY_ADDRESS. Prints one JSON line: the rows each worker method gives.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import numpy
import ray
import torch
from torch.utils.data import Dataset

from dataloaderx import DataLoaderX

#: Set by each worker's ``worker_init_fn``.
WORKER_FLAG = -1


def set_flag(worker_id: int) -> None:
    global WORKER_FLAG
    WORKER_FLAG = 100 + worker_id


class Counted(Dataset[torch.Tensor]):
    """Item ``i``: ``i``, the flag its worker set, and how often the worker read it."""

    def __init__(self) -> None:
        self.reads = numpy.zeros(8, dtype=numpy.int64)

    def __len__(self) -> int:
        return 8

    def __getitem__(self, index: int) -> torch.Tensor:
        self.reads[index] += 1
        return torch.tensor([index, WORKER_FLAG, int(self.reads[index])])


def rows(**method: Any) -> list[list[int]]:
    loader = DataLoaderX(Counted(), batch_size=2, num_workers=2, worker_init_fn=set_flag, **method)
    return torch.cat(list(loader)).tolist()  # type: ignore[no-any-return]


if __name__ == "__main__":
    ray.init(address=sys.argv[1])
    options = {"num_cpus": 0.5}
    report = {"processes": rows(), "ray": rows(worker_method="ray", worker_options=options)}
    print(json.dumps(report))
