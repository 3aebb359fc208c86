"""Ctrl-C, a killed worker and ``timeout=``: the loader fails the way DataLoader does."""

from __future__ import annotations

import contextlib
import os
import queue
import re
import signal
import subprocess
import threading
import time
from typing import Any

import pytest
from torch.utils.data import DataLoader

from dataloaderx import DataLoaderX
from tests.reliability_support import (
    StuckDataset,
    scenario_command,
    scenario_env,
    scenario_report,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

#: Seconds the scenario may take to import torch and hand out its first batch.
STARTUP_SECONDS = 60.0
#: Seconds each later step of the Ctrl-C scenario may take on a loaded machine: far more
#: than any step needs, far less than the batch the loop waits for (an hour).
INTERRUPT_SECONDS = 30.0


def _lines(stream: Any, into: queue.Queue[str]) -> None:
    for line in stream:
        into.put(line.strip())


def _next_line(lines: queue.Queue[str], timeout: float) -> str:
    try:
        return lines.get(timeout=timeout)
    except queue.Empty:
        raise AssertionError(f"no output from the scenario within {timeout} s") from None


@pytest.mark.parametrize(
    ("num_workers", "worker_method"),
    [(0, "multiprocessing"), (2, "multiprocessing"), (2, "thread"), ("auto", "thread")],
)
def test_ctrl_c_interrupts_the_wait_for_a_batch(
    backend: str, num_workers: int | str, worker_method: str
) -> None:
    # The batch the loop waits for takes an hour (scenarios/ctrl_c.py): only an interrupted
    # wait can report within this test's deadlines, and the process exits without it.
    process = subprocess.Popen(
        scenario_command("ctrl_c.py", backend, str(num_workers), worker_method),
        env=scenario_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    lines: queue.Queue[str] = queue.Queue()
    reader = threading.Thread(target=_lines, args=(process.stdout, lines))
    reader.start()
    try:
        assert _next_line(lines, STARTUP_SECONDS) == "READY"
        assert _next_line(lines, INTERRUPT_SECONDS) == "WAITING"  # inside next()
        # Ctrl-C in a terminal sends SIGINT to the whole foreground process group.
        os.killpg(process.pid, signal.SIGINT)
        report = _next_line(lines, INTERRUPT_SECONDS)
        returncode = process.wait(timeout=INTERRUPT_SECONDS)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)  # a worker left sleeping, if any
        reader.join()
    assert process.stderr is not None
    stderr = process.stderr.read()
    process.stderr.close()
    assert report == "INTERRUPTED", (report, stderr)
    assert returncode == -signal.SIGINT, stderr
    assert stderr.rstrip().endswith("KeyboardInterrupt"), stderr
    assert "Exception ignored" not in stderr, stderr


#: What DataLoader raises for a dead worker: the SIGCHLD handler's message or, when its
#: own periodic status check sees the death first, that check's message.
DEAD_WORKER = re.compile(
    r"DataLoader worker \(pid(\(s\))? \d+\) "
    r"(is killed by signal: Killed\. |exited unexpectedly)"
)


def test_killed_worker_raises_dataloaders_error_and_the_next_loader_works(backend: str) -> None:
    outcome = scenario_report("worker_kill.py", [backend], timeout=90)
    reference, ours = outcome["reference"], outcome["ours"]
    assert reference is not None, "DataLoader itself did not notice the killed worker"
    assert ours is not None, "DataLoaderX did not raise after its worker was killed"
    assert ours[0] == reference[0] == "RuntimeError"
    assert DEAD_WORKER.fullmatch(reference[1]), reference[1]
    assert DEAD_WORKER.fullmatch(ours[1]), ours[1]
    assert outcome["next_loader_works"] is True


#: DataLoader's ``timeout``. A backend that prefetches from ``iter()`` on (``background``)
#: reads batch 0 at once, timed from there: this covers a fresh worker's start on a loaded
#: machine (at most 0.4 s measured), so that only the stuck item can time out.
TIMEOUT = 2.0


def _stuck(cls: type[DataLoader[Any]], **kwargs: Any) -> tuple[list[Any], float, bool]:
    """Events up to the first error from a loader whose third item is stuck; how long after
    ``iter()`` the error came; and whether the item was still stuck then.

    The first two batches are made before the loop asks for any: no read of the loop's own
    (DataLoader's, or an inline batch's) waits for the worker to start.
    """
    dataset = StuckDataset(6, stuck_at=2)
    loader = cls(dataset, batch_size=1, num_workers=1, timeout=TIMEOUT, **kwargs)
    started = time.monotonic()
    iterator = iter(loader)
    try:
        assert dataset.made_before.wait(STARTUP_SECONDS), "the worker did not make batch 1"
        events = run_events_until_error(iterator)
        failed_after = time.monotonic() - started
        still_stuck = not dataset.release.is_set()
    finally:
        dataset.release.set()  # the worker's item ends, and the worker with the iterator
        del iterator
    return events, failed_after, still_stuck


EXPECTED_TIMEOUT_EVENTS = [
    ("batch", 0, None),
    ("batch", 1, None),
    ("error", RuntimeError, f"DataLoader timed out after {TIMEOUT} seconds"),
]


def test_dataloader_reference_for_a_stuck_worker() -> None:
    events, failed_after, still_stuck = _stuck(DataLoader)
    assert events == EXPECTED_TIMEOUT_EVENTS
    assert failed_after >= TIMEOUT  # it waited the timeout out ...
    assert still_stuck  # ... but not for the item, which never came


def test_stuck_worker_times_out_like_dataloader(backend: str) -> None:
    events, failed_after, still_stuck = _stuck(DataLoaderX, backend=backend)
    assert events == EXPECTED_TIMEOUT_EVENTS
    assert failed_after >= TIMEOUT
    assert still_stuck


def run_events_until_error(iterator: Any) -> list[tuple[str, Any, Any]]:
    """Record batches until the first error (a stuck worker stays stuck, so stop there)."""
    events: list[tuple[str, Any, Any]] = []
    for _ in range(10):
        try:
            events.append(("batch", int(next(iterator)), None))
        except Exception as exc:  # noqa: BLE001 - recorded for comparison
            events.append(("error", type(exc), str(exc)))
            break
    return events
