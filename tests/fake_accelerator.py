"""A recording stand-in for the ``cuda`` backend's device API, for machines without a GPU.

"Device" tensors are CPU clones, so batch values can be compared with a plain
``DataLoader``; every call is logged with the thread it ran in and the stream it
concerns, so tests can check the stream protocol's order of operations.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch

KIND = "privateuseone"


@dataclass(eq=False)
class FakeStream:
    name: str
    device: torch.device


@dataclass(eq=False)
class FakeEvent:
    number: int
    device: torch.device
    recorded_on: FakeStream | None = None
    recorded_at: int | None = None  # position in the call log


@dataclass(frozen=True)
class Call:
    op: str
    thread: str
    stream: FakeStream | None = None  # the stream the operation is enqueued on or concerns
    target: Any = None  # a tensor, an event or a device
    details: dict[str, Any] = field(default_factory=dict)


class RecordingAccelerator:
    """Implements ``dataloaderx.device.api.DeviceAPI`` and logs every call."""

    def __init__(self, device_count: int = 2) -> None:
        self.calls: list[Call] = []
        self.streams_created: list[FakeStream] = []
        self._count = device_count
        self._lock = threading.Lock()
        self._local = threading.local()
        self._defaults: dict[torch.device, FakeStream] = {}
        self._events = 0
        self._pinned: set[int] = set()
        #: Pinned bytes held now, and at most, through pin_buffer.
        self.pinned_bytes = 0
        self.peak_pinned_bytes = 0
        #: Numbers of events that have not "completed" yet (all complete by default).
        self.pending_events: set[int] = set()

    # -- bookkeeping ------------------------------------------------------------------

    def _log(self, op: str, **kwargs: Any) -> int:
        with self._lock:
            self.calls.append(Call(op, threading.current_thread().name, **kwargs))
            return len(self.calls) - 1

    def ops(self, *names: str) -> list[Call]:
        return [call for call in self.calls if call.op in names]

    def _current(self) -> dict[torch.device, FakeStream]:
        if not hasattr(self._local, "streams"):
            self._local.streams = {}
        current: dict[torch.device, FakeStream] = self._local.streams
        return current

    # -- DeviceAPI --------------------------------------------------------------------

    def accelerator_type(self) -> str | None:
        return KIND

    def device_count(self) -> int:
        return self._count

    def current_device_index(self) -> int:
        index: int = getattr(self._local, "index", 0)
        return index

    def set_device(self, device: torch.device) -> None:
        self._local.index = device.index
        self._log("set_device", target=device)

    def new_stream(self, device: torch.device) -> FakeStream:
        stream = FakeStream(f"side-{len(self.streams_created)}", device)
        self.streams_created.append(stream)
        self._log("new_stream", stream=stream, target=device)
        return stream

    def current_stream(self, device: torch.device) -> FakeStream:
        stream = self._current().get(device)
        if stream is None:
            with self._lock:
                stream = self._defaults.setdefault(device, FakeStream("default", device))
        return stream

    @contextmanager
    def use_stream(self, stream: FakeStream) -> Iterator[FakeStream]:
        current = self._current()
        previous = current.get(stream.device)
        current[stream.device] = stream
        try:
            yield stream
        finally:
            if previous is None:
                del current[stream.device]
            else:
                current[stream.device] = previous

    def new_event(self, device: torch.device) -> FakeEvent:
        with self._lock:
            self._events += 1
            return FakeEvent(self._events, device)

    def record_event(self, event: FakeEvent, stream: FakeStream) -> None:
        event.recorded_on = stream
        event.recorded_at = self._log("record_event", stream=stream, target=event)

    def wait_event(self, stream: FakeStream, event: FakeEvent) -> None:
        self._log("wait_event", stream=stream, target=event)

    def is_pinned(self, tensor: torch.Tensor) -> bool:
        with self._lock:
            return tensor.untyped_storage().data_ptr() in self._pinned

    def pin(self, tensor: torch.Tensor) -> torch.Tensor:
        """Test helper (not part of the API): a "pinned" copy, as a collate_fn might make."""
        pinned = tensor.clone()
        with self._lock:
            self._pinned.add(pinned.untyped_storage().data_ptr())
        return pinned

    def pin_buffer(self, nbytes: int) -> torch.Tensor:
        buffer = torch.empty(nbytes, dtype=torch.uint8)
        with self._lock:
            self._pinned.add(buffer.data_ptr())
            self.pinned_bytes += nbytes
            self.peak_pinned_bytes = max(self.peak_pinned_bytes, self.pinned_bytes)
        self._log("pin_buffer", target=buffer, details={"nbytes": nbytes})
        return buffer

    def unpin_buffer(self, buffer: torch.Tensor) -> None:
        with self._lock:
            self._pinned.remove(buffer.data_ptr())
            self.pinned_bytes -= buffer.numel()
        self._log("unpin_buffer", target=buffer)

    def event_done(self, event: FakeEvent) -> bool:
        return event.number not in self.pending_events

    def copy(
        self,
        tensor: torch.Tensor,
        device: torch.device,
        *,
        non_blocking: bool,
        memory_format: torch.memory_format,
    ) -> torch.Tensor:
        moved = tensor.clone(memory_format=memory_format)
        self._log(
            "copy",
            stream=self.current_stream(device),
            target=moved,
            details={
                "source": tensor,
                "source_pinned": self.is_pinned(tensor),
                "device": device,
                "non_blocking": non_blocking,
                "memory_format": memory_format,
            },
        )
        return moved

    def is_on(self, tensor: torch.Tensor, device: torch.device) -> bool:
        return True  # every tensor a handed-out batch holds counts as device memory here

    def record_stream(self, tensor: torch.Tensor, stream: FakeStream) -> None:
        self._log("record_stream", stream=stream, target=tensor)
