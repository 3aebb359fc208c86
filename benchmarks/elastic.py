"""Elastic worker threads (``num_workers="auto"``) against the best fixed count, in one run.

What is measured. The five workloads of ``peers.py`` (batch size 32, two epochs of
``--batches`` batches, default 400, or 150 for pure Python, whose batches take about 54 ms
where the others keep up with the step: epochs of about 8 s at the best count, on 2 cores)
with ``worker_method="thread"`` and the default backend, and a training step of ``--step``
seconds (default 0.02) that releases the GIL (a GPU step waits in CUDA without it). First a
sweep: one run per fixed count of ``--sweep`` (default 1, 2, 4, 8); the fastest over both
epochs is the best fixed count. Then ``--rounds`` alternated rounds (default 3) of that count
and of ``"auto"``, each run a fresh process. The table gives each epoch's batches/s (medians),
``"auto"`` against the best fixed count, the counts ``"auto"`` ran in epoch 2, and the changes
it made in the second half of epoch 2 (a steady workload should see none).

How to run (from the repository root)::

    python benchmarks/elastic.py                        # ~20 min on 2 cores
    python benchmarks/elastic.py --workloads "I/O latency" --rounds 5
    python benchmarks/elastic.py --json > elastic.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from time import perf_counter
from typing import Any

import _common as bench
import peers

from dataloaderx import DataLoaderX

BATCHES = 400
#: Workloads whose epochs are shorter, for about the same time per epoch.
FEWER_BATCHES = {peers.PURE_PYTHON: 150}
STEP_SECONDS = 0.02
SWEEP = (1, 2, 4, 8)
ROUNDS = 3
EPOCHS = 2
AUTO = "auto"
#: Where "auto" is to be, against the best fixed count, in each epoch.
TARGET = 0.97


def child(workload: str, workers: str, batches: int, step: float) -> None:
    """One run in this process; prints its figures as JSON."""
    dataset = peers.make_dataset(workload, batches * peers.BATCH_SIZE)
    count: Any = workers if workers == AUTO else int(workers)
    loader = DataLoaderX(
        dataset, batch_size=peers.BATCH_SIZE, num_workers=count, worker_method="thread"
    )
    rates, history, spans = [], [], []
    for _ in range(EPOCHS):
        start = perf_counter()
        for _batch in loader:
            time.sleep(step)
        end = perf_counter()
        rates.append(batches / (end - start))
        spans.append((start, end))
        stats = loader.stats
        history.append([] if stats is None else [list(entry) for entry in stats.workers])
    start, end = spans[-1]
    late = [entry for entry in history[-1] if entry[0] > start + (end - start) / 2]
    print(
        json.dumps(
            {
                "rates": rates,
                "counts": sorted({int(entry[1]) for entry in history[-1]}),
                "late_changes": len(late),
                "history": [[round(at - start, 3), n, why] for at, n, why in history[-1]],
            }
        ),
        flush=True,
    )


def run(workload: str, workers: str, batches: int, step: float) -> dict[str, Any]:
    command = [sys.executable, __file__, "--child", workload, workers, str(batches), str(step)]
    output = subprocess.run(command, capture_output=True, text=True, timeout=900, check=False)
    if output.returncode != 0:
        raise SystemExit(f"{workload!r} with {workers} workers failed:\n{output.stderr}")
    return dict(json.loads(output.stdout.strip().splitlines()[-1]))


def measure(workload: str, options: argparse.Namespace) -> dict[str, Any]:
    batches = options.batches or FEWER_BATCHES.get(workload, BATCHES)
    sweep = {str(n): run(workload, str(n), batches, options.step) for n in options.sweep}
    best = max(sweep, key=lambda n: statistics.mean(sweep[n]["rates"]))
    runs: dict[str, list[dict[str, Any]]] = {best: [], AUTO: []}
    for round_number in range(options.rounds):
        for name in bench.rotated([best, AUTO], round_number):
            runs[name].append(run(workload, name, batches, options.step))
    medians = {
        name: [statistics.median(r["rates"][e] for r in results) for e in range(EPOCHS)]
        for name, results in runs.items()
    }
    return {
        "workload": workload,
        "batches": batches,
        "sweep": {n: result["rates"] for n, result in sweep.items()},
        "best": int(best),
        "best_rates": medians[best],
        "auto_rates": medians[AUTO],
        "ratios": [a / b for a, b in zip(medians[AUTO], medians[best], strict=True)],
        "auto_counts": [r["counts"] for r in runs[AUTO]],
        "late_changes": [r["late_changes"] for r in runs[AUTO]],
        "history": runs[AUTO][-1]["history"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--child", nargs=4, metavar=("WORKLOAD", "WORKERS", "BATCHES", "STEP"))
    parser.add_argument("--workloads", nargs="+", default=list(peers.WORKLOADS))
    parser.add_argument("--batches", type=int, help=f"per epoch (default {BATCHES})")
    parser.add_argument("--step", type=float, default=STEP_SECONDS)
    parser.add_argument("--sweep", type=int, nargs="+", default=list(SWEEP))
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    parser.add_argument("--json", action="store_true")
    options = parser.parse_args()
    if options.child:
        workload, workers, batches, step = options.child
        child(workload, workers, int(batches), float(step))
        return
    results = [measure(workload, options) for workload in options.workloads]
    if options.json:
        print(json.dumps(results, indent=2))
        return
    bench.print_machine()
    rows = []
    for result in results:
        ratios = result["ratios"]
        met = all(ratio >= TARGET for ratio in ratios) and not any(result["late_changes"])
        rows.append(
            [
                result["workload"],
                str(result["best"]),
                " / ".join(f"{rate:.1f}" for rate in result["best_rates"]),
                " / ".join(f"{rate:.1f}" for rate in result["auto_rates"]),
                " / ".join(f"{ratio:.2f}x" for ratio in ratios),
                "; ".join(",".join(map(str, counts)) for counts in result["auto_counts"]),
                ", ".join(map(str, result["late_changes"])),
                "met" if met else "NOT met",
            ]
        )
    header = [
        "workload",
        "best fixed",
        "fixed batches/s (e1 / e2)",
        "auto batches/s (e1 / e2)",
        "auto / fixed",
        "auto's counts in e2 (per round)",
        "changes late in e2",
        f">= {TARGET}x, steady",
    ]
    print(bench.markdown_table(header, rows))


if __name__ == "__main__":
    main()
