"""Ctrl-C, a killed worker and ``timeout=``: the loader fails the way DataLoader does, promptly."""

from __future__ import annotations

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
    [(0, "multiprocessing"), (2, "multiprocessing"), (2, "thread")],
)
def test_ctrl_c_reaches_the_consumer_within_a_second(
    backend: str, num_workers: int, worker_method: str
) -> None:
    # Ctrl-C in a terminal sends SIGINT to the whole foreground process group.
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
        time.sleep(0.3)  # mid-epoch: the consumer is waiting for a slow batch
        sent = time.time()
        os.killpg(process.pid, signal.SIGINT)
        report = _next_line(lines, 5.0)
        returncode = process.wait(timeout=max(0.1, sent + 5.0 - time.time()))
        exited = time.time()
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        reader.join()
    assert process.stderr is not None
    stderr = process.stderr.read()
    process.stderr.close()
    assert report.startswith("INTERRUPTED "), (report, stderr)
    assert float(report.split()[1]) - sent < 1.0
    assert exited - sent < 5.0
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


TIMEOUT, STUCK_FOR = 0.5, 2.5


def _stuck(cls: type[DataLoader[Any]], **kwargs: Any) -> tuple[list[Any], float]:
    """Events up to the first error from a loader whose third item hangs, and when it came."""
    loader = cls(
        StuckDataset(6, stuck_at=2, stuck_for=STUCK_FOR),
        batch_size=1,
        num_workers=1,
        timeout=TIMEOUT,
        **kwargs,
    )
    started = time.monotonic()
    iterator = iter(loader)
    events = run_events_until_error(iterator)
    failed_after = time.monotonic() - started
    del iterator
    return events, failed_after


EXPECTED_TIMEOUT_EVENTS = [
    ("batch", 0, None),
    ("batch", 1, None),
    ("error", RuntimeError, f"DataLoader timed out after {TIMEOUT} seconds"),
]


def test_dataloader_reference_for_a_stuck_worker() -> None:
    events, failed_after = _stuck(DataLoader)
    assert events == EXPECTED_TIMEOUT_EVENTS
    assert TIMEOUT <= failed_after < STUCK_FOR


def test_stuck_worker_times_out_like_dataloader(backend: str) -> None:
    events, failed_after = _stuck(DataLoaderX, backend=backend)
    assert events == EXPECTED_TIMEOUT_EVENTS
    assert TIMEOUT <= failed_after < STUCK_FOR


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
