"""Overlap efficiency: GIL-releasing producer cost L and consumer cost C per batch.

efficiency = ideal / measured. Ideal: N makers (``--num-workers``, or the one producer
without workers) have batch k ready at ceil(k / N) * L, and the loop steps C on each in
turn as soon as it is ready (without workers, n * max(L, C) + min(L, C)); L and C are the
mean durations the sleeps actually took in that run (a loaded machine oversleeps; each
item reports its own, so worker processes count too). Target: >= 0.97 for
``thread`` and ``background`` at L/C in {0.25, 1, 4}, and, with ``--num-workers 2
--worker-method thread``, for the backends over worker threads. ``--loaders new`` (the
default) builds a new loader for every run, so that each run pays for the adaptive
decision; ``--loaders kept`` times later epochs of one loader per contestant. An epoch
has 40 batches unless ``--batches`` says otherwise.
"""

from __future__ import annotations

import math
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


def ideal_seconds(batches: int, makers: int, make: float, step: float) -> float:
    """The epoch's time when ``makers`` make batches in parallel, each in ``make`` seconds,
    and the loop steps ``step`` seconds on each as soon as it is ready."""
    ended = 0.0
    for batch in range(1, batches + 1):
        ended = max(ended, math.ceil(batch / makers) * make) + step
    return ended


class Sleepy(Dataset[tuple[int, float]]):
    """Item ``i`` sleeps ``seconds`` and is ``(i, the seconds the sleep took)``."""

    def __init__(self, size: int, seconds: float) -> None:
        self.size = size
        self.seconds = seconds

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> tuple[int, float]:
        spent: list[float] = []
        timed_sleep(self.seconds, spent)
        return index, spent[0]


def main() -> None:
    arguments = bench.parser(__doc__ or "", loaders="new", selectable=True)
    arguments.add_argument("--batches", type=int, default=BATCHES, help="batches per epoch")
    arguments.add_argument("--num-workers", type=int, default=0, help="DataLoader workers")
    arguments.add_argument(
        "--worker-method",
        choices=("multiprocessing", "thread"),
        default="multiprocessing",
        help="the backends' workers (DataLoader and the naive pattern: processes)",
    )
    args = arguments.parse_args()
    batches = args.batches
    workers = max(1, args.num_workers)
    bench.print_machine()
    rows: list[list[str]] = []
    names: list[str] = []
    first_epochs: list[str] = []
    for ratio in (0.25, 1.0, 4.0):
        produce, consume = (UNIT * ratio, UNIT) if ratio <= 1 else (UNIT, UNIT / ratio)
        produced: list[float] = []
        consumed: list[float] = []

        def step(
            batch: Any,
            consume: float = consume,
            consumed: list[float] = consumed,
            produced: list[float] = produced,
        ) -> None:
            produced.append(float(batch[1]))
            timed_sleep(consume, consumed)

        def efficiency(
            loader: Any, produced: list[float] = produced, consumed: list[float] = consumed
        ) -> float:
            produced.clear()
            consumed.clear()
            measured = bench.time_epoch(loader, step)
            cost_l = sum(produced) / len(produced)
            cost_c = sum(consumed) / len(consumed)
            return ideal_seconds(batches, workers, cost_l, cost_c) / measured

        factories = bench.contestants(
            Sleepy(batches, produce),
            batch_size=None,
            only=args.only,
            num_workers=args.num_workers,
            worker_method=args.worker_method,
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
