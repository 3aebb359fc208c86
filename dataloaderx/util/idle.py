"""How much CPU time the cores this process may run on spent idle, where the system tells
it (Linux's ``/proc/stat``), and whether threads took turns on one core while others idled."""

from __future__ import annotations

import os
from typing import Final

_STAT: Final = "/proc/stat"


def _ticks_per_second() -> int:
    try:
        return os.sysconf("SC_CLK_TCK")
    except (AttributeError, ValueError, OSError):
        return 100


_TICKS: Final = _ticks_per_second()
#: The step in which :func:`idle_seconds` counts, in seconds.
TICK: Final = 1 / _TICKS
#: The cores' idle time, in cores' worth, that tells threads that took turns on one core
#: from threads whose cores other work took (:func:`took_turns`).
IDLE: Final = 0.5


def idle_seconds() -> float | None:
    """The CPU time the cores this process may run on spent idle (or waiting for I/O) since
    the machine started, in seconds; ``None`` where the system does not tell it."""
    try:
        with open(_STAT, "rb") as stat:
            lines = stat.read().splitlines()
    except OSError:
        return None
    try:
        allowed = {f"cpu{core}".encode() for core in os.sched_getaffinity(0)}
    except AttributeError:  # no affinity here: every core
        allowed = None
    ticks = 0
    found = False
    for line in lines:
        fields = line.split()
        if len(fields) < 6 or not fields[0].startswith(b"cpu") or fields[0] == b"cpu":
            continue
        if allowed is None or fields[0] in allowed:
            ticks += int(fields[4]) + int(fields[5])
            found = True
    return ticks / _TICKS if found else None


def took_turns(busy: float, idle: float | None, seconds: float, cores: tuple[float, float]) -> bool:
    """Whether threads that kept ``busy`` cores' worth busy took turns on one core with
    another free: ``busy`` is at least ``cores[0]`` and under ``cores[1]``, and the cores
    idled ``idle`` seconds (what :func:`idle_seconds` told; ``None``: not told) over
    ``seconds``, at least :data:`IDLE` cores' worth (which takes ten :data:`TICK` s to
    count in). Threads whose items hold the GIL (or a lock they share) do."""
    if idle is None or seconds < 10 * TICK:
        return False
    return cores[0] <= busy < cores[1] and idle / seconds >= IDLE
