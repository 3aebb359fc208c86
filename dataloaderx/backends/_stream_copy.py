"""The per-batch stream protocol of the ``cuda`` backend, as engine hooks.

Producer thread (``start`` once, then ``prepare`` per batch):

1. ``start``: select the target device, then fetch the loader's side stream.
2. ``prepare``: with ``non_blocking``, pack the batch's pageable host tensors into a
   slot of pinned staging memory (:mod:`~dataloaderx.backends._staging`), copying on
   ``pin_threads`` threads of our own (:mod:`~dataloaderx.backends._host_copy`); enqueue
   each tensor's copy to the device on the side stream, run the optional ``transform``
   there too, then record one event on the side stream for this batch. The staging slot
   is reused only once that event has completed.

Consumer thread (``handout`` per batch, just before the batch is returned):

3. make the consumer's current stream wait on that batch's event only (not on the whole
   side stream, which may already hold later batches' copies);
4. ``record_stream(consumer stream)`` on every device tensor of the batch, so the caching
   allocator, which only knows the side stream the memory was allocated on, does not
   reuse the memory before the consumer's work on it has run.

``close`` (after the producer thread has ended) stops the copy threads and ends any
wait for a staging slot. The staging pool belongs to the backend and outlives the epoch.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from dataloaderx._tree import iter_tensors, map_tensors
from dataloaderx.backends._device_api import DeviceAPI
from dataloaderx.backends._device_options import format_for
from dataloaderx.backends._host_copy import CopyThreads
from dataloaderx.backends._staging import StagingPool

__all__ = ["StreamCopier"]


@dataclass(frozen=True)
class _Ready:
    """A batch whose copies are enqueued, with the event that marks their end."""

    batch: Any
    event: Any
    device_tensors: tuple[torch.Tensor, ...]


class StreamCopier:
    """Copies one epoch's batches to ``device`` on the side stream from ``side_stream``."""

    def __init__(
        self,
        api: DeviceAPI,
        device: torch.device,
        side_stream: Callable[[torch.device], Any],
        *,
        non_blocking: bool,
        transform: Callable[[Any], Any] | None,
        memory_format: torch.memory_format | None,
        pin_threads: int,
        staging: StagingPool,
        thread_name: str,
    ) -> None:
        self._api = api
        self._device = device
        self._side_stream = side_stream
        self._non_blocking = non_blocking
        self._transform = transform
        self._memory_format = memory_format
        self._stream: Any = None
        self._staging = staging
        self._closed = threading.Event()
        self._copy_threads = CopyThreads(pin_threads, name=thread_name)

    def start(self) -> None:
        """Producer thread, first: the device is per thread and starts as device 0."""
        self._api.set_device(self._device)
        self._stream = self._side_stream(self._device)

    def _pageable(self, batch: Any) -> list[torch.Tensor]:
        """The distinct non-empty host tensors of ``batch`` that are not pinned."""
        if not self._non_blocking:
            return []  # blocking copies read pageable memory directly
        api = self._api
        found: dict[int, torch.Tensor] = {}
        for tensor in iter_tensors(batch):
            if (
                tensor.device.type == "cpu"
                and tensor.numel()
                and id(tensor) not in found
                and not api.is_pinned(tensor)
            ):
                found[id(tensor)] = tensor
        return list(found.values())

    def prepare(self, batch: Any) -> _Ready:
        """Producer thread: stage, enqueue the batch's copies and transform, then its event."""
        pageable = self._pageable(batch)
        if not pageable:
            return self._enqueue(batch, {})
        slot, views, segments = self._staging.stage(pageable, stop=self._closed.is_set)
        try:
            self._copy_threads.copy(segments)
            ready = self._enqueue(batch, {id(t): v for t, v in zip(pageable, views, strict=True)})
        except BaseException:
            self._release_after_failure(slot)
            raise
        self._staging.release_after(slot, ready.event)
        return ready

    def _release_after_failure(self, slot: Any) -> None:
        """Free ``slot`` once whatever was enqueued before a failure has run."""
        api = self._api
        try:
            event = api.new_event(self._device)
            api.record_event(event, self._stream)
        except Exception:  # noqa: BLE001 - the slot then stays reserved until close()
            return
        self._staging.release_after(slot, event)

    def _copied(self, batch: Any, staged: dict[int, torch.Tensor]) -> Any:
        """``batch`` copied to the device on the current stream (reading each tensor's
        staged view where it has one), then transformed."""
        api = self._api

        def move(tensor: torch.Tensor) -> torch.Tensor:
            return api.copy(
                staged.get(id(tensor), tensor),
                self._device,
                non_blocking=self._non_blocking,
                memory_format=format_for(tensor, self._memory_format),
            )

        moved = map_tensors(move, batch)
        return moved if self._transform is None else self._transform(moved)

    def _enqueue(self, batch: Any, staged: dict[int, torch.Tensor]) -> _Ready:
        api = self._api
        with api.use_stream(self._stream):
            moved = self._copied(batch, staged)
            event = api.new_event(self._device)
            api.record_event(event, self._stream)
        device_tensors = tuple(t for t in iter_tensors(moved) if api.is_on(t, self._device))
        return _Ready(moved, event, device_tensors)

    def prepare_inline(self, batch: Any) -> _Ready:
        """Consumer thread, when batches are made inline: copy on the current stream.

        Nothing overlaps an inline batch, so the side stream, the event and the staging
        buys nothing: this is ``.to(device, non_blocking=...)`` as a loop would call it,
        followed by the ``transform``.
        """
        return _Ready(self._copied(batch, {}), None, ())

    def handout(self, ready: _Ready) -> Any:
        """Consumer thread: order the consumer's stream after this batch's copies."""
        if ready.event is None:
            return ready.batch  # made inline, on the consumer's own stream
        api = self._api
        consumer = api.current_stream(self._device)
        api.wait_event(consumer, ready.event)
        for tensor in ready.device_tensors:
            api.record_stream(tensor, consumer)
        return ready.batch

    def close(self) -> None:
        """Stop the copy threads and any wait for a staging slot; safe to call twice."""
        self._closed.set()
        self._copy_threads.close()
