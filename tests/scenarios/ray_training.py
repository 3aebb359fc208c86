"""A training script whose loader starts its own local Ray, to be interrupted or killed.

Usage: ray_training.py BACKEND [WORKERS]. Prints ``started`` before it builds the loader,
then ``batches N`` each time the loop has taken 4 more batches (N in all), with batches in
shared memory waiting for it, epoch after epoch, until it is stopped. WORKERS is 2 (the
default) or ``auto``: elastic workers (1 to 4 actors) under a step that is short in even
epochs (the loop waits: the pool grows) and long in odd ones (it shrinks), and ``workers
N M ...`` after each epoch, the counts it ran.
"""

from __future__ import annotations

import faulthandler
import itertools
import os
import signal
import sys
import time

# Ray reads pytest's variables as a sign that it runs its own tests; this Ray is not the
# session's (RAY_ADDRESS) either.
for name in [name for name in os.environ if name.startswith(("RAY_", "PYTEST_"))]:
    del os.environ[name]

from dataloaderx import DataLoaderX  # noqa: E402
from tests.helpers import SlowDataset  # noqa: E402


def main(backend: str, workers: str) -> None:
    # A shell that starts the suite in the background makes its children ignore SIGINT, and
    # Python then installs no handler: restore the one a terminal's Ctrl-C meets.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    # Where every thread was when a Ctrl-C came, on stderr; Python's own handler still runs.
    faulthandler.register(signal.SIGINT, all_threads=True, chain=True)
    print("started", flush=True)
    elastic = workers == "auto"
    loader = DataLoaderX(
        SlowDataset(400, 0.01) if elastic else SlowDataset(64, 0.005),
        batch_size=4,
        num_workers="auto" if elastic else int(workers),
        prefetch_factor=4,
        worker_method="ray",
        worker_options={"min_workers": 1, "max_workers": 4, "num_cpus": 0.5} if elastic else None,
        backend=backend,
    )
    taken = 0
    for epoch in itertools.count():
        step = 0.02 if not elastic else 0.002 if epoch % 2 == 0 else 0.05
        for _batch in loader:
            time.sleep(step)  # the step: batches wait for the loop in shared memory
            taken += 1
            if taken % 4 == 0:
                print(f"batches {taken}", flush=True)
        if elastic and loader.stats is not None:
            print("workers", *(count for _, count, _ in loader.stats.workers), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "2")
