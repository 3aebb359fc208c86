"""dataloaderx: a drop-in ``DataLoader`` that prefetches batches safely.

Change ``DataLoader(...)`` to ``DataLoaderX(...)``; pick a prefetch backend with
``backend=``, a config file or the ``DATALOADERX_BACKEND`` environment variable.
"""

from __future__ import annotations

from dataloaderx.contracts.backend import Backend, BatchStream
from dataloaderx.epoch.iterator import PrefetchIterator
from dataloaderx.errors import (
    BackendUnavailableError,
    ConfigError,
    ResumeStateError,
    UnknownBackendError,
    WorkerMethodUnavailableError,
)
from dataloaderx.loader import DataLoaderX
from dataloaderx.prefetching import Prefetched, SizedPrefetched, prefetch
from dataloaderx.registry import (
    available_backends,
    get_backend,
    register_backend,
    registered_backends,
)
from dataloaderx.workers.contract import WorkerPool

__all__ = [
    "Backend",
    "BackendUnavailableError",
    "BatchStream",
    "ConfigError",
    "DataLoaderX",
    "PrefetchIterator",
    "Prefetched",
    "ResumeStateError",
    "SizedPrefetched",
    "UnknownBackendError",
    "WorkerMethodUnavailableError",
    "WorkerPool",
    "__version__",
    "available_backends",
    "get_backend",
    "prefetch",
    "register_backend",
    "registered_backends",
]

__version__ = "0.1.0"
