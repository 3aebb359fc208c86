"""Time to first batch: from ``iter(loader)`` to the first batch in hand.

Target: <= DataLoader's + 1 ms.
"""

from __future__ import annotations

from collections.abc import Iterable
from time import perf_counter
from typing import Any

import _common as bench
import torch
from torch.utils.data import Dataset


class Small(Dataset[torch.Tensor]):
    def __len__(self) -> int:
        return 64

    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.full((3, 32, 32), float(index))


def first_batch(loader: Iterable[Any]) -> float:
    start = perf_counter()
    iterator = iter(loader)
    next(iterator)
    seconds = perf_counter() - start
    close = getattr(iterator, "close", None)
    if close is not None:
        close()
    else:
        for _ in iterator:  # the naive pattern cannot be stopped early without a leak
            pass
    return seconds


def main() -> None:
    arguments = bench.parser(__doc__ or "")
    arguments.set_defaults(repeats=50)
    args = arguments.parse_args()
    bench.print_machine()
    factories = bench.contestants(Small(), batch_size=8)
    results = bench.medians(bench.alternate(factories, first_batch, args.repeats))
    rows = [
        [name, f"{1000 * seconds:.3f}", f"{1000 * (seconds - results[bench.BASELINE]):+.3f}"]
        for name, seconds in results.items()
    ]
    print(bench.markdown_table(["loader", "first batch ms (median)", "vs DataLoader ms"], rows))


if __name__ == "__main__":
    main()
