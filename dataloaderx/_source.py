"""A guarded view of the iterator a backend prefetches from."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Iterator
from threading import get_ident
from typing import Generic, TypeVar

from dataloaderx._direct import RUN_MAX, Direct, DirectRun, settle_nothing

__all__ = ["GuardedSource"]

T = TypeVar("T")

#: Seconds between checks while :meth:`GuardedSource.close` waits for a ``next()`` to end
#: ...
POLL_SECONDS = 0.05
#: ... and for a direct run's ``take()`` (a batch, often far shorter than a lock's poll).
TAKE_POLL_SECONDS = 0.001


def _gil_enabled() -> bool:
    """Whether one thread at a time runs Python code (``False`` on a free-threaded build
    running without the GIL)."""
    check: Callable[[], bool] | None = getattr(sys, "_is_gil_enabled", None)
    return True if check is None else check()


class GuardedSource(Generic[T]):
    """Wrap an iterator so that it is never used and released at the same time.

    ``next()`` runs under a lock. :meth:`close` marks the source closed, then takes the
    lock to run ``release`` (for example PyTorch's ``_shutdown_workers``). If a producer
    thread is still inside ``next()`` when the wait runs out, ``close`` returns and that
    thread runs ``release`` itself as it leaves ``next()``; ``release`` runs exactly once.

    It is the bottom of every direct run (see :mod:`dataloaderx._direct`), and
    :meth:`replay` makes the next ``next()`` raise the exception a run's ``take`` raised,
    in whichever thread makes that call. A run's ``take`` is the iterator's own ``next``,
    without the lock (it costs more than a tiny batch's share allows); the run's flags
    keep the promise instead. The taking thread sets ``busy``, then reads ``closing``;
    :meth:`close` sets ``closing``, then reads ``busy``. With one thread running Python
    code at a time, one of them sees the other's flag: the taker stops before its
    ``take()``, or ``close`` waits for it to end (as for the lock), and whichever of the
    two comes last releases the iterator. Without the GIL (a free-threaded build), a
    run's ``take`` is this source's locked ``next`` instead.
    """

    def __init__(self, iterator: Iterator[T], release: Callable[[], None] | None) -> None:
        self._iterator = iterator
        self._release = release
        self._lock = threading.Lock()
        self._close_requested = False
        self._released = False
        self._holder: int | None = None
        self._replay: BaseException | None = None
        self._run: DirectRun | None = None
        self._take: Callable[[], T] = iterator.__next__ if _gil_enabled() else self.__next__

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

    def direct(self, run: DirectRun) -> Direct | None:
        """A direct run's bottom: batches are made by the iterator's own ``next``, in the
        thread that asks (none once closed, or while an error waits to be replayed)."""
        if self._close_requested or self._replay is not None:
            return None
        run.thread = get_ident()
        self._run = run
        return Direct(RUN_MAX, self._take, settle_nothing)

    def release_after_take(self) -> None:
        """Called by a direct run's taker that found ``closing`` set after its ``take()``:
        release the iterator, unless :meth:`close` does (or did)."""
        if self._lock.acquire(blocking=False):  # else close() holds it, and releases
            try:
                self._release_locked()
            finally:
                self._lock.release()

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
        run = self._run
        if run is not None:
            run.closing = True
            if run.busy:
                started = time.monotonic()
                if run.thread == get_ident() or not _wait_for_take(run, timeout):
                    return False  # the taker releases on its way out
                if timeout is not None:  # one budget for both waits
                    timeout = max(0.0, timeout - (time.monotonic() - started))
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


def _wait_for_take(run: DirectRun, timeout: float | None) -> bool:
    """Wait up to ``timeout`` seconds (``None``: as long as it takes) for the ``take()``
    under way in ``run`` to end; say whether it did."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while run.busy:
        if deadline is not None and time.monotonic() >= deadline:
            return False
        time.sleep(TAKE_POLL_SECONDS)
    return True
