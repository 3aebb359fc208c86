"""Iterate a slow DataLoaderX until SIGINT arrives; report when KeyboardInterrupt reached us.

Usage: ctrl_c.py BACKEND NUM_WORKERS [WORKER_METHOD]. Prints ``READY`` after the first batch, then
``INTERRUPTED <time.time()>`` when the loop sees ``KeyboardInterrupt``, which it re-raises.
"""

from __future__ import annotations

import signal
import sys
import time

from dataloaderx import DataLoaderX
from tests.helpers import SlowDataset


def main(backend: str, num_workers: int, worker_method: str) -> None:
    # A shell that starts the suite in the background makes its children ignore SIGINT, and
    # Python then installs no handler: restore the one a terminal's Ctrl-C meets.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    loader = DataLoaderX(
        SlowDataset(10_000, 0.2),
        batch_size=1,
        num_workers=num_workers,
        worker_method=worker_method,
        backend=backend,
    )
    try:
        for index, _batch in enumerate(loader):
            if index == 0:
                print("READY", flush=True)
    except KeyboardInterrupt:
        print(f"INTERRUPTED {time.time()}", flush=True)
        raise
    print("EPOCH ENDED WITHOUT AN INTERRUPT", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), sys.argv[3] if len(sys.argv) > 3 else "multiprocessing")
