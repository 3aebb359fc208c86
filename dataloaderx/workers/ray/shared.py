"""A batch's hand-over on the loop's own machine: tensors in shared-memory files, by name.

An actor where the loop runs (:func:`machine` is the same) makes the shared memory a worker
process would make as files ``/dev/shm/<prefix>-<pid>-<n>`` (:func:`share_by_name`), each
one's pages allocated in one call; the loop maps a file and removes its name at once
(:func:`mapped`). The group's files left are removed when its actors end, and the reaper
removes this process's (:func:`files_prefix`) once it has ended, however it ends.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import functools
import glob
import itertools
import os
from collections.abc import Callable
from typing import Any, Final, NamedTuple

import torch

from dataloaderx.util.reaper import reap_at_exit

__all__ = [
    "SharedMemory",
    "file_of",
    "files_prefix",
    "machine",
    "mapped",
    "remove_files",
    "share_by_name",
]

_DIRECTORY = "/dev/shm"
_BOOT_ID = "/proc/sys/kernel/random/boot_id"
#: ``madvise``'s advice to allocate and map a range's pages writable (``linux/mman.h``).
_MADV_POPULATE_WRITE: Final = 23


class SharedMemory(NamedTuple):
    """Where the loop runs, and the prefix of its actors' shared-memory files."""

    machine: str
    prefix: str


def machine() -> str | None:
    """What two processes share exactly when they see the same shared-memory files: the
    boot (its random id) and the ``/dev/shm`` file system; ``None`` where either is unknown."""
    try:
        with open(_BOOT_ID, encoding="ascii") as file:
            boot = file.read().strip()
        shm = os.stat(_DIRECTORY)
    except OSError:
        return None
    return f"{boot}:{shm.st_dev}:{shm.st_ino}"


def share_by_name(prefix: str) -> None:
    """Make this process's new shared-memory storages (the ones torch makes for a worker's
    batch) files named ``prefix``, which another process on the machine can map."""
    original: Any = torch.UntypedStorage._new_shared
    numbers = itertools.count()
    populate = _populate_function()

    def new_shared(cls: type[torch.UntypedStorage], size: int, *, device: Any = "cpu") -> Any:
        if torch.device(device).type != "cpu" or not size:
            return original(size, device=device)
        path = f"{_DIRECTORY}/{prefix}-{os.getpid()}-{next(numbers)}"
        storage = cls.from_file(path, shared=True, nbytes=size)
        populate(storage.data_ptr(), size, path)
        return storage

    torch.UntypedStorage._new_shared = classmethod(new_shared)  # type: ignore[assignment,method-assign]


def _populate_function() -> Callable[[int, int, str], None]:
    """A function that allocates and maps at once the ``nbytes`` at ``address``, the
    mapping of the file ``path``; it does nothing where the kernel cannot, and raises where
    ``/dev/shm`` is full."""
    madvise = ctypes.CDLL(None, use_errno=True).madvise
    madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    madvise.restype = ctypes.c_int

    def populate(address: int, nbytes: int, path: str) -> None:
        if madvise(address, nbytes, _MADV_POPULATE_WRITE) == 0:
            return
        error = ctypes.get_errno()
        if error in (errno.EINVAL, errno.ENOSYS):  # a kernel older than 5.14
            return
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        raise RuntimeError(
            f"a batch of {nbytes} bytes does not fit in {_DIRECTORY} "
            f"({os.strerror(error)}); raise the shared-memory limit (docker run --shm-size, "
            "a larger /dev/shm), or pass worker_options={'handover': 'object_store'}"
        )

    return populate


@functools.cache
def _process_prefix(pid: int) -> str:
    reap_at_exit(files=f"{_DIRECTORY}/dataloaderx-{pid}-*")
    return f"dataloaderx-{pid}"


def files_prefix(group: str) -> str:
    """The prefix of the files of ``group``'s actors: this process's (whose files the
    reaper removes once it has ended, however it ends), then the group's."""
    return f"{_process_prefix(os.getpid())}-{group}"


def remove_files(prefix: str) -> None:
    """Remove the shared-memory files named ``prefix`` that are left."""
    for path in glob.glob(f"{_DIRECTORY}/{glob.escape(prefix)}-*"):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


def file_of(storage: torch.UntypedStorage, prefix: str | None) -> str | None:
    """The name of the shared-memory file named ``prefix`` that holds ``storage`` (in the
    actor), or ``None``."""
    path = storage.filename
    if prefix is None or path is None or not path.startswith(f"{_DIRECTORY}/{prefix}-"):
        return None
    return path


def mapped(path: str, nbytes: int) -> torch.UntypedStorage:
    """The storage in the file ``path``, mapped in the loop; the file's name removed."""
    try:
        if os.stat(path).st_size != nbytes:
            raise OSError(f"{path} does not hold {nbytes} bytes")
        return torch.UntypedStorage.from_file(path, shared=True, nbytes=nbytes)  # type: ignore[return-value]
    except (OSError, RuntimeError) as exc:
        raise RuntimeError(
            f"a batch a Ray worker left in shared memory cannot be mapped here ({exc}); if "
            "the actors run in containers of their own on this machine, pass "
            "worker_options={'handover': 'object_store'}"
        ) from exc
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
