"""The ``worker_method`` argument: which kind of worker makes the batches; its checks."""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any, Final, Literal, cast

from torch.utils.data import DataLoader
from torch.utils.data.datapipes.datapipe import IterDataPipe, MapDataPipe

from dataloaderx.util.suggest import did_you_mean, quoted
from dataloaderx.workers.registry import (
    MULTIPROCESSING,
    RAY,
    THREAD,
    is_worker_method,
    pool_class,
    worker_method_names,
)

__all__ = [
    "MULTIPROCESSING",
    "RAY",
    "THREAD",
    "WORKER_METHODS",
    "WorkerMethod",
    "check_worker_method",
    "check_worker_options",
    "dataloader_takes_worker_method",
]

#: The built-in worker methods (plugins add theirs: ``worker_method_names()``).
WORKER_METHODS: Final = (MULTIPROCESSING, THREAD, RAY)
#: The built-in worker methods' names (the type checkers' and LightningCLI's choices);
#: a plugin's name is accepted at run time too.
WorkerMethod = Literal["multiprocessing", "thread", "ray"]


def dataloader_takes_worker_method(loader_class: type[Any] = DataLoader) -> bool:
    """Whether this torch's ``DataLoader`` has a ``worker_method`` argument of its own."""
    return "worker_method" in inspect.signature(loader_class.__init__).parameters


def check_worker_method(
    worker_method: object, *, num_workers: int, dataset: object, multiprocessing_context: Any
) -> WorkerMethod:
    """Return ``worker_method`` if it is valid with the other arguments, else raise.

    With workers that are not processes, ``multiprocessing_context`` is an error (no
    process starts, so a start method would be silently ignored), and so is a datapipe
    dataset (each worker process would shard its own copy of the graph). Without workers,
    ``DataLoader``'s own checks apply.
    """
    if not isinstance(worker_method, str):
        raise TypeError(
            f"worker_method must be one of {quoted(worker_method_names())}, "
            f"got {worker_method!r} ({type(worker_method).__name__})"
        )
    if not is_worker_method(worker_method):
        names = worker_method_names()
        raise ValueError(
            f"worker_method must be one of {quoted(names)}, got {worker_method!r}"
            f"{did_you_mean(worker_method, names)}"
        )
    method = cast(WorkerMethod, worker_method)
    if worker_method == MULTIPROCESSING or not (isinstance(num_workers, int) and num_workers > 0):
        return method
    pool = pool_class(worker_method)
    pool.check_arguments(
        num_workers=num_workers, dataset=dataset, multiprocessing_context=multiprocessing_context
    )
    if isinstance(dataset, (IterDataPipe, MapDataPipe)):
        raise ValueError(
            f"worker_method={worker_method!r} cannot shard the datapipe "
            f"{type(dataset).__name__}: each worker process shards its own copy of the "
            "graph, which these workers do not have; use worker_method='multiprocessing'"
        )
    return method


def check_worker_options(
    worker_method: str, num_workers: int, worker_options: Mapping[str, Any] | None
) -> Mapping[str, Any]:
    """Return ``worker_options`` validated for ``worker_method`` (``{}`` for ``None``)."""
    options: Mapping[str, Any] = {} if worker_options is None else worker_options
    if not isinstance(options, Mapping):
        raise TypeError(
            f"worker_options must be a mapping such as {{'num_cpus': 1}} or None, "
            f"got {worker_options!r} ({type(worker_options).__name__})"
        )
    if worker_method == MULTIPROCESSING or not (isinstance(num_workers, int) and num_workers > 0):
        if options:
            raise ValueError(
                f"worker_options={dict(options)!r} needs workers that take options, and "
                f"worker_method={worker_method!r} with num_workers={num_workers!r} has none; "
                "remove worker_options, or use worker_method='ray' with num_workers > 0"
            )
        return options
    return pool_class(worker_method).check_options(options)
