"""The Ray cluster ``bench --tune`` weighs Ray workers on: whether it does, and the
cluster's CPUs and alive nodes beside this machine's."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass

from dataloaderx.bench.errors import BenchError
from dataloaderx.errors import WorkerMethodUnavailableError
from dataloaderx.workers.registry import RAY, pool_class

__all__ = ["RayCluster", "connect_cluster", "ray_reason"]


@dataclass(frozen=True)
class RayCluster:
    """The CPUs of a Ray cluster (``ray.cluster_resources()``) and its alive nodes, and the
    CPUs of this machine (``os.cpu_count()``)."""

    cpus: int
    nodes: int
    machine_cpus: int

    def describe(self) -> str:
        """``"Ray cluster: 8 CPUs on 3 nodes; this machine: 2 CPUs"``."""
        return (
            f"Ray cluster: {self.cpus} CPUs on {self.nodes} node{'s' * (self.nodes != 1)}; "
            f"this machine: {self.machine_cpus} CPUs"
        )

    def as_dict(self) -> dict[str, int]:
        """The same figures, for JSON."""
        return {"cpus": self.cpus, "nodes": self.nodes, "machine_cpus": self.machine_cpus}


def ray_reason(*, asked: bool) -> str | None:
    """Why ``--tune`` weighs Ray workers (``asked``: ``--worker-method ray``), or ``None``
    where it does not. Nothing is imported: a Ray initialised in this process was imported
    by whoever initialised it."""
    if asked:
        return "--worker-method ray"
    if os.environ.get("RAY_ADDRESS"):
        return "RAY_ADDRESS is set"
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        return "a Ray is initialised in this process"
    return None


def connect_cluster(reason: str) -> RayCluster:
    """Connect to Ray as a loader with Ray workers does (the Ray initialised,
    ``RAY_ADDRESS``'s, or a local one) and read its size; :class:`BenchError` where Ray is
    not installed or cannot be reached."""
    try:
        pool_class(RAY)
    except WorkerMethodUnavailableError as exc:
        raise BenchError(f"--tune weighs Ray workers ({reason}), but {exc}") from exc
    import ray

    from dataloaderx.workers.ray.cluster import connect

    try:
        connect()
    except Exception as exc:
        raise BenchError(
            f"--tune weighs Ray workers ({reason}), but connecting to Ray raised {exc!r}: "
            "check RAY_ADDRESS (unset it to leave Ray out) or the cluster"
        ) from exc
    cpus = ray.cluster_resources().get("CPU", 0)  # type: ignore[no-untyped-call]
    alive = [node for node in ray.nodes() if node.get("Alive")]  # type: ignore[no-untyped-call]
    return RayCluster(int(cpus), len(alive), os.cpu_count() or 1)
