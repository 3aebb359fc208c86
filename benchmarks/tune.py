"""``bench --tune`` against an exhaustive sweep of the same grid.

For each workload: the exhaustive sweep runs every setting of the grid (``num_workers`` 0,
1, 2, 4, ... up to the usable cores, every available backend and ``DataLoader``, depth 2 and
``"auto"``) ``--rounds`` times, alternated, and takes medians; then ``--tune`` runs within
its budget. The tuned setting is scored by its median *in the exhaustive sweep*, so both
answers are judged on the same runs.

Target: the tuned setting within 5% of the exhaustive best, in at most a third of its time.

Workloads: ``default`` is ``dataloaderx bench``'s embedded one (1 ms of storage latency per
image, decoding in torch ops, a 20 ms GIL-releasing step); ``workers`` has items that wait
4 ms each (releasing the GIL, as reads from remote storage do), where worker processes pay.
"""

from __future__ import annotations

import argparse
import statistics
import time
from time import perf_counter

import _common as bench
import torch
from torch.utils.data import Dataset

from dataloaderx.bench import workload as embedded
from dataloaderx.bench.tune.grid import Grid, Setting
from dataloaderx.bench.tune.measure import Workload, measure
from dataloaderx.bench.tune.tuner import TuneConfig, run_tune
from dataloaderx.registry import available_backends

#: Seconds each item of the ``workers`` workload waits.
ITEM_SECONDS = 0.004


class RemoteItems(Dataset[torch.Tensor]):
    """Items read from slow storage: a GIL-releasing wait, then a small tensor."""

    def __len__(self) -> int:
        return 16 * 40

    def __getitem__(self, index: int) -> torch.Tensor:
        time.sleep(ITEM_SECONDS)
        return torch.full((3, 32, 32), float(index))


WORKLOADS = {
    "default": Workload(
        embedded.default_dataset(),
        embedded.fake_step,
        embedded.DEFAULT_BATCH_SIZE,
        embedded.DEFAULT_BATCHES,
    ),
    "workers": Workload(RemoteItems(), embedded.fake_step, 16, 40),
}


def exhaustive(grid: Grid, work: Workload, rounds: int) -> dict[Setting, float]:
    """Median batches/s of every setting of ``grid`` over ``rounds`` alternated rounds."""
    settings = grid.all_settings()
    rates: dict[Setting, list[float]] = {setting: [] for setting in settings}
    for round_number in range(rounds):
        for setting in bench.rotated(settings, round_number):
            rates[setting].append(measure(setting, work).rate)
    return {setting: statistics.median(values) for setting, values in rates.items()}


def main() -> None:
    arguments = argparse.ArgumentParser(description=__doc__)
    arguments.add_argument("--rounds", type=int, default=9, help="exhaustive rounds (default 9)")
    arguments.add_argument("--budget", type=float, default=60.0, help="--tune budget (s)")
    arguments.add_argument("--workload", action="append", choices=list(WORKLOADS))
    args = arguments.parse_args()
    bench.print_machine()
    backends = tuple(available_backends())
    rows = []
    for name in args.workload or list(WORKLOADS):
        work = WORKLOADS[name]
        config = TuneConfig(work, backends, budget_seconds=args.budget)
        grid = config.grid()  # the grid --tune sweeps
        start = perf_counter()
        medians = exhaustive(grid, work, args.rounds)
        exhaustive_seconds = perf_counter() - start
        start = perf_counter()
        tuned = run_tune(config, progress=False)
        tune_seconds = perf_counter() - start
        best = max(medians, key=medians.__getitem__)
        pick = tuned.answer().best
        own = medians[Setting(0, bench.BASELINE)]
        rows.append(
            [
                name,
                pick.label,
                best.label,
                f"{medians[pick] / medians[best]:.3f}",
                f"{medians[pick] / own:.2f}x",
                f"{tune_seconds:.0f} / {exhaustive_seconds:.0f}",
                f"{tune_seconds / exhaustive_seconds:.2f}",
            ]
        )
    header = [
        "workload",
        "--tune picked",
        "exhaustive best",
        "picked / best",
        "picked vs DataLoader (workers=0)",
        "seconds (tune / exhaustive)",
        "time share",
    ]
    print(f"exhaustive: {len(grid.all_settings())} settings x {args.rounds} rounds")
    print(bench.markdown_table(header, rows))


if __name__ == "__main__":
    main()
