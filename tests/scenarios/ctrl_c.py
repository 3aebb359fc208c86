"""Iterate a DataLoaderX whose second batch never comes until SIGINT arrives; report it.

Usage: ctrl_c.py BACKEND NUM_WORKERS [WORKER_METHOD] (NUM_WORKERS: a count, or auto).
Prints ``READY`` after the first batch, ``WAITING`` once the loop is inside ``next()`` for
the second (every item but the first sleeps for ``STALL_SECONDS``, far longer than the
test waits), then ``INTERRUPTED`` when the loop sees ``KeyboardInterrupt``, which it
re-raises.
"""

from __future__ import annotations

import signal
import sys
import threading
import time
from typing import Any

from dataloaderx import DataLoaderX, PrefetchIterator
from tests.helpers import StallingDataset

#: How long each item but the first takes: the batch the loop waits for never comes in time.
STALL_SECONDS = 3600.0


def announce_the_wait(loop: int) -> None:
    """Print ``WAITING`` once the thread ``loop`` is inside ``PrefetchIterator.__next__``."""
    code = PrefetchIterator.__next__.__code__
    while True:
        frame = sys._current_frames().get(loop)
        while frame is not None and frame.f_code is not code:
            frame = frame.f_back
        if frame is not None:
            print("WAITING", flush=True)
            return
        time.sleep(0.005)


def main(backend: str, num_workers: Any, worker_method: str) -> None:
    # A shell that starts the suite in the background makes its children ignore SIGINT, and
    # Python then installs no handler: restore the one a terminal's Ctrl-C meets.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    loader = DataLoaderX(
        StallingDataset(10_000, STALL_SECONDS),
        batch_size=1,
        num_workers=num_workers,
        worker_method=worker_method,
        backend=backend,
    )
    try:
        iterator = iter(loader)
        next(iterator)
        print("READY", flush=True)
        watcher = threading.Thread(
            target=announce_the_wait, args=(threading.get_ident(),), daemon=True
        )
        watcher.start()
        next(iterator)
    except KeyboardInterrupt:
        print("INTERRUPTED", flush=True)
        raise
    print("THE STALLED BATCH CAME", flush=True)


if __name__ == "__main__":
    count = sys.argv[2] if sys.argv[2] == "auto" else int(sys.argv[2])
    main(sys.argv[1], count, sys.argv[3] if len(sys.argv) > 3 else "multiprocessing")
