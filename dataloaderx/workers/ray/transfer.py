"""A batch's trip from an actor to the loop, as a worker process makes it: pickled, each
CPU tensor storage apart and once (so that tensors that shared one still do), by its
shared-memory file's name where it is in one (:mod:`~dataloaderx.workers.ray.shared`),
else as a numpy array of its bytes, which Ray returns from its object store without a copy.
"""

from __future__ import annotations

import functools
import io
import pickle
import warnings
from typing import Any

import numpy
import torch

from dataloaderx.workers.ray.shared import file_of, mapped

__all__ = ["pack", "prepare", "unpack"]


class _Pickler(pickle.Pickler):
    """Pickles a batch, each CPU storage as a persistent id; ``arrays`` gets their bytes."""

    def __init__(self, file: io.BytesIO, prefix: str | None) -> None:
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self._prefix = prefix
        self.arrays: list[numpy.ndarray[Any, Any]] = []
        self._numbers: dict[int, int] = {}

    def persistent_id(self, obj: Any) -> Any:
        if isinstance(obj, torch.storage.TypedStorage):
            storage, dtype = obj._untyped_storage, obj.dtype
        elif isinstance(obj, torch.UntypedStorage):
            storage, dtype = obj, None
        else:
            return None
        if storage.device.type != "cpu":
            return None
        path = file_of(storage, self._prefix)
        if path is not None:
            return "file", path, storage.nbytes(), dtype
        number = self._numbers.get(storage._cdata)
        if number is None:
            number = self._numbers[storage._cdata] = len(self.arrays)
            whole = torch.empty(0, dtype=torch.uint8).set_(storage)
            self.arrays.append(whole.numpy())
        return "array", number, dtype


class _Unpickler(pickle.Unpickler):
    def __init__(self, data: bytes, arrays: list[numpy.ndarray[Any, Any]]) -> None:
        super().__init__(io.BytesIO(data))
        self._arrays = arrays
        self._storages: dict[Any, torch.UntypedStorage] = {}

    def persistent_load(self, pid: Any) -> Any:
        kind, key, *size, dtype = pid
        storage = self._storages.get(key)
        if storage is None:
            if kind == "file":
                storage = mapped(key, size[0])
            else:
                storage = torch.from_numpy(self._arrays[key]).untyped_storage()
            self._storages[key] = storage
        if dtype is None:
            return storage
        return torch.storage.TypedStorage(wrap_storage=storage, dtype=dtype, _internal=True)  # type: ignore[no-untyped-call]


def pack(batch: Any, prefix: str | None) -> tuple[bytes, list[numpy.ndarray[Any, Any]]]:
    """``batch`` pickled, and its storages' bytes (in the actor); storages in files named
    ``prefix`` go by name."""
    file = io.BytesIO()
    pickler = _Pickler(file, prefix)
    pickler.dump(batch)
    return file.getvalue(), pickler.arrays


def unpack(packed: tuple[bytes, list[numpy.ndarray[Any, Any]]]) -> Any:
    """The batch :func:`pack` gave, its storages over the memory they arrived in (in the
    loop)."""
    data, arrays = packed
    return _Unpickler(data, arrays).load()


@functools.cache
def prepare() -> None:
    """Take torch's one warning about tensors from read-only arrays, which every storage
    from the object store is (its memory is returned read-only: the loop holds the only
    reference). Call it in the loop's thread before :func:`unpack` (it changes warning
    filters)."""
    array = numpy.zeros(1)
    array.flags.writeable = False
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        torch.from_numpy(array)
