"""Counting the bytes of tensors a prefetch buffer holds, against an optional cap."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

import torch

from dataloaderx.util.tree import iter_tensors

_SCALARS: Final = (int, float, complex, str, bytes)


def batch_bytes(batch: Any, *, device_only: bool = False) -> int:
    """Bytes of the tensors inside ``batch``, each counted once (``device_only``: off the CPU)."""
    if isinstance(batch, torch.Tensor):  # the common cases first: this runs per batch
        return 0 if device_only and batch.device.type == "cpu" else _tensor_bytes(batch)
    if batch is None or isinstance(batch, _SCALARS):
        return 0
    unique = {id(t): t for t in iter_tensors(batch) if not device_only or t.device.type != "cpu"}
    return sum(_tensor_bytes(tensor) for tensor in unique.values())


def _tensor_bytes(tensor: torch.Tensor) -> int:
    try:
        return tensor.nbytes
    except RuntimeError:  # sparse layouts define no nbytes
        if tensor.is_sparse:
            return _tensor_bytes(tensor._indices()) + _tensor_bytes(tensor._values())
        return tensor.numel() * tensor.element_size()


class ByteBudget:
    """Bytes held by one buffer, its peak, and the cap ``limit`` (``None``: none). Not thread-safe:
    the producer (:meth:`add`) and the consumer (:meth:`remove`) call it under its buffer's lock."""

    __slots__ = ("held", "limit", "peak")

    def __init__(self, limit: int | None) -> None:
        self.limit = limit
        #: Bytes added and not yet removed.
        self.held = 0
        self.peak = 0

    def fits(self, size: int) -> bool:
        """Whether ``size`` more bytes may join now: within the cap, or into an empty buffer (a
        batch larger than the cap passes alone)."""
        return self.limit is None or self.held == 0 or self.held + size <= self.limit

    def add(self, size: int) -> None:
        """Producer: a batch of ``size`` bytes joined the buffer."""
        self.held += size
        self.peak = max(self.peak, self.held)

    def remove(self, size: int) -> None:
        """Consumer: a batch of ``size`` bytes left the buffer."""
        self.held -= size


#: How a backend measures a batch it put in the buffer.
Measure = Callable[[Any], int]
