"""The whole Ray cluster dies mid-epoch: every process of it killed, as when its machines go.

Usage: ray_cluster_loss.py PLACEMENT_TIMEOUT_S. Starts a local Ray of its own, takes a few
batches from a DataLoaderX with two Ray workers, SIGKILLs every Ray process (the GCS, the
raylet, the agents, the actors), and goes on iterating. Prints one JSON line: the error the
loop raised, the seconds from the kill to it, the processes killed and this process's id;
then exits as a training script would, with Ray still initialised.
"""

from __future__ import annotations

import json
import os
import sys
import time

# Ray reads pytest's variables as a sign that it runs its own tests; this Ray is not the
# session's (RAY_ADDRESS) either.
for name in [name for name in os.environ if name.startswith(("RAY_", "PYTEST_"))]:
    del os.environ[name]

import psutil  # noqa: E402 - after the environment is set
import ray  # noqa: E402

from dataloaderx import DataLoaderX  # noqa: E402
from tests.helpers import SlowDataset  # noqa: E402

BATCHES_BEFORE = 4


def main(placement_timeout_s: float) -> None:
    ray.init(address="local", _node_ip_address="127.0.0.1", include_dashboard=False, num_cpus=2)
    options = {"num_cpus": 0.5, "placement_timeout_s": placement_timeout_s}
    loader = DataLoaderX(
        SlowDataset(10_000, 0.02), num_workers=2, worker_method="ray", worker_options=options
    )
    iterator = iter(loader)
    for _ in range(BATCHES_BEFORE):
        next(iterator)
    cluster = psutil.Process().children(recursive=True)
    names = sorted({process.name() for process in cluster})
    killed = time.monotonic()
    for process in cluster:
        process.kill()
    psutil.wait_procs(cluster)
    error: list[str] | None = None
    try:
        for _ in iterator:
            pass
    except RuntimeError as exc:
        error = [type(exc).__name__, str(exc)]
    report = {
        "error": error,
        "seconds": time.monotonic() - killed,
        "killed": names,
        "pid": os.getpid(),
    }
    print(json.dumps(report))


if __name__ == "__main__":
    main(float(sys.argv[1]))
