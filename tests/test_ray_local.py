"""A Ray the loader starts itself, in training scripts of its own: what it listens on, whom it
admits, two loaders sharing it, and what is left once the script is interrupted or killed
(``tests/scenarios/ray_embedded.py``, ``ray_training.py``)."""

from __future__ import annotations

import glob
import ipaddress
import os
import random
import signal
import subprocess
import time
from typing import Any

import pytest

from tests.helpers import run_python_without_session_ray, session_processes, wait_for
from tests.reliability_support import scenario_command, scenario_env, scenario_report

pytest.importorskip("ray", reason="ray is not installed: pip install 'dataloaderx[ray]'")

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

#: Hang bounds, not speed bounds: a Ray takes seconds to start or stop on a loaded machine.
EXIT_SECONDS = 60.0
LEFT_SECONDS = 20.0
#: How long a script's elastic workers may take to change their count (a hang bound).
RESIZE_SECONDS = 120.0
#: Ctrl-C rounds, each at a random moment of a new script's life.
ROUNDS = 2


@pytest.fixture(scope="module")
def embedded() -> dict[str, Any]:
    report = scenario_report("ray_embedded.py", [], timeout=240)
    # The script has exited: its Ray, shut down at exit, left no process.
    assert wait_for(lambda: not session_processes(report["pid"]), within=LEFT_SECONDS)
    return report


def test_the_local_ray_starts_once_and_says_what_it_exposes(embedded: dict[str, Any]) -> None:
    assert embedded["warnings"] == [
        "dataloaderx: worker_method='ray' started a local Ray (listening on the loopback "
        "address only, token authentication on, no dashboard), which is shut down at exit; "
        "call ray.init(address=...) before iterating to use a Ray cluster"
    ]


def test_every_socket_of_the_local_ray_listens_on_loopback_only(
    embedded: dict[str, Any],
) -> None:
    listening = embedded["listening"]
    names = {name for _, _, name in listening}
    assert {"gcs_server", "raylet"} <= names, listening
    for address, port, name in listening:
        plain = address.removeprefix("::ffff:")  # an IPv4 address on a dual-stack socket
        assert ipaddress.ip_address(plain).is_loopback, (address, port, name)


def test_the_local_ray_refuses_a_client_without_its_token(embedded: dict[str, Any]) -> None:
    clients = embedded["clients"]
    for refused in ("no token", "wrong token"):
        returncode, last_line = clients[refused]
        assert returncode != 0
        assert "AuthenticationError" in last_line, last_line
    assert clients["the token"][0] == 0, clients["the token"]


def test_a_train_and_a_val_loader_share_the_local_ray(embedded: dict[str, Any]) -> None:
    # The train loader holds as many workers as the machine has cores, the val loader 2
    # more, each kept between epochs: neither waits for the other's (a wait would end in
    # the "did not fit" error after placement_timeout_s).
    epochs = embedded["epochs"]
    assert [(row["epoch"], row["loader"]) for row in epochs] == [
        (epoch, loader) for epoch in range(3) for loader in ("train", "val")
    ]
    assert all(row["same"] for row in epochs), epochs


_WITHOUT_AUTHENTICATION = """
import os, warnings
os.environ["RAY_AUTH_MODE"] = "disabled"
from dataloaderx import DataLoaderX
from tests.helpers import RangeDataset

def loader(**options):
    return DataLoaderX(RangeDataset(4), batch_size=2, num_workers=1, worker_method="ray",
                       worker_options=options)

try:
    list(loader())
except RuntimeError as error:
    print("refused:", error)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    print(len(list(loader(start_local_ray_without_authentication=True))), "batches")
print("warned:", [str(w.message) for w in caught if "local Ray" in str(w.message)])
"""


