"""No regression where prefetching cannot help.

* ``num_workers=2`` with a fast step: DataLoader's workers already prefetch.
* ``num_workers=2``, batch size 8, tiny tensors, no step: only the hand-off is left.
* A pure-Python, GIL-bound dataset and step: a thread cannot overlap anything.

``--loaders kept`` (the default) builds each loader once and times its epochs after a
first one, as a training run iterates one loader for many epochs; the first epoch's
mode line says what the decision cost. ``--loaders new`` builds a new loader for every
run, so that each run pays for its own decision. Each run is bracketed by two
``DataLoader`` runs and compared with their mean; the table gives the median and range
of those paired ratios (``DataLoader``'s own row compares each ``DataLoader`` run with
the next: the noise floor) and, for adaptive loaders, the mode each run ended in.
Target: the default (``thread``, and ``auto`` on a CPU) >= 0.98x DataLoader's
throughput.
"""

from __future__ import annotations

import statistics
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
        return 1000

    def __getitem__(self, index: int) -> int:
        return spin(6000) + index


class TinyTensors(Dataset[torch.Tensor]):
    def __len__(self) -> int:
        return 8000

    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.full((4,), index)


def python_step(batch: Any) -> None:
    spin(60_000)


CASES = (
    "num_workers=2, fast step",
    "num_workers=2, tiny tensors, no step",
    "pure Python, GIL-bound",
)


def main() -> None:
    arguments = bench.parser(__doc__ or "", loaders="kept", selectable=True)
    arguments.add_argument(
        "--case", action="append", choices=CASES, help="run only this case (repeatable)"
    )
    args = arguments.parse_args()
    bench.print_machine()
    cases = {
        CASES[0]: (
            bench.contestants(SyntheticImages(640), batch_size=16, num_workers=2, only=args.only),
            None,
        ),
        CASES[1]: (
            bench.contestants(TinyTensors(), batch_size=8, num_workers=2, only=args.only),
            None,
        ),
        CASES[2]: (
            bench.contestants(PythonBound(), batch_size=10, only=args.only),
            python_step,
        ),
    }
    rows: list[list[str]] = []
    first_epochs: list[str] = []
    for case, (factories, step) in cases.items():
        if args.case and case not in args.case:
            continue
        modes: dict[str, list[str]] = {}
        if args.loaders == "kept":
            factories = bench.kept_loaders(
                factories, lambda loader, s=step: bench.time_epoch(loader, s), case, first_epochs
            )

        def note_mode(name: str, loader: Any, modes: dict[str, list[str]] = modes) -> None:
            stats = getattr(loader, "stats", None)
            if stats is not None and stats.mode is not None:
                modes.setdefault(name, []).append(stats.mode.split(" ", 1)[0])

        times, ratios = bench.bracketed(
            factories,
            lambda loader, s=step: bench.time_epoch(loader, s),
            args.repeats,
            note_mode,
        )
        rows += [
            [
                case,
                name,
                f"{statistics.median(seconds):.3f}",
                f"{statistics.median(ratios[name]):.3f}x",
                f"{min(ratios[name]):.3f}x-{max(ratios[name]):.3f}x",
                ", ".join(f"{mode} {modes[name].count(mode)}" for mode in sorted(set(modes[name])))
                if name in modes
                else "",
            ]
            for name, seconds in times.items()
        ]
    header = [
        "case",
        "loader",
        "epoch s (median)",
        "vs DataLoader (paired median)",
        "paired range",
        "mode per run",
    ]
    print(bench.markdown_table(header, rows))
    print("\n".join(first_epochs))


if __name__ == "__main__":
    main()
