"""Where Ray workers run: the Ray this process is connected to, or a local one started here;
and the reservation of the actors' resources, which fails clearly on a cluster too small.

A Ray already initialised (``ray.init(address=...)``, a Ray Train worker) is used as it is;
so is the cluster ``RAY_ADDRESS`` names. Otherwise a local Ray starts, listening on the
loopback address only and without a dashboard, once per process, with a warning; it is shut
down at exit. A Ray this module did not start is never shut down.
"""

from __future__ import annotations

import atexit
import gc
import os
import threading
import time
import warnings
from typing import Any

import ray
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group

from dataloaderx.engine.stream import POLL_SECONDS
from dataloaderx.workers.ray.options import RayOptions

__all__ = ["connect", "release", "reserve", "wait_reserved"]

_lock = threading.Lock()
#: How long a reservation waits before collecting garbage once (dropped loaders' actors).
_COLLECT_AFTER_SECONDS = 1.0


def _shutdown() -> None:
    if ray.is_initialized():
        ray.shutdown()


def connect() -> None:
    """Connect to Ray (the one initialised, ``RAY_ADDRESS``'s, or a new local one)."""
    with _lock:
        if ray.is_initialized():
            return
        if os.environ.get("RAY_ADDRESS"):
            ray.init()
            return
        # "local": a new Ray, not one a `ray start` left running on this machine.
        ray.init(address="local", _node_ip_address="127.0.0.1", include_dashboard=False)
        atexit.register(_shutdown)
    warnings.warn(
        "dataloaderx: worker_method='ray' started a local Ray (loopback only, no dashboard), "
        "which is shut down at exit; call ray.init(address=...) before iterating to use a "
        "Ray cluster",
        RuntimeWarning,
        stacklevel=2,
    )


def reserve(options: RayOptions, num_workers: int) -> PlacementGroup | None:
    """A placement group of one bundle per worker, asked for (:func:`wait_reserved` waits
    for it); ``None`` where the actors reserve nothing or the user's strategy places them."""
    bundle = options.bundle()
    if not bundle or not isinstance(options.scheduling_strategy, str):
        return None
    strategy = "SPREAD" if options.scheduling_strategy == "SPREAD" else "PACK"
    group: PlacementGroup = placement_group(
        [dict(bundle) for _ in range(num_workers)], strategy=strategy
    )
    return group


def wait_reserved(group: PlacementGroup | None, options: RayOptions, num_workers: int) -> None:
    """Wait until ``group`` (``None``: nothing to wait for) is placed. Raise
    ``RuntimeError`` after ``options.placement_timeout_s`` when the cluster cannot hold its
    bundles (the caller removes the group, with the actors it placed there)."""
    if group is None:
        return
    start = time.monotonic()
    deadline = start + options.placement_timeout_s
    ready = group.ready()
    collected = False
    while not ray.wait([ready], timeout=POLL_SECONDS * 4)[0]:
        if not collected and time.monotonic() - start >= _COLLECT_AFTER_SECONDS:
            # Loaders dropped in a reference cycle hold their reservations until collected.
            collected = True
            gc.collect()
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
    if group is None or not ray.is_initialized():
        return
    try:
        remove_placement_group(group)
    except Exception:  # noqa: BLE001 - a cluster gone has no group left to remove
        return


def _named(resources: dict[str, Any]) -> dict[str, Any]:
    """``resources`` without Ray's per-node and per-placement-group entries."""
    return {
        name: amount
        for name, amount in resources.items()
        if not name.startswith("node:") and "_group_" not in name
    }