def test_a_local_ray_without_authentication_starts_only_when_asked_for() -> None:
    done = run_python_without_session_ray(_WITHOUT_AUTHENTICATION, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    refused, batches, warned = done.stdout.strip().splitlines()[-3:]
    assert refused.startswith(
        "refused: worker_method='ray' would start a local Ray without authentication "
        "(RAY_AUTH_MODE='disabled')"
    )
    assert "worker_options={'start_local_ray_without_authentication': True}" in refused
    assert batches == "2 batches"
    assert "WITHOUT authentication: whoever reaches it can run code in it" in warned
    assert "listening on the loopback address only" in warned


def _start(backend: str, workers: str = "2") -> subprocess.Popen[str]:
    return subprocess.Popen(
        scenario_command("ray_training.py", backend, workers),
        env=scenario_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def _ready_to_kill(line: str, elastic: bool) -> bool:
    """Whether the script's ``line`` says it takes batches, or, for elastic workers, that an
    epoch ran more than one count."""
    if not elastic:
        return line.startswith("batches")
    return line.startswith("workers") and len(set(line.split()[1:])) > 1


def _own_files(pid: int) -> list[str]:
    return glob.glob(f"/dev/shm/dataloaderx-{pid}-*")


def _assert_nothing_left(pid: int) -> None:
    assert wait_for(lambda: not session_processes(pid), within=LEFT_SECONDS), session_processes(pid)
    assert wait_for(lambda: not _own_files(pid), within=LEFT_SECONDS), _own_files(pid)


@pytest.mark.parametrize("workers", ["2", "auto"])
def test_ctrl_c_at_any_moment_ends_the_script_with_keyboard_interrupt(workers: str) -> None:
    # A terminal's Ctrl-C reaches the whole process group (the script and its Ray) at a
    # random moment: while Ray starts, while actors start, mid-epoch, between epochs; with
    # elastic workers, while actors are added or leave too.
    rng = random.Random()
    for round_ in range(ROUNDS):
        backend = rng.choice(["sync", "thread"])
        delay = rng.uniform(0.0, 12.0)
        process = _start(backend, workers)
        assert process.stdout is not None
        assert process.stdout.readline().strip() == "started"
        time.sleep(delay)
        os.killpg(process.pid, signal.SIGINT)
        try:
            _, stderr = process.communicate(timeout=EXIT_SECONDS)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            _, stderr = process.communicate()
            pytest.fail(f"round {round_} ({backend}, {delay:.1f} s): no exit\n{stderr}")
        where = f"round {round_} ({backend}, Ctrl-C after {delay:.1f} s)"
        assert "KeyboardInterrupt" in stderr.splitlines(), f"{where}\n{stderr}"
        assert stderr.count("Started a local Ray instance") <= 1, f"{where}\n{stderr}"
        assert "Segmentation fault" not in stderr, f"{where}\n{stderr}"
        _assert_nothing_left(process.pid)


@pytest.mark.parametrize("workers", ["2", "auto"])
def test_a_killed_script_leaves_no_ray_process_and_no_shared_memory_file(workers: str) -> None:
    # As DataLoader's worker processes die with their parent; elastic ones once they have
    # resized, while the script goes on resizing.
    process = _start("thread", workers)
    assert process.stdout is not None
    deadline = time.monotonic() + RESIZE_SECONDS
    while not _ready_to_kill(process.stdout.readline(), elastic=workers == "auto"):
        assert process.poll() is None, process.communicate()[1]
        if time.monotonic() > deadline:
            os.killpg(process.pid, signal.SIGKILL)
            pytest.fail(f"no resize within {RESIZE_SECONDS} s\n{process.communicate()[1]}")
    # Batches wait for the loop in shared memory most of the time, if not at every moment
    # on a loaded machine (the end of an epoch, actors slower than the loop's step).
    assert wait_for(lambda: _own_files(process.pid), within=30), "no batch in shared memory"
    os.kill(process.pid, signal.SIGKILL)  # as the kernel's out-of-memory killer does
    process.communicate()
    _assert_nothing_left(process.pid)
