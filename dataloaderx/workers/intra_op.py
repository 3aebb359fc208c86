"""One intra-op torch thread in each worker thread, set for that thread alone (why not
``torch.set_num_threads(1)``, and where it applies: ``docs/thread-workers.md``).

The thread's own OpenMP setting is changed through the runtime loaded in the process (found
in ``/proc/self/maps``), after torch has initialised it (torch would otherwise overwrite it
on the thread's first use), and kept only where torch then reports one thread.
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Callable
from pathlib import Path
from typing import Final

import torch

__all__ = ["one_intra_op_thread"]

#: The file names of the OpenMP runtimes torch builds link: GNU, LLVM and Intel.
_RUNTIMES: Final = ("libgomp", "libomp", "libiomp5")
_MAPS: Final = Path("/proc/self/maps")
#: ``dlopen``'s flag that returns a library only if it is loaded already.
_RTLD_NOLOAD: Final = 4


def _loaded_runtime() -> Callable[[int], None] | None:
    """``omp_set_num_threads`` of the OpenMP runtime loaded in this process, or ``None``."""
    try:
        maps = _MAPS.read_text()
    except OSError:
        return None
    paths = {line.split()[-1] for line in maps.splitlines() if "omp" in line}
    for path in sorted(paths):
        if not path.startswith("/") or not Path(path).name.startswith(_RUNTIMES):
            continue
        try:
            setter = ctypes.CDLL(path, mode=_RTLD_NOLOAD).omp_set_num_threads
        except (OSError, AttributeError):
            continue
        setter.argtypes, setter.restype = [ctypes.c_int], None
        return setter
    return None


@functools.cache
def one_intra_op_thread() -> Callable[[], bool] | None:
    """A function that gives the calling thread one intra-op torch thread, changing no other
    thread's count, and says whether it could; ``None`` where no OpenMP runtime is loaded."""
    set_threads = _loaded_runtime()
    if set_threads is None:
        return None
    return functools.partial(own_thread_only, set_threads)


def own_thread_only(
    set_threads: Callable[[int], None], count: Callable[[], int] = torch.get_num_threads
) -> bool:
    """Set the calling thread's OpenMP setting to one thread with ``set_threads``; keep it if
    torch's ``count`` follows (its intra-op backend is OpenMP), else put it back."""
    before = count()  # torch sets the thread's count on its first use: first
    set_threads(1)
    if count() == 1:
        return True
    set_threads(before)
    return False
