"""The ``worker_method`` and ``worker_options`` arguments: which kind of worker makes the
batches, with which options; both checked and resolved once, into :class:`Workers`."""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal, cast

from torch.utils.data import DataLoader
from torch.utils.data.datapipes.datapipe import IterDataPipe, MapDataPipe

from dataloaderx.util.suggest import did_you_mean, quoted
from dataloaderx.workers.contract import WorkerPool
from dataloaderx.workers.elastic.bounds import AUTO, BOUND_KEYS, AutoWorkers, Bounds, elastic_bounds
from dataloaderx.workers.registry import (
    MULTIPROCESSING,
    RAY,
    THREAD,
    elastic_pool_class,
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
    "Workers",
    "dataloader_takes_worker_method",
    "resolve_workers",
]

#: The built-in worker methods (plugins add theirs: ``worker_method_names()``).
WORKER_METHODS: Final = (MULTIPROCESSING, THREAD, RAY)
#: The built-in worker methods' names (the type checkers' and LightningCLI's choices);
#: a plugin's name is accepted at run time too.
WorkerMethod = Literal["multiprocessing", "thread", "ray"]


def dataloader_takes_worker_method(loader_class: type[Any] = DataLoader) -> bool:
    """Whether this torch's ``DataLoader`` has a ``worker_method`` argument of its own."""
    return "worker_method" in inspect.signature(loader_class.__init__).parameters


@dataclass(frozen=True)
class Workers:
    """``worker_method`` and ``worker_options`` resolved once, when the loader is built."""

    method: WorkerMethod
    #: The pool that runs the workers; ``None`` where ``DataLoader`` runs its own (worker
    #: processes, and the worker threads of a torch that has them).
    pool: type[WorkerPool] | None
    #: ``pool.check_options``' result, given to each pool the loader starts.
    options: Any
    #: With ``num_workers="auto"``, where the pool's count stays; else ``None``.
    bounds: Bounds | None = None

    def counts_as_cores(self) -> bool:
        """Whether ``num_workers`` beyond this machine's cores deserves ``DataLoader``'s
        warning."""
        return self.method == MULTIPROCESSING or (
            self.pool is not None and self.pool.counts_as_cores()
        )


def resolve_workers(
    worker_method: object,
    worker_options: object,
    *,
    num_workers: int | str,
    dataset: object,
    multiprocessing_context: Any,
) -> Workers:
    """The :class:`Workers` of these loader arguments; raise, naming the argument and the
    fix, where they do not fit together.

    With workers that are not processes, ``multiprocessing_context`` is an error (no
    process starts, so a start method would be silently ignored), and so is a datapipe
    dataset (each worker process would shard its own copy of the graph). Without workers,
    ``DataLoader``'s own checks apply, and ``worker_options`` must be empty.
    """
    method = _checked_name(worker_method)
    options: Mapping[str, Any] = {} if worker_options is None else worker_options  # type: ignore[assignment]
    if not isinstance(options, Mapping):
        raise TypeError(
            f"worker_options must be a mapping such as {{'num_cpus': 1}} or None, "
            f"got {worker_options!r} ({type(worker_options).__name__})"
        )
    if num_workers == AUTO or isinstance(num_workers, AutoWorkers):
        return _elastic(method, options, dataset, multiprocessing_context)
    bounds = [key for key in BOUND_KEYS if key in options]
    if bounds:
        raise ValueError(
            f"worker_options {' and '.join(bounds)} bound num_workers='auto', and "
            f"num_workers={num_workers!r} is fixed; use num_workers='auto', or remove them"
        )
    with_workers = isinstance(num_workers, int) and num_workers > 0
    if options and (method == MULTIPROCESSING or not with_workers):
        raise ValueError(
            f"worker_options={dict(options)!r} needs workers that take options, and "
            f"worker_method={method!r} with num_workers={num_workers!r} has none; "
            "remove worker_options, or use worker_method='ray' with num_workers > 0"
        )
    if method == MULTIPROCESSING:
        return Workers(method, None, None)
    pool = pool_class(method)
    if isinstance(num_workers, int) and num_workers > 0:
        _check_arguments(pool, method, num_workers, dataset, multiprocessing_context)
    checked = pool.check_options(options)
    torch_runs = method == THREAD and dataloader_takes_worker_method()
    return Workers(method, None if torch_runs else pool, checked)


def _elastic(
    method: WorkerMethod, options: Mapping[str, Any], dataset: object, multiprocessing_context: Any
) -> Workers:
    """:func:`resolve_workers` for ``num_workers="auto"``."""
    pool = None if method == MULTIPROCESSING else elastic_pool_class(method)
    if pool is None:
        raise ValueError(
            f"num_workers='auto' sizes the workers of worker_method='thread' or 'ray' while "
            f"training runs, and worker_method={method!r} has no such workers; use "
            "worker_method='thread' or 'ray', or give num_workers an int"
        )
    checked = pool.check_options({k: v for k, v in options.items() if k not in BOUND_KEYS})
    bounds = elastic_bounds(options, most=pool.most_workers(checked) or 1, method=method)
    _check_arguments(pool, method, bounds.max_workers, dataset, multiprocessing_context)
    return Workers(method, pool, checked, bounds)


def _check_arguments(
    pool: type[WorkerPool],
    method: str,
    num_workers: int,
    dataset: object,
    multiprocessing_context: Any,
) -> None:
    pool.check_arguments(
        num_workers=num_workers, dataset=dataset, multiprocessing_context=multiprocessing_context
    )
    if isinstance(dataset, (IterDataPipe, MapDataPipe)):
        raise ValueError(
            f"worker_method={method!r} cannot shard the datapipe "
            f"{type(dataset).__name__}: each worker process shards its own copy of the "
            "graph, which these workers do not have; use worker_method='multiprocessing'"
        )


def _checked_name(worker_method: object) -> WorkerMethod:
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
    return cast(WorkerMethod, worker_method)
