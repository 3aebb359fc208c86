"""Pinned staging memory for the ``cuda`` backend: a few slots per loader, each reused only
once the copies reading it have completed (``docs/cuda.md``, *Pinning*; ``docs/design.md``)."""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final

import torch

from dataloaderx.device.api import DeviceAPI
from dataloaderx.device.host_copy import Segment

ALIGNMENT: Final = 512  #: of each tensor in a slot (a multiple of every dtype's size)
_LONGEST_POLL_SECONDS: Final = 0.001  #: longest sleep while polling for a free slot
_CLOSE_WAIT_SECONDS: Final = 1.0  #: how long close() waits for outstanding copies
_RESERVED: Final = object()  #: marks a slot handed out by stage() and not yet released
_NEVER_RETURNED: list[torch.Tensor] = []  #: buffers a copy may still read at close; kept for good


def dense_span(tensor: torch.Tensor) -> bool:
    """Whether ``tensor`` covers exactly ``numel`` elements of memory in some dim order: true
    for contiguous and permuted (``channels_last``) layouts, false for gaps and stride 0."""
    if tensor.is_contiguous():
        return True
    expected = 1
    for size, stride in sorted(zip(tensor.shape, tensor.stride(), strict=True), key=lambda p: p[1]):
        if size == 1:
            continue
        if stride != expected:
            return False
        expected *= size
    return True


def staged_view(
    buffer: torch.Tensor, offset: int, tensor: torch.Tensor
) -> tuple[torch.Tensor, Segment]:
    """A view of ``buffer`` at ``offset`` shaped like ``tensor``, and the copy filling it. A dense
    tensor is copied as flat bytes in memory order and its view keeps its strides
    (``channels_last`` stays so); any other is gathered into a contiguous view."""
    nbytes = tensor.numel() * tensor.element_size()
    flat = buffer[offset : offset + nbytes].view(tensor.dtype)
    if dense_span(tensor):
        span = tensor.as_strided((tensor.numel(),), (1,), tensor.storage_offset())
        view = flat.as_strided(tensor.shape, tensor.stride(), flat.storage_offset())
        return view, (flat, span)
    view = flat.view(tensor.shape)
    return view, (view, tensor)


@dataclass(eq=False)
class _Slot:
    buffer: torch.Tensor
    busy_until: Any = None  #: event behind the last copies reading it; None once they ended

    @property
    def capacity(self) -> int:
        return self.buffer.numel()


class StagingPool:
    """Up to ``slots`` reusable pinned buffers; see the module docstring."""

    def __init__(self, api: DeviceAPI, *, slots: int) -> None:
        self._api = api
        self._max_slots = slots
        self._slots: list[_Slot] = []
        self._lock = threading.Lock()
        self._closed = False

    def stage(
        self, tensors: Sequence[torch.Tensor], *, stop: Callable[[], bool] | None = None
    ) -> tuple[_Slot, list[torch.Tensor], list[Segment]]:
        """Reserve a slot for ``tensors``; return it, their staged views and the copies to run.

        The caller runs the copies, enqueues the device copies reading the views, then calls
        :meth:`release_after` with the event behind them (:meth:`release` on earlier failure).
        Waits while all slots are busy: ``RuntimeError`` if the pool closes or ``stop()``."""
        sizes = [-(-t.numel() * t.element_size() // ALIGNMENT) * ALIGNMENT for t in tensors]
        slot = self._acquire(sum(sizes), stop)
        offsets = itertools.accumulate(sizes, initial=0)
        staged = [staged_view(slot.buffer, o, t) for t, o in zip(tensors, offsets, strict=False)]
        return slot, [view for view, _ in staged], [segment for _, segment in staged]

    def release_after(self, slot: _Slot, event: Any) -> None:
        """Let ``slot`` be reused once ``event`` has completed."""
        with self._lock:
            slot.busy_until = event

    def release(self, slot: _Slot) -> None:
        """Let ``slot`` be reused now: nothing was enqueued that reads it."""
        self.release_after(slot, None)

    def _acquire(self, nbytes: int, stop: Callable[[], bool] | None) -> _Slot:
        delay = 1e-5
        while True:
            if stop is not None and stop():
                raise RuntimeError("dataloaderx: pinned staging memory wait ended: epoch closed")
            with self._lock:
                if self._closed:
                    raise RuntimeError("dataloaderx: pinned staging memory used after close()")
                slot = self._take_free(nbytes)
                if slot is not None:
                    slot.busy_until = _RESERVED
                    return slot
            # Every slot is in use: poll, in short steps, until a copy reading one ends.
            time.sleep(delay)
            delay = min(2 * delay, _LONGEST_POLL_SECONDS)

    def _take_free(self, nbytes: int) -> _Slot | None:
        free = [slot for slot in self._slots if self._is_free(slot)]
        fitting = [slot for slot in free if slot.capacity >= nbytes]
        if fitting:
            chosen = min(fitting, key=lambda slot: slot.capacity)
            self._slots.remove(chosen)
        elif len(self._slots) < self._max_slots or free:
            if free:  # replace the smallest free slot, so the count stays bounded
                smallest = min(free, key=lambda slot: slot.capacity)
                self._slots.remove(smallest)
                self._api.unpin_buffer(smallest.buffer)
            chosen = _Slot(self._api.pin_buffer(nbytes))
        else:
            return None
        self._slots.append(chosen)  # the list runs from least to most recently used
        return chosen

    def _is_free(self, slot: _Slot) -> bool:
        event = slot.busy_until
        if event is not None and event is not _RESERVED and self._api.event_done(event):
            slot.busy_until = event = None
        return event is None

    def close(self) -> None:
        """Wait up to 1 s for pending copies, then return every buffer; idempotent. Buffers still
        in use (stalled device, producer outliving ``close()``) are kept: copies may read them."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            slots, self._slots = self._slots, []
        deadline = time.monotonic() + _CLOSE_WAIT_SECONDS
        for slot in slots:
            while not self._is_free(slot) and time.monotonic() < deadline:
                time.sleep(_LONGEST_POLL_SECONDS)
            if slot.busy_until is None:
                self._api.unpin_buffer(slot.buffer)
            else:  # still reserved by a producer that outlived close(), or still copying
                _NEVER_RETURNED.append(slot.buffer)
