"""A batch's hand-over from an actor to the loop through the object store: tensors travel
as numpy arrays (on the loop's own machine, tensors in shared memory go by name first:
:mod:`~dataloaderx.workers.ray.shared`).

Ray returns a numpy array from its object store without a copy (read-only), while a torch
tensor is pickled and copied. :func:`pack` wraps each CPU tensor of a batch as an
:class:`_Array` on the actor's side; :func:`unpack` makes it a tensor again with
``torch.from_numpy`` in the loop, sharing the object-store memory. The loop holds the only
reference to that object (each result is read once, and its reference dropped), so an
in-place write changes nothing any other reader sees, and the memory is freed with the
tensor. Tensors numpy cannot hold (``bfloat16``, ones that require grad, ...), and batches
of types ``torch.utils._pytree`` does not know, travel pickled, as copies.
"""

from __future__ import annotations

import threading
import warnings
from typing import Any, Final

import numpy
import torch
from torch.utils._pytree import tree_map_only

from dataloaderx.workers.ray.shared import segment

__all__ = ["pack", "prepare", "unpack"]

#: The dtypes ``Tensor.numpy()`` and ``torch.from_numpy`` carry both ways.
_NUMPY_DTYPES: Final = frozenset(
    {
        torch.bool,
        torch.uint8,
        torch.int8,
        torch.int16,
        torch.int32,
        torch.int64,
        torch.float16,
        torch.float32,
        torch.float64,
        torch.complex64,
        torch.complex128,
    }
)

_lock = threading.Lock()
_warned = False


class _Array:
    """A tensor on its way from an actor, as the numpy array that shares its memory."""

    __slots__ = ("array",)

    def __init__(self, array: numpy.ndarray[Any, Any]) -> None:
        self.array = array

    def __reduce__(self) -> tuple[type[_Array], tuple[numpy.ndarray[Any, Any]]]:
        return _Array, (self.array,)


def _packed(tensor: torch.Tensor) -> Any:
    plain = (
        tensor.device.type == "cpu"
        and tensor.layout is torch.strided
        and tensor.dtype in _NUMPY_DTYPES
        and not (tensor.requires_grad or tensor.is_conj() or tensor.is_neg())
    )
    return _Array(tensor.numpy()) if plain else tensor


def pack(batch: Any, prefix: str | None) -> Any:
    """``batch`` with each tensor numpy can hold as an :class:`_Array` (in the actor); with
    a ``prefix``, each tensor in a shared-memory file of that prefix as the file's name."""
    if prefix is None:
        return tree_map_only(torch.Tensor, _packed, batch)

    def named_or_packed(tensor: torch.Tensor) -> Any:
        named = segment(tensor, prefix)
        return _packed(tensor) if named is None else named

    return tree_map_only(torch.Tensor, named_or_packed, batch)


def _opened(packed: _Array) -> torch.Tensor:
    return torch.from_numpy(packed.array)


def unpack(batch: Any) -> Any:
    """``batch`` with each :class:`_Array` a tensor again, without a copy (in the loop)."""
    return tree_map_only(_Array, _opened, batch)


def prepare() -> None:
    """Take torch's one warning about tensors from read-only arrays, which every unpacked
    tensor is (the object store's memory is returned read-only; see the module's notes).
    Call it in the loop's thread before :func:`unpack` (it changes warning filters)."""
    global _warned
    with _lock:
        if _warned:
            return
        _warned = True
        array = numpy.zeros(1)
        array.flags.writeable = False
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            torch.from_numpy(array)
