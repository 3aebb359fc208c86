"""The worker methods: built-ins and entry-point plugins, by ``worker_method`` name.

``"multiprocessing"`` is ``DataLoader``'s own worker processes (no pool here). The others
are :class:`~dataloaderx.workers.contract.WorkerPool` classes, listed as ``"module:Class"``
strings and imported on first use, so that ``import dataloaderx`` imports no Ray. Plugins
declare ``name = "package.module:Class"`` in the entry-point group
``dataloaderx.worker_methods``, read on the first lookup of a name that is not built in (or
on the first listing); built-in names win clashes.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import threading
from typing import Final, NoReturn

from dataloaderx.errors import WorkerMethodUnavailableError
from dataloaderx.util.plugins import entry_points, subclass_or_none
from dataloaderx.workers.contract import WorkerPool

__all__ = [
    "ENTRY_POINT_GROUP",
    "MULTIPROCESSING",
    "RAY",
    "THREAD",
    "elastic_pool_class",
    "is_worker_method",
    "pool_class",
    "worker_method_names",
]

ENTRY_POINT_GROUP: Final = "dataloaderx.worker_methods"
MULTIPROCESSING: Final = "multiprocessing"
THREAD: Final = "thread"
RAY: Final = "ray"

#: Built-in pools: ``"module:Class"``, and the extra that installs what they import.
_BUILTINS: Final[dict[str, tuple[str, str | None]]] = {
    THREAD: ("dataloaderx.workers.pool:WorkerThreads", None),
    RAY: ("dataloaderx.workers.ray.pool:RayWorkers", "ray"),
}
#: Built-in pools for ``num_workers="auto"``, by the worker method they size.
_ELASTIC: Final[dict[str, str]] = {
    THREAD: "dataloaderx.workers.elastic.threads:ElasticThreads",
    RAY: "dataloaderx.workers.ray.elastic:ElasticRay",
}


_lock = threading.Lock()
_entries: dict[str, tuple[importlib.metadata.EntryPoint, str | None]] = {
    name: (importlib.metadata.EntryPoint(name, target, ENTRY_POINT_GROUP), extra)
    for name, (target, extra) in _BUILTINS.items()
}
_loaded: dict[str, type[WorkerPool]] = {}
_scanned = False


def _scan_plugins(name: str | None = None) -> None:
    """Read the plugins once; not for ``name`` if it is built in (a plugin cannot take it)."""
    global _scanned
    with _lock:
        if _scanned or name in _entries:
            return
        _scanned = True
        for entry_point in entry_points(ENTRY_POINT_GROUP):
            if entry_point.name not in _entries and entry_point.name != MULTIPROCESSING:
                _entries[entry_point.name] = (entry_point, None)


def worker_method_names() -> tuple[str, ...]:
    """Every valid ``worker_method``: ``"multiprocessing"``, the built-ins, the plugins."""
    _scan_plugins()
    with _lock:
        return (MULTIPROCESSING, *_entries)


def is_worker_method(name: str) -> bool:
    """Whether ``name`` is a valid ``worker_method`` (the plugins are read only for a name
    that is not built in)."""
    if name == MULTIPROCESSING:
        return True
    _scan_plugins(name)
    with _lock:
        return name in _entries


def _not_a_pool(name: str, target: str, loaded: object) -> NoReturn:
    raise WorkerMethodUnavailableError(
        f"worker_method={name!r} points at {target!r}, which is {loaded!r}, "
        "not a dataloaderx.workers.contract.WorkerPool subclass"
    )


def pool_class(name: str) -> type[WorkerPool]:
    """The pool class of worker method ``name`` (a name :func:`worker_method_names` lists,
    other than ``"multiprocessing"``); raise :class:`WorkerMethodUnavailableError` if it
    cannot be imported, naming what to install."""
    _scan_plugins(name)
    with _lock:
        if name in _loaded:
            return _loaded[name]
        entry_point, extra = _entries[name]
    try:
        loaded = entry_point.load()
    except ImportError as exc:
        fix = (
            f"pip install 'dataloaderx[{extra}]'"
            if extra is not None
            else f"fix or uninstall the plugin that provides {entry_point.value!r}"
        )
        raise WorkerMethodUnavailableError(
            f"worker_method={name!r} needs {exc.name or entry_point.value!r}, which could not "
            f"be imported ({exc}); {fix}, or use worker_method='multiprocessing'"
        ) from exc
    pool: type[WorkerPool] = subclass_or_none(loaded, WorkerPool) or _not_a_pool(
        name, entry_point.value, loaded
    )
    pool.name = name
    with _lock:
        _loaded[name] = pool
    return pool


def elastic_pool_class(name: str) -> type[WorkerPool] | None:
    """The pool class of worker method ``name`` with ``num_workers="auto"``, or ``None``
    where the method has none (a plugin's, ``"multiprocessing"``)."""
    target = _ELASTIC.get(name)
    if target is None:
        return None
    pool_class(name)  # raises, naming what to install, where the method cannot be imported
    module, _, attribute = target.partition(":")
    pool: type[WorkerPool] = getattr(importlib.import_module(module), attribute)
    pool.name = name
    return pool
