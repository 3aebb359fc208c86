"""A training script whose loaders start their own local Ray: what it listens on, whom it
admits, and a train and a val loader sharing it.

Usage: ray_embedded.py. Builds a train loader (``num_workers="auto"``, as many as this
machine's cores) and a val loader (2 workers) with Ray workers, alternates them for three
epochs against ``DataLoader``'s batches, then lists the listening sockets of this process
and every process of its Ray, and asks the Ray's GCS for an answer from three new
processes: with no token, with a wrong one, with the token. Prints one JSON line.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import warnings

# Ray reads pytest's variables as a sign that it runs its own tests; this Ray is not the
# session's (RAY_ADDRESS) either.
for name in [name for name in os.environ if name.startswith(("RAY_", "PYTEST_"))]:
    del os.environ[name]

import psutil  # noqa: E402 - after the environment is set
import torch  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402

from dataloaderx import DataLoaderX  # noqa: E402
from dataloaderx.util.reaper import reaper_pid  # noqa: E402
from tests.helpers import RangeDataset  # noqa: E402

#: A client of the GCS at ``sys.argv[1]``, as the first thing ``ray.init`` does.
_CLIENT = (
    "import sys, ray._raylet as raylet; "
    "print(raylet.GcsClient(address=sys.argv[1]).check_alive([], timeout=10))"
)


def _loaders() -> list[tuple[DataLoaderX[torch.Tensor], DataLoader[torch.Tensor]]]:
    cores = os.cpu_count() or 1
    made = []
    # The train loader's elastic actors start the Ray.
    for size, workers in ((64, "auto"), (16, 2)):
        options: dict[str, object] = {"placement_timeout_s": 30.0}
        if workers == "auto":
            options.update(min_workers=cores, max_workers=cores)
        arguments = {"batch_size": 4, "shuffle": True}
        reference = DataLoader(
            RangeDataset(size), **arguments, generator=torch.Generator().manual_seed(size)
        )
        loader = DataLoaderX(
            RangeDataset(size),
            **arguments,
            generator=torch.Generator().manual_seed(size),
            num_workers=workers,
            worker_method="ray",
            worker_options=options,
        )
        made.append((loader, reference))
    return made


def _epochs() -> list[dict[str, object]]:
    rows = []
    loaders = _loaders()
    for epoch in range(3):
        for name, (loader, reference) in zip(("train", "val"), loaders, strict=True):
            start = time.monotonic()
            got = [batch[:, 0].tolist() for batch in loader]
            seconds = time.monotonic() - start
            expected = [batch[:, 0].tolist() for batch in reference]
            rows.append({"epoch": epoch, "loader": name, "same": got == expected, "s": seconds})
    return rows


def _listening() -> list[list[object]]:
    me = psutil.Process()
    processes = {me.pid: me.name()}
    for child in me.children(recursive=True):
        if child.pid != reaper_pid():
            processes[child.pid] = child.name()
    return [
        [socket.laddr.ip, socket.laddr.port, processes[socket.pid]]
        for socket in psutil.net_connections(kind="inet")
        if socket.status == psutil.CONN_LISTEN and socket.pid in processes
    ]


def _clients(address: str) -> dict[str, list[object]]:
    base = {key: value for key, value in os.environ.items() if not key.startswith("RAY_")}
    asked = {}
    for name, extra in (
        ("no token", {"RAY_AUTH_MODE": "disabled"}),
        ("wrong token", {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": "0" * 32}),
        ("the token", {"RAY_AUTH_MODE": "token"}),
    ):
        done = subprocess.run(
            [sys.executable, "-c", _CLIENT, address],
            env={**base, **extra},
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        last = (done.stderr.strip().splitlines() or [""])[-1]
        asked[name] = [done.returncode, last]
    return asked


def main() -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        epochs = _epochs()
    import ray

    report = {
        "warnings": [str(w.message) for w in caught if str(w.message).startswith("dataloaderx")],
        "epochs": epochs,
        "listening": _listening(),
        "clients": _clients(ray.get_runtime_context().gcs_address),
        "pid": os.getpid(),
    }
    print(json.dumps(report))


if __name__ == "__main__":
    main()
