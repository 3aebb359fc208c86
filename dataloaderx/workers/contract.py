"""What a worker method implements: :class:`WorkerPool`, the tasks' :class:`Result` and the
:class:`WorkerSetup` every worker makes its fetcher from.

A pool carries an epoch's tasks to ``num_workers`` workers (threads in this process, actors
on a cluster, ...), each of which runs a :class:`~dataloaderx.workers.core.WorkerCore`;
:class:`~dataloaderx.workers.iterator.WorkersIterator` keeps the order, the timeouts and
the errors. A new worker method is one pool class, registered in
:mod:`dataloaderx.workers.registry` (``docs/writing-a-worker-method.md``). Optional
capabilities are methods with defaults here.
"""

from __future__ import annotations

import abc
import enum
import threading
import time
import weakref
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

from dataloaderx.engine.stream import POLL_SECONDS
from dataloaderx.engine.timer import OneTimer

__all__ = ["KeptWorkers", "Outcome", "Result", "WorkerPool", "WorkerSetup"]


class Outcome(enum.Enum):
    """What a task gave."""

    BATCH = "batch"
    #: The batch's ``Exception``, wrapped as a worker process wraps it.
    FAILED = "failed"
    #: The worker's iterable dataset has no more batches this epoch.
    EXHAUSTED = "exhausted"
    #: A ``BaseException`` that is not an ``Exception`` ended the worker.
    FATAL = "fatal"


class Result(NamedTuple):
    """A task's outcome, as the loop receives it."""

    epoch: int
    task: int
    worker: int
    outcome: Outcome
    payload: Any


class WorkerSetup(NamedTuple):
    """What every worker makes its fetcher from: the loader's arguments."""

    dataset_kind: int
    dataset: Any
    auto_collation: bool
    collate_fn: Callable[[Any], Any]
    drop_last: bool
    init_fn: Callable[[int], None] | None
    num_workers: int
    base_seed: int
    #: The accelerator type to pin batches for and the device to pin them on, or ``None``.
    pin: tuple[str, int] | None


#: Every loader's :class:`KeptWorkers`, for :meth:`KeptWorkers.make_room`.
_every_kept: weakref.WeakSet[KeptWorkers] = weakref.WeakSet()
_every_lock = threading.Lock()


