"""What must not outlive this process, however it ends (``SIGKILL`` included): processes it
started that its death would leave running, and files it names by a pattern.

:func:`reap_at_exit` hands them to a reaper: a small Python (this file, run as a script,
standard library only) started once per process in a session of its own, so that a
terminal's Ctrl-C does not reach it. It holds the read end of a pipe whose write end only
this process (and its forked children) hold, and learns the process trees to end from it.
While this process lives, it notes every two seconds the descendants of those trees' roots
(with their start times, so that a reused process id is never hit). When the pipe closes,
this process and its forked children have ended: the reaper kills what it noted, removes
the files, sweeps the files again for a few seconds (a process ending meanwhile may still
write one), and exits.
"""

from __future__ import annotations

import contextlib
import glob
import os
import select
import signal
import subprocess
import sys
import threading
import time
from typing import IO

__all__ = ["child_processes", "reap_at_exit", "reaper_pid"]

#: How often the reaper notes the descendants of the trees it ends.
_NOTE_SECONDS = 2.0
#: How long after the end it sweeps the files again, and how often.
_SWEEP_SECONDS = 5.0
_SWEEP_EVERY = 0.5

_lock = threading.Lock()
#: The reaper's process and pipe, and the process that started them.
_reaper: subprocess.Popen[bytes] | None = None
_owner = 0


def reap_at_exit(*, processes: list[int] | None = None, files: str | None = None) -> None:
    """Once this process has ended, end the process trees rooted at ``processes`` and
    remove the files matching the glob pattern ``files``."""
    global _reaper, _owner
    lines = [f"tree {pid}" for pid in processes or ()]
    if files is not None:
        lines.append(f"files {files}")
    with _lock:
        if _reaper is None or _owner != os.getpid():  # a forked child has its own
            _reaper = subprocess.Popen(
                [sys.executable, "-I", "-S", os.path.abspath(__file__)],
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
            _owner = os.getpid()
        pipe: IO[bytes] | None = _reaper.stdin
        if pipe is not None:
            pipe.write("".join(f"{line}\n" for line in lines).encode())
            pipe.flush()


def reaper_pid() -> int | None:
    """The process id of this process's reaper, or ``None`` while it has none."""
    with _lock:
        return _reaper.pid if _reaper is not None and _owner == os.getpid() else None


def _started(pid: int) -> str | None:
    """When process ``pid`` started (field 22 of its ``stat``), or ``None``: it is gone."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as file:
            return file.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def child_processes(pid: int) -> list[int]:
    """The process ids of ``pid``'s children."""
    found: list[int] = []
    for task in glob.glob(f"/proc/{pid}/task/*/children"):
        with contextlib.suppress(OSError), open(task, encoding="ascii") as file:
            found += [int(child) for child in file.read().split()]
    return found


def _note(roots: list[int], noted: dict[int, str]) -> None:
    """Add the live processes of the trees rooted at ``roots`` to ``noted``."""
    stack = list(roots)
    while stack:
        pid = stack.pop()
        started = _started(pid)
        if started is not None:
            noted[pid] = started
            stack += child_processes(pid)


def _remove(patterns: list[str]) -> None:
    for pattern in patterns:
        for path in glob.glob(pattern):
            with contextlib.suppress(OSError):
                os.unlink(path)


def _main() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    roots: list[int] = []
    patterns: list[str] = []
    noted: dict[int, str] = {}
    pipe = sys.stdin.buffer.fileno()
    pending = b""
    while True:
        readable, _, _ = select.select([pipe], [], [], _NOTE_SECONDS)
        if readable:
            chunk = os.read(pipe, 65536)
            if not chunk:
                break
            *lines, pending = (pending + chunk).split(b"\n")
            for line in lines:
                kind, _, value = line.decode().partition(" ")
                if kind == "tree":
                    roots.append(int(value))
                elif kind == "files":
                    patterns.append(value)
        _note(roots, noted)
    for pid, started in noted.items():
        if _started(pid) == started:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + _SWEEP_SECONDS
    while True:
        _remove(patterns)
        if time.monotonic() >= deadline:
            return
        time.sleep(_SWEEP_EVERY)


if __name__ == "__main__":
    _main()
