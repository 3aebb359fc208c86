"""Keep ``fork()`` from copying a producer thread that is in the middle of an import.

A forked child inherits every lock in the state it had at the fork, and the threads that
held them do not exist there. Python imports a module under a per-module lock, so a child
forked while one of our producer threads is importing a module (for example ``hmac``,
which receiving the first batch from ``DataLoader`` workers imports) waits forever the
first time it imports that module itself (a worker seeding numpy imports ``hmac`` too).
``DataLoader`` forks its workers in ``iter(loader)``, in the consumer's thread, and may do
so while a producer of another epoch or another loader is running.

:func:`track` registers each producer thread and, once per process, a before-fork hook
(:func:`os.register_at_fork`). The hook waits, in short sleeps that hold no lock and for at
most :data:`IMPORT_WAIT_SECONDS`, until no live producer thread is inside an import. It
does not wait when the forking thread is itself importing, since a producer may be waiting
for that very import.
"""

from __future__ import annotations

import gc
import os
import sys
import threading
import time
import weakref
from types import FrameType
from typing import Final

__all__ = ["IMPORT_WAIT_SECONDS", "importing", "track", "wait_for_producer_imports"]

#: Longest delay of one fork while a producer thread finishes an import.
IMPORT_WAIT_SECONDS: Final = 5.0
#: Sleep between two checks while a fork waits.
_CHECK_SECONDS: Final = 0.001

#: The functions of ``importlib._bootstrap`` on the stack of a thread importing a module:
#: the import itself, and the wait for a module another thread is initialising.
_IMPORT_FRAMES: Final = frozenset({"_find_and_load", "_lock_unlock_module"})
_BOOTSTRAP_FILE: Final = "<frozen importlib._bootstrap>"

_producers: weakref.WeakSet[threading.Thread] = weakref.WeakSet()
_lock = threading.Lock()
_installed = False


def track(thread: threading.Thread) -> None:
    """Delay forks while ``thread`` (a started producer thread) is importing a module."""
    global _installed
    with _lock:
        if not _installed and hasattr(os, "register_at_fork"):
            os.register_at_fork(before=_before_fork, after_in_child=_forget_in_child)
            _installed = True
        _producers.add(thread)


def _live_producers() -> set[int]:
    with _lock:
        threads = list(_producers)
    return {
        ident for thread in threads if (ident := thread.ident) is not None and thread.is_alive()
    }


def importing(frame: FrameType | None) -> bool:
    """Whether the stack ending in ``frame`` is importing a module."""
    while frame is not None:
        code = frame.f_code
        if code.co_name in _IMPORT_FRAMES and code.co_filename == _BOOTSTRAP_FILE:
            return True
        frame = frame.f_back
    return False


def wait_for_producer_imports(timeout: float) -> bool:
    """Wait until no live tracked thread is importing; return ``False`` if ``timeout`` ran out.

    Returns at once when the calling thread is itself importing a module.
    """
    me = threading.get_ident()
    deadline = time.monotonic() + timeout
    while True:
        idents = _live_producers()
        idents.discard(me)
        if not idents:
            return True
        frames = _thread_frames()
        if importing(frames.get(me)):
            return True
        if not any(importing(frames.get(ident)) for ident in idents):
            return True
        del frames
        if time.monotonic() >= deadline:
            return False
        time.sleep(_CHECK_SECONDS)


def _thread_frames() -> dict[int, FrameType]:
    """``sys._current_frames()``, with the cyclic garbage collector paused.

    Up to Python 3.11 a collection can start inside any allocation, and
    ``sys._current_frames()`` allocates while it holds the interpreter's thread-list lock:
    a finaliser run there that releases the GIL would leave that lock held for whichever
    thread takes the GIL next.
    """
    paused = gc.isenabled()
    if paused:
        gc.disable()
    try:
        return sys._current_frames()
    finally:
        if paused:
            gc.enable()


def _before_fork() -> None:
    wait_for_producer_imports(IMPORT_WAIT_SECONDS)


def _forget_in_child() -> None:
    # The producers do not exist in the child, and a thread of the parent may have held
    # the lock at the fork.
    global _lock, _producers
    _lock = threading.Lock()
    _producers = weakref.WeakSet()