class KeptWorkers:
    """What a loader keeps of its workers between epochs (for a pool that keeps any), and
    releases when the loader is collected; thread-safe.

    A pool :meth:`take` s the workers kept (or starts its own), and gives them back with
    :meth:`keep` when it closes. While another pool still has them, :meth:`take` waits a
    little: the previous epoch of a loop that left it early is closing. Workers kept idle
    give way to another loader's new ones that do not fit beside them (:meth:`make_room`),
    and may be trimmed after a while (:meth:`expire`).
    """

    def __init__(self) -> None:
        self._changed = threading.Condition(threading.Lock())
        self._kept: Any = None
        self._release: Callable[[Any], None] | None = None
        #: When the workers kept were given back.
        self._kept_at = 0.0
        #: Pools that took (or started) workers and have not given them back.
        self._out = 0
        self._closed = False
        #: The action of :meth:`expire`, while one is due.
        self._expiry = OneTimer("kept")
        with _every_lock:
            _every_kept.add(self)

    def __reduce__(self) -> tuple[type[KeptWorkers], tuple[()]]:
        # A copy of the loader (pickled, deep-copied) starts its own workers.
        return KeptWorkers, ()

    def take(self, timeout: float) -> Any:
        """The workers kept (``None``: none, start new ones); waits up to ``timeout``
        seconds for those another pool has. Every ``take`` is answered by :meth:`keep`."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while self._kept is None and self._out and not self._closed:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._changed.wait(min(left, POLL_SECONDS))
            self._out += 1
            self._expiry.cancel()
            kept, self._kept, self._release = self._kept, None, None
            return kept

    def keep(self, workers: Any, release: Callable[[Any], None]) -> bool:
        """Give back ``workers`` (``None``: none) to be kept for the next epoch, released with
        ``release``; ``False`` (not kept) once the loader is gone, or while others are."""
        with self._changed:
            self._out -= 1
            self._changed.notify_all()
            if workers is None or self._closed or self._kept is not None:
                return False
            self._kept, self._release = workers, release
            self._kept_at = time.monotonic()
            return True

    def expire(self, workers: Any, after: float, action: Callable[[Any], None]) -> bool:
        """Run ``action(workers)`` in a timer thread ``after`` seconds from now, where
        ``workers`` are still the ones kept then (no pool taking them meanwhile); whether it
        is due. A :meth:`take`, a release or another :meth:`expire` cancels it first."""
        with self._changed:
            if workers is None or self._kept is not workers:
                return False
            self._expiry.start(after, self._expired, workers, action)
            return True

    def _expired(self, workers: Any, action: Callable[[Any], None]) -> None:
        with self._changed:
            if self._expiry.claim() and self._kept is workers:
                action(workers)

    def make_room(self) -> bool:
        """Release the workers another loader keeps idle (the longest idle first), so that
        new workers of this loader fit; whether any were released."""
        with _every_lock:
            others = [kept for kept in _every_kept if kept is not self]
        idle = [(since, kept) for kept in others if (since := kept._idle_since()) is not None]
        for _, kept in sorted(idle, key=lambda pair: pair[0]):
            if kept._release_kept(closing=False):
                return True
        return False

    def _idle_since(self) -> float | None:
        with self._changed:
            return None if self._kept is None else self._kept_at

    def _release_kept(self, *, closing: bool) -> bool:
        with self._changed:
            self._closed = self._closed or closing
            self._expiry.cancel()
            kept, release = self._kept, self._release
            self._kept = self._release = None
            self._changed.notify_all()
        if release is None:
            return False
        release(kept)
        return True

    def close(self) -> None:
        """Release the workers kept, and keep none from now on."""
        self._release_kept(closing=True)


class WorkerPool(abc.ABC):
    """``setup.num_workers`` workers running tasks for one loader's iterator.

    :meth:`send` queues a task for a worker; :meth:`receive` returns the next
    :class:`Result` (tasks of one worker are run in the order sent); :meth:`new_epoch`
    starts the next epoch of a persistent iterator; :meth:`close` stops everything.
    """

    #: The ``worker_method`` name; set by the registry.
    name: str = ""

    def __init__(
        self,
        setup: WorkerSetup,
        name: str,
        options: Any = None,
        kept: KeptWorkers | None = None,
        *,
        workers: int | None = None,
    ) -> None:
        """Start the workers; ``options`` is :meth:`check_options`' result, ``kept`` is
        where the loader keeps workers between its epochs, and ``workers`` how many an
        elastic pool starts with (``setup.num_workers`` is then the most it runs)."""
        self._setup = setup
        self._options = options
        self._kept = KeptWorkers() if kept is None else kept
        self._workers = setup.num_workers if workers is None else workers
        self._start(name)

    @abc.abstractmethod
    def _start(self, name: str) -> None:
        """Start ``self._setup.num_workers`` workers (threads named after ``name``, ...)."""

    @classmethod
    def check_arguments(
        cls, *, num_workers: int, dataset: object, multiprocessing_context: Any
    ) -> None:
        """Raise ``ValueError`` for loader arguments this method cannot honour; by default
        a ``multiprocessing_context``, since no process of ``multiprocessing`` starts."""
        if num_workers > 0 and multiprocessing_context is not None:
            raise ValueError(
                f"multiprocessing_context={multiprocessing_context!r} does not apply to "
                f"worker_method={cls.name!r}, which starts no process of multiprocessing. "
                "Remove multiprocessing_context, or use worker_method='multiprocessing'"
            )

    @classmethod
    def check_options(cls, options: Mapping[str, Any]) -> Any:
        """Check ``worker_options`` (once, when the loader is built) and return what each
        pool is given as ``options``; raise ``ValueError`` naming a bad key or value. By
        default there are no options to give."""
        if options:
            raise ValueError(
                f"worker_options={dict(options)!r} does not apply to worker_method="
                f"{cls.name!r}, which takes no options; remove worker_options"
            )
        return None

    @classmethod
    def counts_as_cores(cls) -> bool:
        """Whether ``num_workers`` beyond this machine's cores deserves ``DataLoader``'s
        warning (workers that compete for them); by default not."""
        return False

    @classmethod
    def most_workers(cls, options: Any) -> int | None:
        """For an elastic pool (``num_workers="auto"``), the most workers it runs where
        ``worker_options`` does not bound them, given :meth:`check_options`' result;
        ``None`` (the default): not elastic."""
        return None

    def scheduled_workers(self) -> int:
        """How many workers this epoch's tasks go to (worker ids ``0..n-1``); by default
        ``setup.num_workers``."""
        return self._setup.num_workers

    def resize(self, workers: int) -> int:
        """Run ``workers`` workers from now on, where the pool is elastic; how many workers
        take tasks now. By default the pool keeps its count."""
        return self._workers

    def resizing(self) -> bool:
        """Whether the count asked of an elastic pool is not yet the one it runs (workers
        starting or leaving, or an iterable dataset's new count waiting for the next
        epoch): the loader does not measure its rate meanwhile. By default not."""
        return False

    def cpu_share(self) -> float | None:
        """The share of their time an elastic pool's first batches spent on the CPU in their
        workers' own threads, once measured: the loader sizes the pool from it once. By
        default not measured (``None``)."""
        return None

    def cpu_seconds(self) -> float | None:
        """The CPU time an elastic pool's workers spent on batches so far, where they are
        threads of this process (which take turns at its GIL): the loader tells from it
        whether they took turns on one core. By default not measured (``None``)."""
        return None

    def set_origin(self, epoch: int, first_batch: int) -> None:  # noqa: B027 - a default
        """The epoch about to start is the loader's ``epoch``, resumed after ``first_batch``
        batches: an elastic pool seeds each batch from them. By default nothing."""

    def idle(self, keep: int, ended: Callable[[int, str], None]) -> None:  # noqa: B027
        """The epoch's tasks are all handed out (or it was left): until the next epoch, an
        elastic pool may end all but ``keep`` workers, telling ``ended`` how many run then
        and why. By default nothing."""

    @abc.abstractmethod
    def send(self, worker: int, task: int, indices: Any) -> None:
        """Queue task number ``task`` (the batch of ``indices``) for ``worker``."""

    @abc.abstractmethod
    def new_epoch(self) -> int:
        """Start a new epoch (each worker makes a new fetcher); return its number."""

    @abc.abstractmethod
    def receive(self, timeout: float) -> Result | None:
        """The next result, waiting up to ``timeout`` seconds (``None``: none came)."""

    def ended(self) -> list[int]:
        """The workers that ended and will answer no more tasks; by default none (a pool
        whose lost workers fail their tasks, or are replaced)."""
        return []

    @abc.abstractmethod
    def close(self) -> None:
        """Stop the epoch's work at once; safe to call twice and from any thread."""

    def starting(self) -> bool:
        """Whether workers are still starting (``timeout=`` counts from their start, as it
        does for worker processes, which start in far less time); by default not."""
        return False

    def describe(self, worker: int) -> str:
        """How an error names ``worker``."""
        return f"worker {worker}"

    @property
    def handles(self) -> list[Any]:
        """An object per worker, by id (``DataLoader``'s iterator lists its processes)."""
        return []
