"""Instructions per batch, counted by valgrind's callgrind: what each loader adds to a batch.

Timings on a shared machine drift by more than the few percent a wrapper adds to a batch
of microseconds. Instruction counts do not: callgrind counts every instruction the
process executes (all its threads), and the same program with the same inputs gives the
same count to within a few instructions per batch, whatever else the machine is doing.
An instruction is not a unit of time (a cache miss or a thread hand-off costs far more
than its instructions), so this complements the timed benchmarks: it shows the fixed
cost per batch that a loader adds where nothing overlaps, and nothing about overlap.

Each loader runs in its own process under ``valgrind --tool=callgrind``, twice: with 2
untimed epochs (construction, imports, the adaptive decision) and with 2 + ``--epochs``
epochs; the difference divided by the extra batches is its cost per batch. The processes
run with ``PYTHONHASHSEED=0`` (hash randomisation changes dict and set work from run to
run) and one intra-op thread (``OMP_NUM_THREADS=1``: idle OpenMP threads spin for a
time, and callgrind counts the spinning), which leaves the count of a process the same
to within a few hundred instructions. Single-process loops only (``num_workers=0``):
worker processes are not counted. Needs ``valgrind`` on the PATH (Debian: ``apt-get
install valgrind``); each process takes about a minute.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import _common as bench
import torch
from no_regression import TinyTensors
from torch.utils.data import Dataset

from dataloaderx import DataLoaderX


class Integers(Dataset[int]):
    def __len__(self) -> int:
        return 2000

    def __getitem__(self, index: int) -> int:
        return index


#: case -> (dataset, DataLoader keyword arguments)
CASES: dict[str, tuple[Dataset[Any], dict[str, Any]]] = {
    "8 tiny tensors per batch": (TinyTensors(), {"batch_size": 8}),
    "one integer per batch": (Integers(), {"batch_size": None}),
}
WARM_EPOCHS = 2
#: contestant -> DataLoaderX backend spec (None: DataLoader or the naive pattern).
CONTESTANTS: dict[str, dict[str, Any] | None] = {
    bench.BASELINE: None,
    bench.NAIVE: None,
    "sync": {"name": "sync"},
    "thread": {"name": "thread"},
    "auto": {"name": "auto"},
    "thread (stats off)": {"name": "thread", "stats": False},
}


def run_epochs(case: str, contestant: str, epochs: int) -> None:
    """The program callgrind counts: build the loader, then iterate ``epochs`` epochs."""
    dataset, kwargs = CASES[case]
    spec = CONTESTANTS[contestant]
    loader: Any
    if contestant == bench.BASELINE:
        loader = torch.utils.data.DataLoader(dataset, **kwargs)
    elif contestant == bench.NAIVE:
        loader = bench.NaiveBackgroundLoader(dataset, **kwargs)
    else:
        loader = DataLoaderX(dataset, backend=spec, **kwargs)
    for _ in range(epochs):
        for _batch in loader:
            pass


def count_instructions(case: str, contestant: str, epochs: int, valgrind: str) -> int:
    """Instructions callgrind counted for a process that runs ``epochs`` epochs."""
    with tempfile.TemporaryDirectory() as scratch:
        command = [
            valgrind,
            "--tool=callgrind",
            f"--callgrind-out-file={Path(scratch) / 'callgrind.out'}",
            sys.executable,
            __file__,
            "--child",
            case,
            contestant,
            str(epochs),
        ]
        environment = dict(os.environ, PYTHONHASHSEED="0", OMP_NUM_THREADS="1")
        done = subprocess.run(command, capture_output=True, text=True, check=True, env=environment)
    found = re.search(r"Collected\s*:\s*([\d,]+)", done.stderr)
    if found is None:
        raise SystemExit(f"callgrind printed no count:\n{done.stderr[-2000:]}")
    return int(found.group(1).replace(",", ""))


def batches_per_epoch(case: str) -> int:
    dataset, kwargs = CASES[case]
    return len(torch.utils.data.DataLoader(dataset, **kwargs))  # type: ignore[arg-type]


def main() -> None:
    arguments = argparse.ArgumentParser(description=__doc__)
    arguments.add_argument("--epochs", type=int, default=2, help="counted epochs (default 2)")
    arguments.add_argument("--case", action="append", choices=list(CASES), help="repeatable")
    arguments.add_argument("--jobs", type=int, default=2, help="processes at once (default 2)")
    arguments.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = arguments.parse_args()
    if args.child:
        case, contestant, epochs = args.child
        run_epochs(case, contestant, int(epochs))
        return
    valgrind = shutil.which("valgrind")
    if valgrind is None:
        raise SystemExit("valgrind is not on the PATH: install it (apt-get install valgrind)")
    bench.print_machine()
    cases = args.case or list(CASES)
    jobs = [
        (case, name, epochs)
        for case in cases
        for name in CONTESTANTS
        for epochs in (WARM_EPOCHS, WARM_EPOCHS + args.epochs)
    ]
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        counts = dict(
            zip(jobs, pool.map(lambda job: count_instructions(*job, valgrind), jobs), strict=True)
        )
    rows = []
    for case in cases:
        batches = args.epochs * batches_per_epoch(case)
        per_batch = {
            name: (
                counts[(case, name, WARM_EPOCHS + args.epochs)] - counts[(case, name, WARM_EPOCHS)]
            )
            / batches
            for name in CONTESTANTS
        }
        base = per_batch[bench.BASELINE]
        for name, value in per_batch.items():
            rows.append(
                [case, name, f"{value:,.0f}", f"{value - base:+,.0f}", f"{value / base:.3f}x"]
            )
    header = ["case", "loader", "instructions/batch", "over DataLoader", "vs DataLoader"]
    print(bench.markdown_table(header, rows))


if __name__ == "__main__":
    main()
