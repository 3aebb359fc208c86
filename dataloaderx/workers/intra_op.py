"""One intra-op torch thread in each worker thread, as a worker process runs with.

A worker process calls ``torch.set_num_threads(1)``. In a thread that call is not the
thread's own: besides the calling thread's OpenMP setting, it stores the count that every
thread started later takes up when it first runs torch, and sizes process-wide pools
(PyTorch's ``ParallelOpenMP.cpp``). A worker thread therefore sets only its own OpenMP
setting, ``omp_set_num_threads(1)`` of the OpenMP runtime torch loaded, after torch has
initialised the thread's setting (which it would otherwise overwrite on first use).

That is possible where torch's intra-op backend is OpenMP (its Linux and Windows builds,
as ``torch.__config__.parallel_info()`` says) and the runtime is found among the process's
loaded libraries (``/proc/self/maps``); elsewhere, :func:`one_intra_op_thread` is ``None``
and worker threads run torch on the process's intra-op threads.
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Callable
from pathlib import Path
from typing import Final

import torch

__all__ = ["one_intra_op_thread"]

#: What ``torch.__config__.parallel_info()`` says of an OpenMP intra-op backend.
_OPENMP_BACKEND: Final = "ATen parallel backend: OpenMP"
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
def one_intra_op_thread() -> Callable[[], None] | None:
    """A function that gives the calling thread one intra-op torch thread and changes no
    other thread's count, or ``None`` where this torch cannot do that (see the module)."""
    if _OPENMP_BACKEND not in torch.__config__.parallel_info():
        return None
    set_threads = _loaded_runtime()
    if set_threads is None:
        return None

    def own_thread_only() -> None:
        torch.get_num_threads()  # torch sets the thread's count on its first use: first
        set_threads(1)

    return own_thread_only
