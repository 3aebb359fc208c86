"""A job killed with SIGKILL resumes from its last saved state: nothing lost, nothing extra."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.reliability_support import scenario_command, scenario_env, scenario_report

EVERY = 7
TOTAL_STEPS = 60  # preempt.py: 2 epochs of 120 items in batches of 4


def consumed(workdir: Path) -> list[str]:
    return (workdir / "consumed.log").read_text().splitlines()


def kill_after(workdir: Path, args: list[str], steps: int) -> None:
    """Start the job and SIGKILL it (and its workers) once it has logged ``steps`` steps.

    The job holds at its end until its standard input closes, which only the kill does: it
    cannot end by itself between a look at its log and the kill, however late that comes.
    """
    process = subprocess.Popen(
        [*scenario_command("preempt.py", str(workdir), *args), "--hold"],
        env=scenario_env(),
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    log = workdir / "consumed.log"
    deadline = time.monotonic() + 60
    try:
        while not (log.exists() and len(consumed(workdir)) >= steps):
            assert process.poll() is None, process.stderr.read() if process.stderr else ""
            assert time.monotonic() < deadline, "the job did not reach the kill step"
            time.sleep(0.001)
    finally:
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate()


#: Where the first job is killed (it may log a few more steps before the kill lands; the
#: checks allow for any number): just after its first save, just into the second epoch (of
#: 30 steps each), and at the last step but one.
KILL_AT = [EVERY + 1, 31, TOTAL_STEPS - 2]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> Callable[[list[str]], list[str]]:
    """The steps an uninterrupted job logs with the given arguments (one run each)."""
    runs: dict[tuple[str, ...], list[str]] = {}

    def steps(args: list[str]) -> list[str]:
        if tuple(args) not in runs:
            workdir = tmp_path_factory.mktemp("uninterrupted")
            report = scenario_report("preempt.py", [str(workdir), *args], timeout=60)
            assert report == {"started_at": 0, "steps": TOTAL_STEPS}
            runs[tuple(args)] = consumed(workdir)
        return runs[tuple(args)]

    return steps


@pytest.mark.parametrize("kill_at", KILL_AT)
@pytest.mark.parametrize(("backend", "workers"), [("thread", 0), ("background", 2)])
def test_sigkill_then_resume_equals_one_uninterrupted_run(
    tmp_path: Path,
    uninterrupted: Callable[[list[str]], list[str]],
    backend: str,
    workers: int,
    kill_at: int,
) -> None:
    args = [backend, str(workers), str(EVERY)]
    reference = uninterrupted(args)
    workdir = tmp_path / "preempted"
    workdir.mkdir()
    kill_after(workdir, args, kill_at)
    first = consumed(workdir)
    assert (workdir / "state.pt").exists()

    report = scenario_report("preempt.py", [str(workdir), *args], timeout=60)
    saved = report["started_at"]
    assert report["steps"] == TOTAL_STEPS
    # The last save: at the last multiple of EVERY, or the one before if the kill fell
    # between logging that step and saving.
    assert saved % EVERY == 0, saved
    assert len(first) - EVERY <= saved <= len(first), (kill_at, len(first), saved)
    second = consumed(workdir)[len(first) :]
    # The first job's steps after its last save are lost work that the second redoes:
    # exactly those batches, in the same order, and then the rest of the run.
    assert first == reference[: len(first)], kill_at
    assert first[:saved] + second == reference, kill_at
    assert second[: len(first) - saved] == first[saved:], kill_at


def test_the_documented_example_resumes(tmp_path: Path) -> None:
    example = str(Path(__file__).resolve().parents[1] / "examples" / "resume" / "train.py")
    stopped = subprocess.run(
        [*scenario_command(example), str(tmp_path), "170"],
        env=scenario_env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert stopped.stdout == ""
    finished = subprocess.run(
        [*scenario_command(example), str(tmp_path)],
        env=scenario_env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    # 128 steps per epoch, 3 epochs; the last save before the stop was at step 150.
    assert finished.stdout.splitlines() == ["resumed at epoch 1, step 150", "done: 384 steps"]
