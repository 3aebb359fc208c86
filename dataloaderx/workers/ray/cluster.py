"""Which Ray the workers use, the local one it starts, the actors' reservation, and the
gate every Ray call of this package passes (``docs/ray-workers.md``: "Where the workers
run", "Security").

A Ray already initialised, or ``RAY_ADDRESS``'s, is used as it is and never shut down.
Otherwise a local Ray starts once per process, its node's address the loopback address
(so that its servers listen there alone), token authentication on, no dashboard; it is
shut down at exit, and the reaper ends what is left of it once this process is killed.
Once Ray is shut down, or this process exits (before Ray's own shutdown), :func:`calls`
refuses with :class:`RayGone`: a Ray call then would start a new Ray.
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import ipaddress
import os
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import ray
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group

from dataloaderx.engine.stream import POLL_SECONDS
from dataloaderx.util.interrupts import interrupts_held
from dataloaderx.util.reaper import child_processes, reap_at_exit
from dataloaderx.workers.ray.options import RayOptions

__all__ = [
    "RayGone",
    "answers",
    "calls",
    "connect",
    "release",
    "reserve",
    "session",
    "wait_reserved",
]

_lock = threading.Lock()
#: Ray calls under way, and whether this process exits; guarded by ``_calls``.
_calls = threading.Condition(threading.Lock())
_running = 0
_exiting = False
#: The :func:`session` of the local Ray this module started, if any.
_started: tuple[str, str] | None = None


class RayGone(RuntimeError):
    """Ray was shut down (or this process exits) while Ray workers had work to do."""


def session() -> tuple[str, str]:
    """What tells one ``ray.init`` of this process from another: its job and node."""
    context = ray.get_runtime_context()
    return context.get_job_id(), context.get_node_id()


@contextlib.contextmanager
def calls() -> Iterator[None]:
    """Around Ray calls; raises :class:`RayGone` instead where they would start a new Ray."""
    global _running
    with _calls:
        if _exiting or not ray.is_initialized():
            raise RayGone(
                "Ray was shut down while DataLoader workers (worker_method='ray') had "
                "batches to make; shut Ray down after the loop is done with the loader"
            )
        _running += 1
    try:
        yield
    finally:
        with _calls:
            _running -= 1
            _calls.notify_all()


def _at_exit() -> None:
    global _exiting
    with _calls:
        _exiting = True
        _calls.wait_for(lambda: not _running, timeout=POLL_SECONDS * 10)
    with _lock:
        if _started is not None and ray.is_initialized() and session() == _started:
            ray.shutdown()


def connect(*, without_authentication: bool = False) -> bool:
    """Connect to Ray (the one initialised, ``RAY_ADDRESS``'s, or a new local one); whether
    it is the local one this module started."""
    with _lock:
        if not ray.is_initialized():
            if os.environ.get("RAY_ADDRESS"):
                ray.init()
            else:
                _start_local(without_authentication)
        atexit.unregister(_at_exit)  # again after every ray.init: to run before Ray's own
        atexit.register(_at_exit)
        return session() == _started


def _start_local(without_authentication: bool) -> None:
    global _started
    mode = os.environ.get("RAY_AUTH_MODE")
    if mode is not None and mode.lower() != "token" and not without_authentication:
        raise RuntimeError(
            f"worker_method='ray' would start a local Ray without authentication "
            f"(RAY_AUTH_MODE={mode!r}): any process that reaches its ports could run code "
            "as you. Unset RAY_AUTH_MODE (the loader then turns token authentication on), "
            "or pass worker_options={'start_local_ray_without_authentication': True}"
        )
    if mode is None:
        os.environ["RAY_AUTH_MODE"] = "token"
        from ray._raylet import Config  # type: ignore[attr-defined]  # read the mode again

        Config.initialize("")
    # Ray's own setting for macOS and Windows: the node's address is then the loopback one.
    constants = ray._private.ray_constants
    clusters, constants.ENABLE_RAY_CLUSTER = constants.ENABLE_RAY_CLUSTER, False
    before = set(child_processes(os.getpid()))
    try:
        with interrupts_held():  # Ray's start, cut short, crashes the process at exit
            ray.init(address="local", include_dashboard=False)
        _started = session()
    finally:  # an interrupted start leaves processes too
        constants.ENABLE_RAY_CLUSTER = clusters
        reap_at_exit(processes=sorted(set(child_processes(os.getpid())) - before))
    address = ray.util.get_node_ip_address()  # type: ignore[no-untyped-call]
    where = "the loopback address only" if ipaddress.ip_address(address).is_loopback else address
    access = (
        "token authentication on"
        if os.environ.get("RAY_AUTH_MODE", "").lower() == "token"
        else "WITHOUT authentication: whoever reaches it can run code in it"
    )
    warnings.warn(
        f"dataloaderx: worker_method='ray' started a local Ray (listening on {where}, "
        f"{access}, no dashboard), which is shut down at exit; call ray.init(address=...) "
        "before iterating to use a Ray cluster",
        RuntimeWarning,
        stacklevel=4,
    )


def answers(timeout: float) -> bool:
    """Whether the cluster's GCS answers within ``timeout`` seconds (a call that changes
    nothing); ``True`` where this process cannot ask it directly (a Ray Client)."""
    try:
        client = ray._private.worker.global_worker.gcs_client  # type: ignore[attr-defined]
    except Exception:  # noqa: BLE001 - not a driver of its own
        return True
    try:
        client.check_alive([], timeout=timeout)
    except Exception:  # noqa: BLE001 - no answer in time, whatever the reason
        return False
    return True


def reserve(options: RayOptions, num_workers: int) -> PlacementGroup | None:
    """A placement group of one bundle per worker, asked for; ``None`` where the actors
    reserve nothing or the user's strategy places them."""
    bundle = options.bundle()
    if not bundle or not isinstance(options.scheduling_strategy, str):
        return None
    strategy = "SPREAD" if options.scheduling_strategy == "SPREAD" else "PACK"
    group: PlacementGroup = placement_group(
        [dict(bundle) for _ in range(num_workers)], strategy=strategy
    )
    return group


