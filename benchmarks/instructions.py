"""Instructions per batch, counted by valgrind's callgrind: what each loader adds to a batch.

Timings on a shared machine drift by more than the few percent a wrapper adds to a batch
of microseconds. Instruction counts do not: callgrind counts every instruction the
process executes (all its threads), and the same program with the same inputs gives the
same count to within a few instructions per batch, whatever else the machine is doing.
An instruction is not a unit of time (a cache miss or a thread hand-off costs far more
than its instructions), so this complements the timed benchmarks: it shows the fixed
cost per batch that a loader adds where nothing overlaps, and nothing about overlap.

Each loader runs in its own process under ``valgrind --tool=callgrind``: it builds the
loader, runs 2 untimed epochs (imports, the adaptive decision), then ``--epochs``
counted ones; callgrind splits its count at a call of ``getppid`` made just before and
just after the counted epochs (``--dump-before=getppid``), and the count between them
divided by the batches is the cost per batch. Before the counted epochs the process
freezes its heap for the garbage collector (``gc.freeze()``): a full collection
otherwise walks every object the imports made, so whether one falls inside the counted
epochs, and how much it costs, depends on everything the process imported, and moves the
per-batch count by hundreds of instructions. Where each object lands in memory moves it
too (collisions in Python's method cache, for one, follow the addresses of names), and
that changes with anything the process loads. So each loader runs under ``--seeds`` hash
seeds (``PYTHONHASHSEED`` 0, 1, ...: the seed changes the order of the dict and set work
of the imports, and with it where everything lands), and the table gives the mean, with
the range over the seeds. Layout still sets the resolution: the same code under the same
seed has counted over 700 instructions per batch apart when only the environment of the
process differed (a path, a variable), so read a difference of a few hundred as none,
and compare two commits by checking each out in turn in the same folder, with the same
environment. The adaptive default's count depends on time too (it checks its decision
every so many milliseconds of batches), so count it with nothing else running, and no
more processes at once (``--jobs``, default 2) than cores. One intra-op thread
(``OMP_NUM_THREADS=1``): idle OpenMP threads spin for a time, and callgrind counts the
spinning. Single-process loops only (``num_workers=0``): worker processes are not
counted. Needs ``valgrind`` on the PATH (Debian: ``apt-get install valgrind``); each
process takes about a minute.
"""

from __future__ import annotations

import argparse
import gc
import os
import re
import shutil
import statistics
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
#: Hash seeds (memory layouts) each loader is counted under, unless told.
SEEDS = 3
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
    """The program callgrind counts: build the loader, run the untimed epochs, then mark
    the counted ``epochs`` on both sides with a call of ``getppid``."""
    dataset, kwargs = CASES[case]
    spec = CONTESTANTS[contestant]
    loader: Any
    if contestant == bench.BASELINE:
        loader = torch.utils.data.DataLoader(dataset, **kwargs)
    elif contestant == bench.NAIVE:
        loader = bench.NaiveBackgroundLoader(dataset, **kwargs)
    else:
        loader = DataLoaderX(dataset, backend=spec, **kwargs)
    iterate(loader, WARM_EPOCHS)
    gc.collect()
    gc.freeze()
    os.getppid()
    iterate(loader, epochs)
    os.getppid()


def iterate(loader: Any, epochs: int) -> None:
    for _ in range(epochs):
        for _batch in loader:
            pass


def count_instructions(case: str, contestant: str, epochs: int, seed: int, valgrind: str) -> int:
    """Instructions callgrind counted over the ``epochs`` counted epochs of one process."""
    with tempfile.TemporaryDirectory() as scratch:
        output = Path(scratch) / "callgrind.out"
        command = [
            valgrind,
            "--tool=callgrind",
            "--dump-before=getppid",
            f"--callgrind-out-file={output}",
            sys.executable,
            __file__,
            "--child",
            case,
            contestant,
            str(epochs),
        ]
        environment = dict(os.environ, PYTHONHASHSEED=str(seed), OMP_NUM_THREADS="1")
        done = subprocess.run(command, capture_output=True, text=True, check=True, env=environment)
        # Part 1 ends at the first getppid, part 2 (the counted epochs) at the second.
        counted = Path(f"{output}.2")
        found = (
            re.search(r"^totals:\s*(\d+)", counted.read_text(), re.MULTILINE)
            if counted.exists()
            else None
        )
    if found is None:
        raise SystemExit(f"callgrind wrote no count of the counted epochs:\n{done.stderr[-2000:]}")
    return int(found.group(1))


def batches_per_epoch(case: str) -> int:
    dataset, kwargs = CASES[case]
    return len(torch.utils.data.DataLoader(dataset, **kwargs))  # type: ignore[arg-type]


def main() -> None:
    arguments = argparse.ArgumentParser(description=__doc__)
    arguments.add_argument("--epochs", type=int, default=2, help="counted epochs (default 2)")
    arguments.add_argument("--case", action="append", choices=list(CASES), help="repeatable")
    arguments.add_argument(
        "--seeds", type=int, default=SEEDS, help=f"hash seeds per loader (default {SEEDS})"
    )
    arguments.add_argument("--jobs", type=int, default=2, help="processes at once (default 2)")
    arguments.add_argument(
        "--loader", action="append", choices=list(CONTESTANTS), help="repeatable"
    )
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
    loaders = args.loader or list(CONTESTANTS)
    if bench.BASELINE not in loaders:
        loaders.insert(0, bench.BASELINE)
    jobs = [(case, name, seed) for case in cases for name in loaders for seed in range(args.seeds)]
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        counts = dict(
            zip(
                jobs,
                pool.map(
                    lambda job: count_instructions(job[0], job[1], args.epochs, job[2], valgrind),
                    jobs,
                ),
                strict=True,
            )
        )
    rows = []
    for case in cases:
        batches = args.epochs * batches_per_epoch(case)
        per_seed = {
            name: [counts[(case, name, seed)] / batches for seed in range(args.seeds)]
            for name in loaders
        }
        base = statistics.mean(per_seed[bench.BASELINE])
        for name, values in per_seed.items():
            value = statistics.mean(values)
            rows.append(
                [
                    case,
                    name,
                    f"{value:,.0f} ({min(values):,.0f}-{max(values):,.0f})",
                    f"{value - base:+,.0f}",
                    f"{value / base:.3f}x",
                ]
            )
    header = ["case", "loader", "instructions/batch, mean (range)", "over DataLoader", "vs"]
    print(bench.markdown_table(header, rows))


if __name__ == "__main__":
    main()
