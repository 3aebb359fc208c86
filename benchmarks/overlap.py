"""Overlap efficiency: GIL-releasing producer cost L and consumer cost C per batch.

efficiency = ideal / measured, ideal = n * max(L, C) + min(L, C), with L and C the mean
durations the sleeps actually took in that run (a loaded machine oversleeps). Target:
>= 0.97 for ``thread`` and ``background`` at L/C in {0.25, 1, 4}. ``--loaders new`` (the
default) builds a new loader for every run, so that each run pays for the adaptive
decision; ``--loaders kept`` times later epochs of one loader per contestant. An epoch
has 40 batches unless ``--batches`` says otherwise.
"""

from __future__ import annotations

import time
from typing import Any

import _common as bench
from torch.utils.data import Dataset

BATCHES = 40
UNIT = 0.015


def timed_sleep(seconds: float, spent: list[float]) -> None:
    start = time.perf_counter()
    time.sleep(seconds)
    spent.append(time.perf_counter() - start)


class Sleepy(Dataset[int]):
    def __init__(self, size: int, seconds: float, spent: list[float]) -> None:
        self.size = size
        self.seconds = seconds
        self.spent = spent

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> int:
        timed_sleep(self.seconds, self.spent)
        return index


def main() -> None:
    arguments = bench.parser(__doc__ or "", loaders="new", selectable=True)
    arguments.add_argument("--batches", type=int, default=BATCHES, help="batches per epoch")
    args = arguments.parse_args()
    batches = args.batches
    bench.print_machine()
    rows: list[list[str]] = []
    names: list[str] = []
    first_epochs: list[str] = []
    for ratio in (0.25, 1.0, 4.0):
        produce, consume = (UNIT * ratio, UNIT) if ratio <= 1 else (UNIT, UNIT / ratio)
        produced: list[float] = []
        consumed: list[float] = []

        def step(batch: Any, consume: float = consume, consumed: list[float] = consumed) -> None:
            timed_sleep(consume, consumed)

        def efficiency(
            loader: Any, produced: list[float] = produced, consumed: list[float] = consumed
        ) -> float:
            produced.clear()
            consumed.clear()
            measured = bench.time_epoch(loader, step)
            cost_l = sum(produced) / len(produced)
            cost_c = sum(consumed) / len(consumed)
            return (batches * max(cost_l, cost_c) + min(cost_l, cost_c)) / measured

        factories = bench.contestants(
            Sleepy(batches, produce, produced), batch_size=None, only=args.only
        )
        if args.loaders == "kept":
            factories = bench.kept_loaders(factories, efficiency, f"L/C {ratio:g}", first_epochs)
        names = list(factories)
        results = bench.medians(bench.alternate(factories, efficiency, args.repeats))
        rows.append(
            [f"{ratio:g} (L={1000 * produce:.1f} ms, C={1000 * consume:.1f} ms)"]
            + [f"{results[name]:.3f}" for name in names]
        )
    print(bench.markdown_table(["L/C", *names], rows))
    print("\n".join(first_epochs))


if __name__ == "__main__":
    main()
