"""A guarded view of the iterator a backend prefetches from."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from threading import get_ident
from typing import Generic, TypeVar

from dataloaderx._direct import RUN_MAX, Direct, settle_nothing

__all__ = ["GuardedSource"]

T = TypeVar("T")

#: Seconds between checks while :meth:`GuardedSource.close` waits for a ``next()`` to end.
POLL_SECONDS = 0.05


class GuardedSource(Generic[T]):
    """Wrap an iterator so that it is never used and released at the same time.

    ``next()`` runs under a lock. :meth:`close` marks the source closed, then takes the
    lock to run ``release`` (for example PyTorch's ``_shutdown_workers``). If a producer
    thread is still inside ``next()`` when the wait runs out, ``close`` returns and that
    thread runs ``release`` itself as it leaves ``next()``; ``release`` runs exactly once.

    It is the bottom of every direct run (see :mod:`dataloaderx._direct`): it offers its
    own ``next`` as the run's ``take``, and :meth:`replay` makes the next ``next()``
    raise the exception a run's ``take`` raised, in whichever thread makes that call.
    """

    def __init__(self, iterator: Iterator[T], release: Callable[[], None] | None) -> None:
        self._iterator = iterator
        self._release = release
        self._lock = threading.Lock()
        self._close_requested = False
        self._released = False
        self._holder: int | None = None
        self._replay: BaseException | None = None

    def __iter__(self) -> GuardedSource[T]:
        return self

    def __next__(self) -> T:
        with self._lock:
            self._holder = get_ident()
            try:
                if self._close_requested:
                    raise StopIteration
                if self._replay is not None:
                    try:
                        raise self._replay  # no local name: it would hold a cycle
                    finally:
                        self._replay = None
                return next(self._iterator)
            finally:
                if self._close_requested:
                    self._release_locked()  # still the holder: a close() in it returns
                self._holder = None

    def direct(self, marks: list[float]) -> Direct:
        """A direct run's bottom: batches are made by this source's own ``next``."""
        return Direct(RUN_MAX, self.__next__, settle_nothing)

    def replay(self, error: BaseException) -> None:
        """Make the next ``next()`` raise ``error`` instead of reading the iterator."""
        self._replay = error

    @property
    def released(self) -> bool:
        """Whether ``release`` has run."""
        return self._released

    def close(self, timeout: float | None) -> bool:
        """Stop handing out items and release the iterator.

        Waits up to ``timeout`` seconds (``None``: as long as it takes, in short
        interruptible steps) for a ``next()`` in progress. Returns whether the release
        happened here; if not, the thread inside ``next()`` does it on its way out.
        """
        self._close_requested = True
        if self._holder == get_ident():
            return False  # a finaliser inside our own next(), which releases on its way out
        waited = 0.0
        while not self._lock.acquire(timeout=POLL_SECONDS):
            waited += POLL_SECONDS
            if timeout is not None and waited >= timeout:
                return False
        try:
            self._release_locked()
        finally:
            self._lock.release()
        return True

    def _release_locked(self) -> None:
        if self._released:
            return
        self._released = True
        release, self._release = self._release, None
        if release is not None:
            release()
