"""A batch's hand-over on the loop's own machine: tensors in shared-memory files, by name.

An actor that runs where the loop runs (:func:`machine` is the same: the same boot, the same
``/dev/shm``) makes the shared memory a worker process would make (``default_collate``
stacks a worker's batch into it) as files ``/dev/shm/<prefix>-<pid>-<n>``
(:func:`share_by_name`), and sends each tensor in one as the file's name
(:func:`segment`). Each file's pages are allocated and mapped in one call as it is made
(``madvise(MADV_POPULATE_WRITE)``, Linux 5.14 and later), not one page fault at a time
as the batch is written. The loop maps the file and removes its name at once (:func:`_mapped`),
so the memory is freed with the loop's last view of it, whatever becomes of the actor.
A file whose batch the loop never reads (an epoch left while it was under way) is removed
when it is read and dropped, or with the others of its prefix (:func:`remove_files`) when
the loader's actors end, and again at exit (an actor ends a little after it is told to).
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import errno
import glob
import itertools
import os
import threading
from collections.abc import Callable
from typing import Any, Final, NamedTuple

import torch

__all__ = ["SharedMemory", "machine", "remove_files", "segment", "share_by_name"]

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


#: Prefixes whose files were removed, to remove again at exit; guarded by ``_lock``.
_removed: set[str] = set()
_lock = threading.Lock()


def remove_files(prefix: str) -> None:
    """Remove the shared-memory files named ``prefix`` that are left, now and at exit."""
    with _lock:
        if not _removed:
            atexit.register(_remove_again)
        _removed.add(prefix)
    _remove(prefix)


def _remove(prefix: str) -> None:
    for path in glob.glob(f"{_DIRECTORY}/{glob.escape(prefix)}-*"):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


def _remove_again() -> None:
    with _lock:
        prefixes = list(_removed)
    for prefix in prefixes:
        _remove(prefix)


class _Segment:
    """A tensor on its way from an actor, as its file's name and its layout."""

    __slots__ = ("layout", "nbytes", "path")

    def __init__(self, path: str, nbytes: int, layout: tuple[Any, ...]) -> None:
        self.path, self.nbytes, self.layout = path, nbytes, layout

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return _mapped, (self.path, self.nbytes, self.layout)


def segment(tensor: torch.Tensor, prefix: str) -> _Segment | None:
    """``tensor`` as its file's name when it is in a file named ``prefix`` (in the actor);
    else ``None``."""
    if tensor.device.type != "cpu":
        return None
    storage = tensor.untyped_storage()
    path = storage.filename
    if path is None or not path.startswith(f"{_DIRECTORY}/{prefix}-"):
        return None
    layout = (tensor.dtype, tensor.storage_offset(), tuple(tensor.shape), tensor.stride())
    return _Segment(path, storage.nbytes(), layout)


def _mapped(path: str, nbytes: int, layout: tuple[Any, ...]) -> torch.Tensor:
    """The tensor in the file ``path``, mapped in the loop; the file's name removed."""
    try:
        if os.stat(path).st_size != nbytes:
            raise OSError(f"{path} does not hold {nbytes} bytes")
        storage = torch.UntypedStorage.from_file(path, shared=True, nbytes=nbytes)
    except (OSError, RuntimeError) as exc:
        raise RuntimeError(
            f"a batch a Ray worker left in shared memory cannot be mapped here ({exc}); if "
            "the actors run in containers of their own on this machine, pass "
            "worker_options={'handover': 'object_store'}"
        ) from exc
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
    dtype, offset, shape, stride = layout
    return torch.empty(0, dtype=dtype).set_(storage, offset, shape, stride)  # type: ignore[arg-type]
