"""A training script whose loader starts its own local Ray, to be interrupted or killed.

Usage: ray_training.py BACKEND. Prints ``started`` before it builds the loader, then
``batches N`` each time the loop has taken 4 more batches (N in all), with batches in
shared memory waiting for it, epoch after epoch, until it is stopped.
"""

from __future__ import annotations

import faulthandler
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


def main(backend: str) -> None:
    # A shell that starts the suite in the background makes its children ignore SIGINT, and
    # Python then installs no handler: restore the one a terminal's Ctrl-C meets.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    # Where every thread was when a Ctrl-C came, on stderr; Python's own handler still runs.
    faulthandler.register(signal.SIGINT, all_threads=True, chain=True)
    print("started", flush=True)
    loader = DataLoaderX(
        SlowDataset(64, 0.005),
        batch_size=4,
        num_workers=2,
        prefetch_factor=4,
        worker_method="ray",
        backend=backend,
    )
    taken = 0
    while True:
        for _batch in loader:
            time.sleep(0.02)  # the step: batches wait for the loop in shared memory
            taken += 1
            if taken % 4 == 0:
                print(f"batches {taken}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
