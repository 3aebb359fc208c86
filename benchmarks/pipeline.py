"""Realistic CPU pipeline: the ``dataloaderx bench`` default workload, num_workers=0.

Images are read with a storage latency and decoded/augmented with torch ops; the step
waits like an accelerator would. Targets: ``thread`` >= 1.8x ``DataLoader`` on 2 cores
and ``thread`` >= the naive ``BackgroundGenerator``.
"""

from __future__ import annotations

import _common as bench

from dataloaderx.bench.workload import DEFAULT_BATCH_SIZE, default_dataset, fake_step


def main() -> None:
    args = bench.parser(__doc__ or "").parse_args()
    bench.print_machine()
    factories = bench.contestants(default_dataset(), batch_size=DEFAULT_BATCH_SIZE)
    results = bench.medians(
        bench.alternate(factories, lambda loader: bench.time_epoch(loader, fake_step), args.repeats)
    )
    rows = [
        [
            name,
            f"{seconds:.3f}",
            f"{results[bench.BASELINE] / seconds:.2f}x",
            f"{results[bench.NAIVE] / seconds:.2f}x",
        ]
        for name, seconds in results.items()
    ]
    print(bench.markdown_table(["loader", "epoch s", "vs DataLoader", "vs naive BG"], rows))


if __name__ == "__main__":
    main()
