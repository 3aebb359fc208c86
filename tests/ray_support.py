"""What the Ray workers' tests share: the worker actors alive, where a loader's run, and a
check that a test leaves none of them (Ray's own processes and threads are Ray's)."""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from typing import Any

import ray

from dataloaderx.workers.ray.group import NAMESPACE
from tests.helpers import wait_for


def our_actors() -> list[str]:
    """The names of the worker actors alive in the cluster."""
    named = ray.util.list_named_actors(all_namespaces=True)
    return sorted(actor["name"] for actor in named if actor["namespace"] == NAMESPACE)


def our_threads(before: set[threading.Thread]) -> list[threading.Thread]:
    return [
        thread
        for thread in threading.enumerate()
        if thread not in before and thread.is_alive() and thread.name.startswith("dataloaderx")
    ]


def no_actors_or_threads_left() -> Iterator[None]:
    """The body of a fixture that fails a test which leaves a thread of this package or a
    worker actor alive."""
    before = set(threading.enumerate())
    yield
    gc.collect()
    clean = wait_for(lambda: not our_threads(before) and not our_actors(), within=30)
    assert clean, f"left: threads {our_threads(before)}, actors {our_actors()}"


def places(loader: Any = None) -> list[Any]:
    """Where the worker actors alive run, by worker id (a test's one loader's)."""
    names = [name for name in our_actors() if "-w" in name]
    handles = {
        int(name.rsplit("-w", 1)[1].split("-")[0]): ray.get_actor(name, NAMESPACE) for name in names
    }
    return [ray.get(handles[worker].place.remote()) for worker in sorted(handles)]
