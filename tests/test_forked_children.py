"""Worker processes forked by the next epoch: they never run the shutdown of an epoch their
parent left, and no thread of that epoch is alive when they are forked."""

from __future__ import annotations

import gc
import json
import os
from collections.abc import Callable
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


def written(read: int) -> bytes:
    """What is waiting in the pipe's non-blocking ``read`` end (nothing: ``b""``)."""
    try:
        return os.read(read, 100)
    except BlockingIOError:
        return b""


def in_a_child(child: Callable[[int], None]) -> bytes:
    """Fork; the child runs ``child(pipe)``, collects and leaves as a worker does. What the
    child wrote to the pipe."""
    read, write = os.pipe()
    os.set_blocking(read, False)
    pid = os.fork()
    if pid == 0:
        child(write)
        gc.collect()
        os._exit(0)
    os.waitpid(pid, 0)
    in_child = written(read)
    os.close(read)
    os.close(write)
    return in_child


def test_a_registered_source_is_never_finalized_in_a_child_that_drops_it() -> None:
    devnull = os.open(os.devnull, os.O_WRONLY)
    held = [Finalized(b"kept ", devnull), Finalized(b"control ", devnull)]
    never_finalize_in_children(held[0])
    for item in held:
        item.cycle = None  # dropping the last reference finalizes at once
    del item

    def child(pipe: int) -> None:
        held[0].pipe = held[1].pipe = pipe
        held.clear()

    try:
        assert in_a_child(child) == b"control "
    finally:
        held.clear()
        os.close(devnull)


def test_a_child_never_collects_the_cycles_it_inherited() -> None:
    never_finalize_in_children(object)  # the fork hooks are in place
    read, write = os.pipe()
    os.set_blocking(read, False)
    gc.disable()  # so that the cycle reaches the child
    try:
        Finalized(b"inherited ", write)  # garbage: its cycle alone holds it
        pid = os.fork()
        if pid == 0:
            gc.collect()
            os._exit(0)
        os.waitpid(pid, 0)
    finally:
        gc.enable()
    in_child = written(read)
    gc.collect()  # here it is collected as usual
    in_parent = written(read)
    os.close(read)
    os.close(write)
    assert in_child == b""
    assert in_parent == b"inherited "


@pytest.mark.parametrize("collecting", [True, False])
def test_a_fork_leaves_the_collector_on_or_off_as_it_was(collecting: bool) -> None:
    never_finalize_in_children(object)
    was = gc.isenabled()
    (gc.enable if collecting else gc.disable)()
    try:
        in_child = in_a_child(lambda pipe: os.write(pipe, b"on" if gc.isenabled() else b"off"))
        in_parent = gc.isenabled()
    finally:
        (gc.enable if was else gc.disable)()
    assert in_child == (b"on" if collecting else b"off")
    assert in_parent == collecting
