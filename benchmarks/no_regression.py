"""No regression where prefetching cannot help.

* ``num_workers=2`` with a fast step: DataLoader's workers already prefetch.
* ``num_workers=2``, batch size 8, tiny tensors, no step: only the hand-off is left.
* A pure-Python, GIL-bound dataset and step: a thread cannot overlap anything.

Every loader is new in every run, so each run pays for its own decision. Target: the
default (``thread``, and ``auto`` on a CPU) >= 0.98x DataLoader's throughput.
"""

from __future__ import annotations

from typing import Any

import _common as bench
import torch
from torch.utils.data import Dataset

from dataloaderx.bench.workload import SyntheticImages


def spin(rounds: int) -> int:
    total = 0
    for value in range(rounds):
        total += value * value % 7
    return total


class PythonBound(Dataset[int]):
    def __len__(self) -> int:
        return 600

    def __getitem__(self, index: int) -> int:
        return spin(6000) + index


class TinyTensors(Dataset[torch.Tensor]):
    def __len__(self) -> int:
        return 16_000

    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.full((4,), index)


def python_step(batch: Any) -> None:
    spin(60_000)


def main() -> None:
    args = bench.parser(__doc__ or "").parse_args()
    bench.print_machine()
    cases = {
        "num_workers=2, fast step": (
            bench.contestants(SyntheticImages(640), batch_size=16, num_workers=2),
            None,
        ),
        "num_workers=2, tiny tensors, no step": (
            bench.contestants(TinyTensors(), batch_size=8, num_workers=2),
            None,
        ),
        "pure Python, GIL-bound": (bench.contestants(PythonBound(), batch_size=10), python_step),
    }
    rows: list[list[str]] = []
    for case, (factories, step) in cases.items():
        results = bench.medians(
            bench.alternate(
                factories, lambda loader, s=step: bench.time_epoch(loader, s), args.repeats
            )
        )
        rows += [
            [case, name, f"{seconds:.3f}", f"{results[bench.BASELINE] / seconds:.3f}x"]
            for name, seconds in results.items()
        ]
    print(bench.markdown_table(["case", "loader", "epoch s", "throughput vs DataLoader"], rows))


if __name__ == "__main__":
    main()
