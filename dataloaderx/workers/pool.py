"""Worker threads: each runs the tasks sent to it, in order, as a worker process does.

A worker thread keeps the worker contract of ``DataLoader``'s worker processes: it sets its
``get_worker_info()``, calls ``worker_init_fn(worker_id)`` once, makes its fetcher (an
iterable dataset's ``iter()`` runs in the thread), and answers every task with one outcome:
the batch (pinned, where the loader pins), the batch's error, or the end of its iterable.
Threads share the process, so unlike a process a thread reseeds no global generator; as
a process, it runs torch on one intra-op thread where that setting can be the thread's own
(:mod:`dataloaderx.workers.intra_op`).
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import torch
from torch._utils import ExceptionWrapper
from torch.utils.data._utils.pin_memory import pin_memory
from torch.utils.data.dataloader import _DatasetKind

from dataloaderx.engine.stream import JOIN_TIMEOUT_SECONDS, POLL_SECONDS
from dataloaderx.workers.contract import Outcome, Result, WorkerPool
from dataloaderx.workers.info import set_thread_info, worker_info
from dataloaderx.workers.intra_op import one_intra_op_thread

__all__ = ["WorkerThreads"]


class _Task(NamedTuple):
    epoch: int
    task: int
    indices: Any


#: Sent to a worker: the next tasks belong to a new epoch (persistent workers).
_NEW_EPOCH = "new epoch"
#: Sent to a worker: end.
_STOP = "stop"


class WorkerThreads(WorkerPool):
    """``setup.num_workers`` daemon threads named ``name-<id>``; thread-safe.

    :meth:`send` queues a task for one worker; :meth:`receive` returns the next
    :class:`Result` of any worker. Tasks of an earlier epoch that a worker has not started
    when :meth:`new_epoch` is called are skipped.
    """

    def _start(self, name: str) -> None:
        setup = self._setup
        self._inboxes: list[queue.SimpleQueue[_Task | str]] = [
            queue.SimpleQueue() for _ in range(setup.num_workers)
        ]
        self._results: queue.SimpleQueue[Result] = queue.SimpleQueue()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._epoch = 0  #: guarded by ``_lock``
        self.threads = [
            threading.Thread(target=self._serve, args=(worker,), name=f"{name}-{worker}")
            for worker in range(setup.num_workers)
        ]
        for thread in self.threads:
            thread.daemon = True
            thread.start()

    @property
    def epoch(self) -> int:
        """The epoch whose tasks the workers run now."""
        with self._lock:
            return self._epoch

    def send(self, worker: int, task: int, indices: Any) -> None:
        """Queue task number ``task`` (the batch of ``indices``) for ``worker``."""
        self._inboxes[worker].put(_Task(self.epoch, task, indices))

    def new_epoch(self) -> int:
        """Start a new epoch: each worker makes a new fetcher; return the epoch's number."""
        with self._lock:
            self._epoch += 1
            epoch = self._epoch
        for inbox in self._inboxes:
            inbox.put(_NEW_EPOCH)
        return epoch

    def describe(self, worker: int) -> str:
        return f"worker thread {worker}"

    @property
    def handles(self) -> list[Any]:
        return list(self.threads)

    def receive(self, timeout: float) -> Result | None:
        """The next result, waiting up to ``timeout`` seconds (``None``: none came)."""
        try:
            return self._results.get(timeout=timeout)
        except queue.Empty:
            return None

    def ended(self) -> list[int]:
        """The workers whose thread has ended."""
        return [worker for worker, thread in enumerate(self.threads) if not thread.is_alive()]

    def close(self) -> None:
        """Stop every worker and wait briefly for them; safe to call twice and from any thread.

        A worker in the middle of a task finishes it first (a thread cannot be interrupted):
        one that takes longer than the wait ends as soon as its task does.
        """
        self._stop.set()
        for inbox in self._inboxes:
            inbox.put(_STOP)
        deadline = time.monotonic() + JOIN_TIMEOUT_SECONDS
        for thread in self.threads:
            if thread is threading.current_thread():
                continue
            while thread.is_alive() and time.monotonic() < deadline:
                thread.join(POLL_SECONDS)

    def _serve(self, worker: int) -> None:
        setup = self._setup
        if setup.pin is not None:  # the current device is per thread, and starts at 0
            torch.accelerator.set_device_index(setup.pin[1])
        one_thread = one_intra_op_thread()
        if one_thread is not None:  # before worker_init_fn, which may set another count
            one_thread()
        set_thread_info(worker_info(setup.dataset, worker, setup.num_workers, setup.base_seed))
        # An error here is the outcome of the worker's tasks: its first, as in a worker process,
        # and the later ones too (there a worker process raises an UnboundLocalError).
        fetcher, failure = self._fetcher(worker, setup.init_fn)
        exhausted = False
        inbox = self._inboxes[worker]
        while not self._stop.is_set():
            try:
                task = inbox.get(timeout=POLL_SECONDS)
            except queue.Empty:
                continue
            if task == _STOP:
                return
            if isinstance(task, str):  # a new epoch: a new fetcher, as a worker process makes
                fetcher, failure = self._fetcher(worker, None)
                exhausted = False
                continue
            if task.epoch != self.epoch:
                continue  # an earlier epoch's, not started
            if failure is not None:
                outcome, payload = Outcome.FAILED, failure
            elif exhausted:
                outcome, payload = Outcome.EXHAUSTED, None
            else:
                outcome, payload = self._run(fetcher, task.indices, worker)
                exhausted = outcome is Outcome.EXHAUSTED
            self._results.put(Result(task.epoch, task.task, worker, outcome, payload))
            del payload
            if outcome is Outcome.FATAL:
                return

    def _fetcher(
        self, worker: int, init_fn: Callable[[int], None] | None
    ) -> tuple[Any, ExceptionWrapper | None]:
        """Run ``init_fn``, then make the fetcher; or say why that failed."""
        setup = self._setup
        try:
            if init_fn is not None:
                init_fn(worker)
            fetcher = _DatasetKind.create_fetcher(  # type: ignore[no-untyped-call]
                setup.dataset_kind,
                setup.dataset,
                setup.auto_collation,
                setup.collate_fn,
                setup.drop_last,
            )
        except Exception:  # noqa: BLE001 - handed to the loop
            return None, _wrapped(worker)
        return fetcher, None

    def _run(self, fetcher: Any, indices: Any, worker: int) -> tuple[Outcome, Any]:
        pin = self._setup.pin
        try:
            data = fetcher.fetch(indices)
            if pin is not None:
                data = pin_memory(data, pin[0])  # type: ignore[no-untyped-call]
        except StopIteration:
            if self._setup.dataset_kind == _DatasetKind.Iterable:
                return Outcome.EXHAUSTED, None
            return Outcome.FAILED, _wrapped(worker)
        except Exception:  # noqa: BLE001 - handed to the loop
            return Outcome.FAILED, _wrapped(worker)
        except BaseException as exc:  # noqa: BLE001 - the loop raises it
            return Outcome.FATAL, exc
        return Outcome.BATCH, data


def _wrapped(worker: int) -> ExceptionWrapper:
    """The exception being handled, as a worker process hands it over (type, traceback)."""
    return ExceptionWrapper(where=f"in DataLoader worker thread {worker}")  # type: ignore[no-untyped-call]
