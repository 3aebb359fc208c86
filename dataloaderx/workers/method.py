"""The ``worker_method`` argument: which kind of worker makes the batches; its checks."""

from __future__ import annotations

import inspect
from typing import Any, Final, Literal

from torch.utils.data import DataLoader
from torch.utils.data.datapipes.datapipe import IterDataPipe, MapDataPipe

from dataloaderx.util.suggest import did_you_mean, quoted

__all__ = [
    "MULTIPROCESSING",
    "THREAD",
    "WORKER_METHODS",
    "WorkerMethod",
    "check_worker_method",
    "dataloader_takes_worker_method",
]

#: The names PyTorch's ``WorkerInfo.worker_method`` uses.
MULTIPROCESSING: Final = "multiprocessing"
THREAD: Final = "thread"
WORKER_METHODS: Final = (MULTIPROCESSING, THREAD)
WorkerMethod = Literal["multiprocessing", "thread"]


def dataloader_takes_worker_method(loader_class: type[Any] = DataLoader) -> bool:
    """Whether this torch's ``DataLoader`` has a ``worker_method`` argument of its own."""
    return "worker_method" in inspect.signature(loader_class.__init__).parameters


def check_worker_method(
    worker_method: object, *, num_workers: int, dataset: object, multiprocessing_context: Any
) -> WorkerMethod:
    """Return ``worker_method`` if it is valid with the other arguments, else raise.

    With ``"thread"`` and workers, ``multiprocessing_context`` is an error (no process
    starts, so a start method would be silently ignored), and so is a datapipe dataset
    (each worker would shard the one graph all the threads share). Without workers,
    ``DataLoader``'s own checks apply.
    """
    if not isinstance(worker_method, str):
        raise TypeError(
            f"worker_method must be one of {quoted(WORKER_METHODS)}, "
            f"got {worker_method!r} ({type(worker_method).__name__})"
        )
    if worker_method not in WORKER_METHODS:
        raise ValueError(
            f"worker_method must be one of {quoted(WORKER_METHODS)}, got {worker_method!r}"
            f"{did_you_mean(worker_method, WORKER_METHODS)}"
        )
    threads = worker_method == THREAD and isinstance(num_workers, int) and num_workers > 0
    if threads and multiprocessing_context is not None:
        raise ValueError(
            f"multiprocessing_context={multiprocessing_context!r} does not apply to "
            "worker_method='thread': worker threads start no process. Remove "
            "multiprocessing_context, or use worker_method='multiprocessing'"
        )
    if threads and isinstance(dataset, (IterDataPipe, MapDataPipe)):
        raise ValueError(
            f"worker_method='thread' cannot shard the datapipe {type(dataset).__name__}: "
            "all worker threads share one graph, which each worker process would shard "
            "for itself; use worker_method='multiprocessing'"
        )
    return THREAD if worker_method == THREAD else MULTIPROCESSING
