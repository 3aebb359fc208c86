"""Sources, and garbage, that a forked child must never finalize.

A process forked from this one (a ``DataLoader`` worker, say) starts with a copy of every
object, including an epoch's source that only a reference cycle still holds, such as the
traceback of an error from a worker (PyTorch issue 149837). Collected in the child, that
source would run its owner's shutdown there: ``DataLoader``'s iterator would set the parent's
done event and write to the parent's queues; a generator would run its ``finally`` blocks.

Every source an epoch reads is registered here. Right before a fork, the sources alive are
held by strong references; the parent drops them after the fork, the child keeps them for
good, so it never collects them. Worker processes end with ``os._exit``, which finalizes
nothing either.

Nor does a child collect any other cycle it inherited: the garbage collector is off across
the fork, and the child freezes what it inherited (``gc.freeze``) before turning it back on.
That garbage may hold the parent's device tensors and events (a batch in an error's
traceback), and a child that releases one calls into CUDA, which aborts it.
"""

from __future__ import annotations

import gc
import os
import threading
import weakref
from typing import Any

_lock = threading.Lock()
_sources: weakref.WeakSet[Any] = weakref.WeakSet()
#: The sources alive at the fork under way, held across it.
_forking: list[Any] = []
#: In a child, the sources it inherited; never released.
_inherited: list[Any] = []
#: Whether the garbage collector was on when the fork under way began.
_collecting: list[bool] = []
_hooked = False


def never_finalize_in_children(source: object) -> None:
    """Keep ``source`` alive, while it is alive here, in every child forked from now on.

    An object that takes no weak reference (a built-in iterator) has no finaliser to run.
    """
    global _hooked
    with _lock:
        if not _hooked:
            os.register_at_fork(
                before=_before_fork,
                after_in_parent=_after_fork_in_parent,
                after_in_child=_after_fork_in_child,
            )
            _hooked = True
        try:
            _sources.add(source)
        except TypeError:
            return


def _before_fork() -> None:
    # Held across the fork, so that the child's copy of the lock and the set are consistent.
    # Hooks run before a fork in reverse order of registration, after it in order: those
    # registered before these (the standard library's, torch's) run with the collector off.
    _lock.acquire()
    _forking.extend(_sources)
    _collecting.append(gc.isenabled())
    gc.disable()


def _after_fork_in_parent() -> None:
    _forking.clear()
    _resume_collecting()
    _lock.release()


def _after_fork_in_child() -> None:
    _inherited.extend(_forking)
    _forking.clear()
    gc.freeze()
    _resume_collecting()
    _lock.release()


def _resume_collecting() -> None:
    if _collecting.pop():
        gc.enable()
