"""Where the first epoch goes, batch by batch: worker threads against torchdata.nodes'.

Three loaders over the same items (``peers.py``'s workloads, batch size 32, 2 workers, two
epochs of 64 batches), each run in a fresh process, rounds alternated:

- ``nodes (thread)``: torchdata.nodes' thread ``ParallelMapper``, as ``peers.py`` builds it;
- ``dataloaderx threads``: ``DataLoaderX(worker_method="thread")``, default backend;
- ``dataloaderx threads, own``: the same over a dataset whose items ask for their worker's
  info, which keeps each worker's batches in its own thread (as with worker processes).

Reported: the median time from ``iter()`` to batches 1, 8, 16, 32 and 64 of each epoch;
the median time per window of 8 batches; the loop's batches/s per epoch with each round's
ratio to ``nodes (thread)`` (paired: the two runs of a round are minutes apart at most);
the mode the default backend chose and how many batches its probe prefetched. Then, with
``--threads``, the cause the sharing answers: two threads of this process given the same
items each (one intra-op thread apiece), and when each one finished.

How to run (the ``peers`` extra)::

    python benchmarks/first_epoch.py                         # torch ops, 10 rounds
    python benchmarks/first_epoch.py --workload "JPEG decode" --rounds 5 --threads
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import threading
import time
from typing import Any

import _common as bench
import peers
from torch.utils.data import Dataset, get_worker_info

from dataloaderx import DataLoaderX
from dataloaderx.workers.intra_op import one_intra_op_thread

NODES = "nodes (thread)"
SHARED = "dataloaderx threads"
OWN = "dataloaderx threads, own"
LOADERS = (NODES, SHARED, OWN)
BATCHES = 64
MARKS = (1, 8, 16, 32, 64)
WINDOW = 8
CHILD_TIMEOUT = 600.0


class AsksForItsWorker(Dataset[Any]):
    """``dataset``'s items, each of which first asks for its worker's info."""

    def __init__(self, dataset: Dataset[Any]) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)  # type: ignore[arg-type]

    def __getitem__(self, index: int) -> Any:
        get_worker_info()
        return self.dataset[index]


def child(workload: str, name: str) -> None:
    dataset = peers.make_dataset(workload, BATCHES * peers.BATCH_SIZE)
    if name == NODES:
        loader: Any = peers.nodes_loader(dataset, 2, "thread")
    else:
        if name == OWN:
            dataset = AsksForItsWorker(dataset)
        loader = DataLoaderX(
            dataset, batch_size=peers.BATCH_SIZE, num_workers=2, worker_method="thread"
        )
    epochs = []
    for _ in range(peers.EPOCHS):
        start = time.perf_counter()
        arrivals = []
        for _batch in loader:
            arrivals.append(time.perf_counter() - start)
        stats = getattr(loader, "stats", None)
        epochs.append({"arrivals": arrivals, "mode": None if stats is None else stats.mode})
    print(json.dumps(epochs), flush=True)


def run_child(workload: str, name: str) -> list[dict[str, Any]]:
    command = [sys.executable, __file__, "--child", workload, name]
    output = subprocess.run(command, capture_output=True, text=True, timeout=CHILD_TIMEOUT)
    if output.returncode != 0:
        raise SystemExit(f"{name!r} failed:\n{output.stderr}")
    return list(json.loads(output.stdout.strip().splitlines()[-1]))


def report(runs: dict[str, list[list[dict[str, Any]]]]) -> None:
    for epoch in range(peers.EPOCHS):
        print(f"\nEpoch {epoch + 1}: median ms from iter() to batch k, and per {WINDOW} batches\n")
        windows = range(WINDOW, BATCHES + 1, WINDOW)
        header = ["loader", *(f"batch {k}" for k in MARKS), *(f"{k - WINDOW}-{k}" for k in windows)]
        rows = []
        for name, found in runs.items():
            arrivals = [run[epoch]["arrivals"] for run in found]
            marks = [statistics.median(a[k - 1] for a in arrivals) for k in MARKS]
            spans = [
                statistics.median(
                    a[k - 1] - a[k - WINDOW - 1] if k > WINDOW else a[k - 1] for a in arrivals
                )
                for k in windows
            ]
            rows.append(
                [name, *(f"{1000 * m:.0f}" for m in marks), *(f"{1000 * s:.0f}" for s in spans)]
            )
        print(bench.markdown_table(header, rows))
        print()
        reference = [BATCHES / run[epoch]["arrivals"][-1] for run in runs[NODES]]
        for name, found in runs.items():
            rates = [BATCHES / run[epoch]["arrivals"][-1] for run in found]
            ratios = [rate / ref for rate, ref in zip(rates, reference, strict=True)]
            print(
                f"{name}: {statistics.median(rates):.1f} batches/s; paired ratio to {NODES} "
                f"median {statistics.median(ratios):.3f} ("
                + " ".join(f"{ratio:.2f}" for ratio in ratios)
                + ")"
            )
        for name in (SHARED, OWN):
            modes = {run[epoch]["mode"] for run in runs[name]}
            print(f"{name}, mode: " + "; ".join(sorted(str(mode) for mode in modes)))


def thread_speeds(workload: str, rounds: int) -> None:
    """Two threads, the same number of items each: when each finished."""
    dataset = peers.make_dataset(workload, 2048)
    print(f"\nTwo threads, 1,024 {workload} items each, one intra-op thread apiece:\n")
    for _ in range(rounds):
        done = finish_times(dataset)
        print(f"  finished after {done[0]:.2f} s and {done[1]:.2f} s")


def finish_times(dataset: Dataset[Any]) -> dict[int, float]:
    """Threads 0 and 1 make items 0, 2, ... and 1, 3, ...: seconds until each is done."""
    done: dict[int, float] = {}
    lock = threading.Lock()
    start = time.perf_counter()

    def work(first: int) -> None:
        one_thread = one_intra_op_thread()
        if one_thread is not None:
            one_thread()
        for index in range(first, 2048, 2):
            dataset[index]
        with lock:
            done[first] = time.perf_counter() - start

    threads = [threading.Thread(target=work, args=(first,)) for first in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return done


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n", 1)[0])
    parser.add_argument("--workload", default=peers.TORCH_OPS, choices=peers.WORKLOADS)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--threads", action="store_true", help="also time two bare threads")
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(*args.child)
        return
    bench.print_machine()
    runs: dict[str, list[list[dict[str, Any]]]] = {name: [] for name in LOADERS}
    for round_number in range(args.rounds):
        for name in bench.rotated(list(LOADERS), round_number):
            runs[name].append(run_child(args.workload, name))
        print(f"  round {round_number + 1}/{args.rounds} done", file=sys.stderr, flush=True)
    print(f"\n{args.workload}, batch size {peers.BATCH_SIZE}, 2 workers, {args.rounds} rounds")
    report(runs)
    if args.threads:
        thread_speeds(args.workload, 5)


if __name__ == "__main__":
    main()
