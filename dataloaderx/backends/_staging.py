"""Pinned staging memory for the ``cuda`` backend: a few reusable slots per loader.

A batch's pageable host tensors are packed into one *slot*: a buffer of page-locked
host memory, with each tensor at an aligned offset and in its own layout. The copy into
the slot runs on :class:`~dataloaderx.backends._host_copy.CopyThreads`; the
host-to-device copies then read from the slot asynchronously. A slot is reused only
after the event recorded behind its batch's copies has completed, so a later batch can
never overwrite memory a copy still reads.

The pool holds at most ``slots`` buffers (``depth + 1`` for the backend: ``depth``
batches whose copies may still be in flight, plus the one being filled). A slot grows
when a batch does not fit, replacing a free slot rather than adding one, so the pinned
memory held stays within ``slots`` times the largest batch.

A pool lives as long as its loader's backend, so that later epochs reuse the slots
instead of page-locking new memory (``cudaHostRegister`` of tens of megabytes takes
milliseconds). An epoch stages through its own ``stop`` flag: a producer waiting for a
slot gives up when its epoch is closed. :meth:`StagingPool.close` waits for outstanding
copies and returns every buffer to the device API.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final

import torch

from dataloaderx.backends._device_api import DeviceAPI
from dataloaderx.backends._host_copy import Segment

__all__ = ["ALIGNMENT", "StagingPool", "dense_span", "staged_view"]

#: Byte alignment of each tensor inside a slot (a multiple of every dtype's size).
ALIGNMENT: Final = 512
#: Longest sleep while polling a copy's event for a slot to become free.
_LONGEST_POLL_SECONDS: Final = 0.001
#: How long :meth:`StagingPool.close` waits for outstanding copies before giving up on
#: returning their buffers (they are then left to the garbage collector, still pinned).
_CLOSE_WAIT_SECONDS: Final = 1.0


#: Marks a slot handed out by :meth:`StagingPool.stage` and not yet released.
_RESERVED: Final = object()
#: Buffers a stalled copy may still read when their pool closed; kept for good.
_NEVER_RETURNED: list[torch.Tensor] = []


def _aligned(nbytes: int) -> int:
    return -(-nbytes // ALIGNMENT) * ALIGNMENT


def dense_span(tensor: torch.Tensor) -> bool:
    """Whether ``tensor`` covers exactly ``numel`` elements of memory in some dim order.

    True for contiguous tensors and for permuted layouts such as ``channels_last``;
    false for slices with gaps and for expanded (stride 0) tensors.
    """
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
    """A view of ``buffer`` at ``offset`` shaped like ``tensor``, and the copy that fills it.

    The copy is ``(destination, source)`` for :class:`CopyThreads`. For a dense tensor
    both sides are flat views of the same bytes in memory order, and the staged view
    keeps the tensor's strides (``channels_last`` stays ``channels_last``); otherwise
    the staged view is contiguous and the copy gathers the tensor's elements.
    """
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
    #: The event behind the last copies that read this slot; ``None`` once they ended.
    busy_until: Any = None

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

        The caller runs the copies and enqueues the device copies that read the views,
        then calls :meth:`release_after` with the event recorded behind them, or
        :meth:`release` if it fails before that. While every slot is in use it waits,
        until a slot frees up, the pool closes or ``stop()`` returns true (both raise
        ``RuntimeError``).
        """
        sizes = [_aligned(t.numel() * t.element_size()) for t in tensors]
        slot = self._acquire(sum(sizes), stop)
        views: list[torch.Tensor] = []
        segments: list[Segment] = []
        offset = 0
        for tensor, size in zip(tensors, sizes, strict=True):
            view, segment = staged_view(slot.buffer, offset, tensor)
            views.append(view)
            segments.append(segment)
            offset += size
        return slot, views, segments

    def release_after(self, slot: _Slot, event: Any) -> None:
        """Let ``slot`` be reused once ``event`` has completed."""
        slot.busy_until = event

    def release(self, slot: _Slot) -> None:
        """Let ``slot`` be reused now: nothing was enqueued that reads it."""
        slot.busy_until = None

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
        elif len(self._slots) < self._max_slots or free:
            if free:  # replace the smallest free slot, so the count stays bounded
                smallest = min(free, key=lambda slot: slot.capacity)
                self._slots.remove(smallest)
                self._api.unpin_buffer(smallest.buffer)
            chosen = _Slot(self._api.pin_buffer(nbytes))
            self._slots.append(chosen)
        else:
            return None
        # Oldest use first: move the chosen slot to the end.
        self._slots.remove(chosen)
        self._slots.append(chosen)
        return chosen

    def _is_free(self, slot: _Slot) -> bool:
        event = slot.busy_until
        if event is None:
            return True
        if event is _RESERVED:
            return False
        if self._api.event_done(event):
            slot.busy_until = None
            return True
        return False

    def close(self) -> None:
        """Wait (briefly) for outstanding copies, then return every buffer; idempotent.

        A buffer still in use after that wait (a stalled device, or a producer thread
        that outlived its ``close()``) is never returned, so that nothing can reuse
        memory a copy may still read.
        """
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
