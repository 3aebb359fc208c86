"""Worker processes forked by the next epoch: they never run the shutdown of an epoch their
parent left, and no thread of that epoch is alive when they are forked."""

from __future__ import annotations

import gc
import json
import os
from typing import Any

import pytest

from dataloaderx import available_backends
from dataloaderx.epoch.forks import never_finalize_in_children
from tests.reliability_support import run_scenario, takes_option

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

#: What PyTorch's iterator prints when its shutdown runs in a child (PyTorch issue 149837).
CHILD_SHUTDOWN = "can only test a child process"
CLEAN_EPOCH = [[0, 1], [2, 3], [4, 5], [6, 7]]


def left_epochs(loader: str, *options: str) -> tuple[dict[str, Any], str]:
    """Run ``tests/scenarios/left_epochs.py``; return its report and stderr."""
    result = run_scenario("left_epochs.py", [loader, "2", *options], timeout=240)
    assert result.returncode == 0, result.stderr
    report: dict[str, Any] = json.loads(result.stdout.strip().splitlines()[-1])
    return report, result.stderr


def test_the_reference_shows_that_the_scenario_sees_a_childs_shutdown() -> None:
    report, stderr = left_epochs("DataLoader", "--leave", "error", "--collect-in-workers")
    assert stderr.count(CHILD_SHUTDOWN) > 0
    assert report["clean"] == CLEAN_EPOCH


def test_the_thread_count_at_a_fork_sees_an_epoch_that_still_runs() -> None:
    report, _ = left_epochs("thread", "--leave", "keep", "--adaptive", "False")
    assert any(report["threads_at_fork"])


#: Every backend as configured by default, and with ``adaptive=False`` where it has it.
CONFIGURATIONS = [(name, ()) for name in available_backends()] + [
    (name, ("--adaptive", "False"))
    for name in available_backends()
    if takes_option(name, "adaptive")
]


@pytest.mark.parametrize(("backend", "options"), CONFIGURATIONS)
def test_no_shutdown_in_children_and_no_thread_of_a_left_epoch_at_forks(
    backend: str, options: tuple[str, ...]
) -> None:
    report, stderr = left_epochs(backend, "--collect-in-workers", *options)
    assert CHILD_SHUTDOWN not in stderr, stderr
    assert report["errors"] == ["ValueError"] * 2  # the two epochs left at an error
    assert report["threads_at_fork"]
    assert not any(report["threads_at_fork"])
    assert report["clean"] == CLEAN_EPOCH


def test_no_shutdown_in_children_and_no_thread_at_forks_with_prefetch() -> None:
    report, stderr = left_epochs("prefetch", "--collect-in-workers")
    assert CHILD_SHUTDOWN not in stderr, stderr
    assert report["threads_at_fork"]
    assert not any(report["threads_at_fork"])
    assert report["clean"] == CLEAN_EPOCH


class Finalized:
    """Writes its name to ``pipe`` when finalized."""

    def __init__(self, name: bytes, pipe: int) -> None:
        self.name = name
        self.pipe = pipe
        self.cycle = self

    def __del__(self) -> None:
        os.write(self.pipe, self.name)


def test_a_registered_source_in_a_cycle_is_never_finalized_in_a_child() -> None:
    read, write = os.pipe()
    os.set_blocking(read, False)
    kept = Finalized(b"kept ", write)
    control = Finalized(b"control ", write)
    never_finalize_in_children(kept)
    del kept, control  # both live on in their cycles only
    gc.disable()  # so that the cycles reach the child
    try:
        pid = os.fork()
        if pid == 0:  # the child: collect, and leave as a worker does
            gc.collect()
            os._exit(0)
    finally:
        gc.enable()
    os.waitpid(pid, 0)
    try:
        in_child = os.read(read, 100)
    except BlockingIOError:
        in_child = b""
    gc.collect()  # here both are finalized as usual
    in_parent = sorted(os.read(read, 100).split())
    os.close(read)
    os.close(write)
    assert in_child == b"control "
    assert in_parent == [b"control", b"kept"]
