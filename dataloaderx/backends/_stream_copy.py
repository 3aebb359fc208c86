"""The per-batch stream protocol of the ``cuda`` backend, as three engine hooks.

Producer thread (``start`` once, then ``prepare`` per batch):

1. ``start``: select the target device, then fetch the loader's side stream.
2. ``prepare``: pin host tensors that are not pinned (with ``non_blocking``), enqueue
   each copy on the side stream, run the optional ``transform`` there too, then record
   one event on the side stream for this batch.

Consumer thread (``handout`` per batch, just before the batch is returned):

3. make the consumer's current stream wait on that batch's event only (not on the whole
   side stream, which may already hold later batches' copies);
4. ``record_stream(consumer stream)`` on every device tensor of the batch, so the caching
   allocator, which only knows the side stream the memory was allocated on, does not
   reuse the memory before the consumer's work on it has run.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from dataloaderx._tree import iter_tensors, map_tensors
from dataloaderx.backends._device_api import DeviceAPI
from dataloaderx.backends._device_options import format_for

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
    ) -> None:
        self._api = api
        self._device = device
        self._side_stream = side_stream
        self._non_blocking = non_blocking
        self._transform = transform
        self._memory_format = memory_format
        self._stream: Any = None

    def start(self) -> None:
        """Producer thread, first: the device is per thread and starts as device 0."""
        self._api.set_device(self._device)
        self._stream = self._side_stream(self._device)

    def _move(self, tensor: torch.Tensor) -> torch.Tensor:
        api = self._api
        if self._non_blocking and tensor.device.type == "cpu" and not api.is_pinned(tensor):
            tensor = api.pin(tensor)
        return api.copy(
            tensor,
            self._device,
            non_blocking=self._non_blocking,
            memory_format=format_for(tensor, self._memory_format),
        )

    def prepare(self, batch: Any) -> _Ready:
        """Producer thread: enqueue the batch's copies and transform, then its event."""
        api = self._api
        with api.use_stream(self._stream):
            moved = map_tensors(self._move, batch)
            if self._transform is not None:
                moved = self._transform(moved)
            event = api.new_event(self._device)
            api.record_event(event, self._stream)
        device_tensors = tuple(t for t in iter_tensors(moved) if api.is_on(t, self._device))
        return _Ready(moved, event, device_tensors)

    def handout(self, ready: _Ready) -> Any:
        """Consumer thread: order the consumer's stream after this batch's copies."""
        api = self._api
        consumer = api.current_stream(self._device)
        api.wait_event(consumer, ready.event)
        for tensor in ready.device_tensors:
            api.record_stream(tensor, consumer)
        return ready.batch
