"""``DataLoader``'s workers made elsewhere than in worker processes: the ``worker_method``
and ``worker_options`` arguments, the worker-method registry, the pool contract and the
worker core every pool runs, the worker threads, the schedule of an epoch's tasks, and the
iterator that keeps the worker contract over them. A new worker method is a
:class:`WorkerPool` (``docs/writing-a-worker-method.md``)."""

from dataloaderx.workers.contract import KeptWorkers, Outcome, Result, WorkerPool, WorkerSetup
from dataloaderx.workers.core import WorkerCore, WorkerKind

__all__ = [
    "KeptWorkers",
    "Outcome",
    "Result",
    "WorkerCore",
    "WorkerKind",
    "WorkerPool",
    "WorkerSetup",
]
