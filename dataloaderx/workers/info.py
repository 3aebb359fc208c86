"""``torch.utils.data.get_worker_info()`` inside worker threads.

PyTorch's ``get_worker_info()`` returns a module global, which its worker processes set;
threads share that global. :func:`install` therefore gives the function (the one object,
so every name bound to it, imported before this package or after, sees the change) a body
that returns the calling thread's info when the thread is a worker thread, and the global
otherwise: ``None`` in the loop's thread, a worker process's info in a worker process.
The original body is checked first; :func:`install` refuses a torch whose function is not
the plain return of that global.

A worker that is a process of its own but not a worker process of ``DataLoader`` (a Ray
actor) sets its info for every thread of the process with :func:`set_process_info`.

One caller is answered as in the loop's thread: torch's ``collate_tensor_fn`` (the tensor
case of ``default_collate``), which takes a worker's info as the sign that its batch goes
to another process, and stacks it into a new shared-memory segment. A worker thread hands
its batch over as an object, and a shared-memory segment per batch made its collation
about twice as slow (``docs/thread-workers.md``).
"""

from __future__ import annotations

import dataclasses
import random
import sys
import threading
from collections.abc import Callable
from typing import Any, Final

import torch
from torch.utils.data import Dataset
from torch.utils.data._utils import collate as torch_collate
from torch.utils.data._utils import worker as torch_worker

__all__ = ["install", "set_process_info", "set_thread_info", "worker_info"]

#: The name under which :func:`_calling_thread_info` is reachable from ``get_worker_info``'s
#: globals.
_GLOBAL_NAME: Final = "_dataloaderx_worker_threads"
#: The code of the one caller that reads a worker's info as "stack into shared memory".
_SHARED_MEMORY_COLLATION: Final = torch_collate.collate_tensor_fn.__code__
#: Fields PyTorch's ``WorkerInfo`` has for thread workers (torch 2.13 has them, 2.11 not).
_THREAD_FIELDS: Final = {"rng", "worker_method"}


class _Local(threading.local):
    #: The calling worker thread's ``WorkerInfo``; ``None`` in every other thread.
    info: Any = None
    #: Where set, what each read calls for the info instead: see :func:`set_thread_info`.
    read: Callable[[], Any] | None = None


_LOCAL: Final = _Local()
#: The ``WorkerInfo`` of every thread of this process without one of its own, or ``None``.
_process_info: Any = None
_lock = threading.Lock()
_installed = False


def _thread_aware() -> Any:  # the body given to torch's get_worker_info, in its module
    return _dataloaderx_worker_threads(_worker_info)  # type: ignore[name-defined]  # noqa: F821


def _calling_thread_info(process_info: Any) -> Any:
    """What ``get_worker_info()`` returns to its caller, given the module global."""
    info = _LOCAL.info
    if info is None:
        info = _process_info
    if info is None or sys._getframe(2).f_code is _SHARED_MEMORY_COLLATION:
        return process_info
    read = _LOCAL.read
    return info if read is None else read()


def install() -> None:
    """Make ``get_worker_info()`` thread-aware (once per process); raise ``RuntimeError`` if
    this torch's function is not the one this package knows how to extend."""
    global _installed
    function = torch_worker.get_worker_info
    with _lock:
        if _installed:
            return
        original = function.__code__
        if original.co_names != ("_worker_info",) or original.co_argcount or original.co_freevars:
            raise RuntimeError(
                "worker_method='thread' needs torch.utils.data.get_worker_info() to return "
                f"the module global _worker_info, and this torch ({torch.__version__}) "
                "defines it otherwise; use worker_method='multiprocessing'"
            )
        vars(torch_worker)[_GLOBAL_NAME] = _calling_thread_info
        renamed = {"co_name": original.co_name}
        if sys.version_info >= (3, 11):
            renamed["co_qualname"] = original.co_qualname
        function.__code__ = _thread_aware.__code__.replace(**renamed)  # type: ignore[arg-type]
        _installed = True


def set_thread_info(info: Any, read: Callable[[], Any] | None = None) -> None:
    """Make ``info`` what ``get_worker_info()`` returns in the calling thread; with ``read``,
    each call returns what ``read()`` returns instead (``default_collate``'s call is not
    passed on)."""
    _LOCAL.info = info
    _LOCAL.read = read


def set_process_info(info: Any) -> None:
    """Make ``info`` what ``get_worker_info()`` returns in every thread of this process that
    has no info of its own (call :func:`install` first)."""
    global _process_info
    with _lock:
        _process_info = info


def worker_info(
    dataset: Dataset[Any],
    worker_id: int,
    num_workers: int,
    base_seed: int,
    method: str = "thread",
    *,
    batch_seed: int | None = None,
) -> Any:
    """The ``WorkerInfo`` of worker ``worker_id``: the seed a worker process would get from
    the same base seed; where torch's ``WorkerInfo`` has them, ``worker_method`` and
    per-worker generators in the states a worker process's global ones start from. With
    ``batch_seed``, the info of one batch of an elastic pool: the seed and the generators
    are the batch's, whichever worker makes it."""
    seed = base_seed + worker_id if batch_seed is None else batch_seed
    fields: dict[str, Any] = {
        "id": worker_id,
        "num_workers": num_workers,
        "seed": seed,
        "dataset": dataset,
    }
    kind = torch_worker.WorkerInfo
    names = (
        {field.name for field in dataclasses.fields(kind)}
        if dataclasses.is_dataclass(kind)
        else set()
    )
    if names >= _THREAD_FIELDS:
        from dataloaderx.workers.worker_rng import NumpySeed, WorkerRNG  # torch has _RNG

        numpy_seed = (  # a worker process's, or the batch's
            torch_worker._generate_state(base_seed, worker_id)  # type: ignore[no-untyped-call]
            if batch_seed is None
            else torch_worker._generate_state(batch_seed, 0)  # type: ignore[no-untyped-call]
        )
        fields["rng"] = WorkerRNG(
            random_generator=random.Random(seed),
            torch_generator=torch.Generator().manual_seed(seed),
            numpy_generator=NumpySeed(numpy_seed),
        )
        fields["worker_method"] = method
    return torch_worker.WorkerInfo(**fields)