def wait_reserved(
    group: PlacementGroup | None,
    options: RayOptions,
    num_workers: int,
    make_room: Callable[[], object],
) -> None:
    """Wait until ``group`` (``None``: nothing to wait for) is placed, calling
    ``make_room()`` each second it is not; raise ``RuntimeError`` after
    ``options.placement_timeout_s``."""
    if group is None:
        return
    deadline = time.monotonic() + options.placement_timeout_s
    ready = group.ready()
    room_at = time.monotonic() + 1.0
    while not ray.wait([ready], timeout=POLL_SECONDS * 4)[0]:
        if time.monotonic() >= room_at:
            room_at = time.monotonic() + 1.0
            gc.collect()  # loaders dropped in a reference cycle hold their reservations
            make_room()
        if time.monotonic() >= deadline:
            raise RuntimeError(
                f"num_workers={num_workers} Ray workers, each reserving {options.bundle()}, "
                f"did not fit the Ray cluster within worker_options['placement_timeout_s']="
                f"{options.placement_timeout_s!r} s (the cluster has "
                f"{_named(ray.cluster_resources())} in all, "  # type: ignore[no-untyped-call]
                f"{_named(ray.available_resources())} free); lower num_workers or "  # type: ignore[no-untyped-call]
                "worker_options' num_cpus / memory / resources, or add nodes to the cluster"
            )


def release(group: PlacementGroup | None) -> None:
    """Remove ``group`` (``None``: nothing to do), as far as Ray is still there to ask."""
    if group is not None:
        with contextlib.suppress(Exception):  # a cluster gone has no group left to remove
            remove_placement_group(group)


def _named(resources: dict[str, Any]) -> dict[str, Any]:
    """``resources`` without Ray's per-node and per-placement-group entries."""
    return {
        name: amount
        for name, amount in resources.items()
        if not name.startswith("node:") and "_group_" not in name
    }
