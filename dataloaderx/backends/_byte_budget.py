"""Counting the bytes of tensors a prefetch buffer holds, against an optional cap.

*Held* means released into the buffer by the producer and not yet handed to the loop: the
batches queued (and, for ``background``, the one its thread is putting). The batch the
producer is still making, and the one the loop is using, are not counted.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

import torch

from dataloaderx._tree import iter_tensors

__all__ = ["ByteBudget", "Measure", "batch_bytes"]

_SCALARS: Final = (int, float, complex, str, bytes)


def batch_bytes(batch: Any, *, device_only: bool = False) -> int:
    """Bytes of the elements of the tensors inside ``batch``, each tensor counted once.

    ``device_only``: count only tensors that are not on the CPU.
    """
    if isinstance(batch, torch.Tensor):  # the common cases first: this runs per batch
        return 0 if device_only and batch.device.type == "cpu" else _tensor_bytes(batch)
    if batch is None or isinstance(batch, _SCALARS):
        return 0
    seen: set[int] = set()
    total = 0
    for tensor in iter_tensors(batch):
        if id(tensor) in seen or (device_only and tensor.device.type == "cpu"):
            continue
        seen.add(id(tensor))
        total += _tensor_bytes(tensor)
    return total


def _tensor_bytes(tensor: torch.Tensor) -> int:
    try:
        return tensor.nbytes
    except RuntimeError:  # sparse layouts define no nbytes
        if tensor.is_sparse:
            return _tensor_bytes(tensor._indices()) + _tensor_bytes(tensor._values())
        return tensor.numel() * tensor.element_size()


class ByteBudget:
    """Bytes held by one buffer, its peak, and the cap ``limit`` (``None``: none).

    The producer calls :meth:`add`, the consumer :meth:`remove`; each counter is written
    by one thread only, so no lock is needed. A reader in the producer can only see too
    few bytes removed, never too many, so :meth:`fits` errs on the side of the cap.
    """

    __slots__ = ("_added", "_removed", "limit", "peak")

    def __init__(self, limit: int | None) -> None:
        self.limit = limit
        self._added = 0
        self._removed = 0
        self.peak = 0

    @property
    def held(self) -> int:
        """Bytes added and not yet removed."""
        return self._added - self._removed

    def fits(self, size: int) -> bool:
        """Whether a batch of ``size`` bytes may join the buffer now.

        It may if it keeps the total within the cap, or if the buffer holds nothing (a
        batch larger than the cap passes alone).
        """
        limit = self.limit
        if limit is None:
            return True
        held = self._added - self._removed
        return held == 0 or held + size <= limit

    def add(self, size: int) -> None:
        """Producer: a batch of ``size`` bytes joined the buffer."""
        self._added += size
        held = self._added - self._removed
        if held > self.peak:
            self.peak = held

    def remove(self, size: int) -> None:
        """Consumer: a batch of ``size`` bytes left the buffer."""
        self._removed += size


#: How a backend measures a batch it put in the buffer.
Measure = Callable[[Any], int]
