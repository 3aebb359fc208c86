"""``WorkerCore``: the worker's side of the worker contract, run by every pool's workers.

A pool only carries tasks. In each of its workers (a thread, an actor's process, ...) it
makes one core, calls :meth:`WorkerCore.start_epoch` at each epoch's start and
:meth:`WorkerCore.run` for each task, and hands the outcome back. The core does what
``DataLoader``'s worker loop does: it sets ``get_worker_info()``, seeds a process's global
generators, calls ``worker_init_fn(id)``, makes the fetcher (an iterable dataset's
``iter()`` runs in the worker), latches a failed start and an exhausted iterable, and turns
each task into one :class:`~dataloaderx.workers.contract.Outcome`.
"""

from __future__ import annotations

import enum
import random
from collections.abc import Callable
from typing import Any

import torch
from torch._utils import ExceptionWrapper
from torch.utils.data._utils import worker as torch_worker
from torch.utils.data.dataloader import _DatasetKind

from dataloaderx.workers.contract import Outcome, WorkerSetup
from dataloaderx.workers.info import install, set_process_info, set_thread_info, worker_info

__all__ = ["WorkerCore", "WorkerKind"]


class WorkerKind(enum.Enum):
    """What a worker is, which decides where its ``get_worker_info()`` is set and whether
    its process's global generators are seeded."""

    #: A thread of the loop's process: the info is the thread's own; the process's
    #: generators are the loop's, left alone.
    THREAD = "thread"
    #: A process of its own whose batches travel in shared memory, as a worker process's:
    #: the info is torch's own global, so ``default_collate`` stacks into shared memory.
    SHARED_MEMORY_PROCESS = "shared memory process"
    #: A process of its own whose batches travel otherwise: the info is every thread's, but
    #: hidden from ``default_collate``, which then stacks in ordinary memory.
    PROCESS = "process"


def _seed_process(base_seed: int, worker_id: int) -> None:
    """Seed the process's global generators as a worker process seeds its own. Devices'
    generators too where the process has an accelerator; without one, ``torch.manual_seed``
    would only queue a seed for each kind of device (a stack trace each, about 0.1 ms in all:
    an elastic pool seeds before every batch)."""
    seed = base_seed + worker_id
    random.seed(seed)
    if torch.accelerator.is_available():
        torch.manual_seed(seed)
    else:
        torch.default_generator.manual_seed(seed)
    import numpy.random  # only processes seed numpy's global generator

    numpy.random.seed(torch_worker._generate_state(base_seed, worker_id))  # type: ignore[no-untyped-call]


class WorkerCore:
    """Worker ``worker_id`` of the setup ``load_setup()`` returns (called in the worker, at
    its first epoch: a setup that fails to load is that epoch's outcome, as in a worker
    process); ``where`` names it in errors (``"in DataLoader worker thread 0"``);
    ``finish`` turns each batch into what the pool hands over (pinning, packing), its
    errors being the batch's. Used by one thread at a time."""

    def __init__(
        self,
        load_setup: Callable[[], WorkerSetup],
        worker_id: int,
        *,
        kind: WorkerKind,
        method: str,
        where: str,
        finish: Callable[[Any], Any] | None = None,
    ) -> None:
        self._load_setup = load_setup
        self._setup: WorkerSetup | None = None
        self._id = worker_id
        self._kind = kind
        self._method = method
        self._where = where
        self._finish = finish
        self._fetcher: Any = None
        self._failure: ExceptionWrapper | None = None
        self._exhausted = False
        #: The ``WorkerInfo`` this worker's tasks see (``None`` until its first start).
        self.info: Any = None

    def start_epoch(self, base_seed: int, *, fresh: bool) -> None:
        """Make this epoch's fetcher; with ``fresh``, first start as a new worker does (its
        info, a process's generators seeded from ``base_seed``, ``worker_init_fn``)."""
        self._exhausted = False
        self._fetcher, self._failure = None, None
        try:
            if self._setup is None:
                self._setup = self._load_setup()
            setup = self._setup
            if fresh:
                self._install(
                    worker_info(setup.dataset, self._id, setup.num_workers, base_seed, self._method)
                )
                if self._kind is not WorkerKind.THREAD:
                    _seed_process(base_seed, self._id)
                if setup.init_fn is not None:
                    setup.init_fn(self._id)
            self._fetcher = _DatasetKind.create_fetcher(  # type: ignore[no-untyped-call]
                setup.dataset_kind,
                setup.dataset,
                setup.auto_collation,
                setup.collate_fn,
                setup.drop_last,
            )
        except Exception:  # noqa: BLE001 - the outcome of the epoch's tasks
            self._failure = self.wrapped()

    def seed_batch(self, seed: int) -> None:
        """The next task is a batch of an elastic pool, made in a process of its own: its
        ``get_worker_info()`` and the process's global generators are the batch's own,
        from ``seed``, whichever worker makes it (``docs/elastic-workers.md``)."""
        setup = self._setup
        if setup is None or self._kind is WorkerKind.THREAD:
            return  # a setup that did not load fails the batch anyway
        self._install(
            worker_info(
                setup.dataset, self._id, setup.num_workers, seed, self._method, batch_seed=seed
            )
        )
        _seed_process(seed, 0)

    def _install(self, info: Any) -> None:
        self.info = info
        if self._kind is WorkerKind.THREAD:
            set_thread_info(info)
            return
        install()
        if self._kind is WorkerKind.SHARED_MEMORY_PROCESS:
            torch_worker._worker_info = info
        else:
            set_process_info(info)

    def run(self, indices: Any, where: str | None = None) -> tuple[Outcome, Any]:
        """The outcome of the task that fetches ``indices`` (ignored by an iterable
        dataset), and its payload: the finished batch, the wrapped error (naming ``where``,
        by default this worker), the ``BaseException`` that ends the worker, or ``None``.
        A map-style task may run in another worker's thread for that worker."""
        if self._failure is not None:
            return Outcome.FAILED, self._failure
        if self._exhausted:
            return Outcome.EXHAUSTED, None
        try:
            data = self._fetcher.fetch(indices)
            if self._finish is not None:
                data = self._finish(data)
        except StopIteration:
            setup = self._setup
            if setup is not None and setup.dataset_kind == _DatasetKind.Iterable:
                self._exhausted = True
                return Outcome.EXHAUSTED, None
            return Outcome.FAILED, self.wrapped(where)
        except Exception:  # noqa: BLE001 - handed to the loop
            return Outcome.FAILED, self.wrapped(where)
        except BaseException as exc:  # noqa: BLE001 - the loop raises it
            return Outcome.FATAL, exc
        return Outcome.BATCH, data

    def wrapped(self, where: str | None = None) -> ExceptionWrapper:
        """The exception being handled, as a worker process hands it over (its type, and
        its traceback in the message, which names ``where``, by default this worker)."""
        return ExceptionWrapper(where=where or self._where)  # type: ignore[no-untyped-call]
