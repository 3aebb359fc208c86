"""A worker's generators in ``get_worker_info().rng`` (torch >= 2.13), the numpy one made the
first time it is read: importing ``numpy.random`` takes 5-6 ms, half a worker thread's start,
and most datasets never draw from that generator.

A worker thread may then import ``numpy.random``; every ``os.fork()`` of this process
waits for that import (``docs/design.md``, "Forking while a producer runs").
"""

from __future__ import annotations

import importlib
import os
import threading
from typing import Any, Final

from torch.utils.data._utils import worker as torch_worker

__all__ = ["NumpySeed", "WorkerRNG"]

#: The storage of ``numpy_generator`` in torch's ``_RNG`` (a frozen dataclass with slots).
_SLOT: Final[Any] = vars(torch_worker._RNG)["numpy_generator"]
#: Held while a generator is made, and by every fork of this process while it forks.
_lock = threading.Lock()
os.register_at_fork(
    before=_lock.acquire, after_in_parent=_lock.release, after_in_child=_lock.release
)


class NumpySeed(list[int]):
    """The seed of a numpy generator not made yet."""


class WorkerRNG(torch_worker._RNG):
    """torch's ``_RNG``; ``numpy_generator``, given as a :class:`NumpySeed`, reads as the
    ``numpy.random.RandomState`` of that seed, made on the first read."""

    __slots__ = ()

    @property
    def numpy_generator(self) -> Any:
        with _lock:
            value = _SLOT.__get__(self, WorkerRNG)
            if isinstance(value, NumpySeed):
                value = importlib.import_module("numpy.random").RandomState(value)
                _SLOT.__set__(self, value)
        return value

    @numpy_generator.setter
    def numpy_generator(self, value: Any) -> None:  # set once, by the dataclass's __init__
        _SLOT.__set__(self, value)
