"""The reaper (``dataloaderx/util/reaper.py``): what a process hands it ends once that
process has ended, killed or not, and nothing else."""

from __future__ import annotations

import glob
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import wait_for

#: A process that starts a tree of its own (a shell and its two sleeps, which a SIGHUP or
#: its parent's death does not end), files, and a process of its own that it does not
#: hand over; hands the tree and the files to the reaper, says so, then waits.
_SCRIPT = """
import os, subprocess, sys, time
from dataloaderx.util.reaper import reap_at_exit, reaper_pid

folder = sys.argv[1]
tree = subprocess.Popen(["sh", "-c", "trap '' HUP; sleep 300 & sleep 300"])
kept = subprocess.Popen(["sleep", "300"])
for number in range(3):
    open(os.path.join(folder, f"batch-{number}"), "w").close()
open(os.path.join(folder, "other"), "w").close()
time.sleep(0.5)  # the shell has started its sleeps
reap_at_exit(processes=[tree.pid], files=os.path.join(folder, "batch-*"))
print(tree.pid, kept.pid, reaper_pid(), flush=True)
if sys.argv[2] == "wait":
    time.sleep(300)
"""


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as file:
            return file.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _descendants(pid: int) -> list[int]:
    found, stack = [], [pid]
    while stack:
        for path in glob.glob(f"/proc/{stack.pop()}/task/*/children"):
            with open(path, encoding="ascii") as file:
                children = [int(child) for child in file.read().split()]
            found += children
            stack += children
    return found


@pytest.mark.parametrize("end", ["killed", "exits"])
def test_what_a_process_hands_the_reaper_ends_after_it(tmp_path: Path, end: str) -> None:
    process = subprocess.Popen(
        [sys.executable, "-c", _SCRIPT, str(tmp_path), "wait" if end == "killed" else "exit"],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    assert process.stdout is not None
    tree, kept, reaper = (int(pid) for pid in process.stdout.readline().split())
    sleeps = _descendants(tree)
    assert len(sleeps) == 2
    if end == "killed":
        os.kill(process.pid, signal.SIGKILL)
    process.wait(timeout=60)
    try:
        assert wait_for(lambda: not any(map(_alive, [tree, *sleeps])), within=20)
        assert wait_for(lambda: sorted(os.listdir(tmp_path)) == ["other"], within=20)
        assert _alive(kept)  # not handed over: left alone
        if end == "killed":  # done, after a few seconds' sweeps of the files
            assert wait_for(lambda: not _alive(reaper), within=20)
    finally:
        for pid in (tree, kept, *sleeps):
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
