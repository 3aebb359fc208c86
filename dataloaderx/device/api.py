"""The accelerator operations the ``cuda`` backend uses (``docs/cuda.md``, *Device-agnostic
seam*); tests replace :class:`TorchAccelerator` with a recording fake of :class:`DeviceAPI`."""

from __future__ import annotations

import threading
from contextlib import AbstractContextManager
from typing import Any, Final, Protocol

import torch

_PAGE: Final = 4096  #: pinned buffers are whole pages


def _cudart() -> Any:
    return torch.cuda.cudart()  # type: ignore[no-untyped-call]


class DeviceAPI(Protocol):
    """Accelerator operations the ``cuda`` backend uses. "Current" is the calling thread's:
    each thread has its own current device and, per device, its own current stream. Every
    method may be called from any thread; none blocks on the device unless it says so."""

    def accelerator_type(self) -> str | None:
        """The accelerator's device type (``"cuda"``, ``"xpu"``, ...), or ``None`` if this
        process has none it can use. Touches no device."""

    def device_count(self) -> int:
        """How many devices of that type this process sees; 0 without an accelerator."""

    def current_device_index(self) -> int:
        """The calling thread's current device (0 in a thread that never set one)."""

    def set_device(self, device: torch.device) -> None:
        """Make ``device`` the calling thread's current device; other threads keep theirs."""

    def new_stream(self, device: torch.device) -> Any:
        """A new stream on ``device``, apart from its default stream: work enqueued on it
        runs in order with itself only."""

    def current_stream(self, device: torch.device) -> Any:
        """The calling thread's current stream on ``device`` (its default stream unless a
        :meth:`use_stream` block is open in this thread)."""

    def use_stream(self, stream: Any) -> AbstractContextManager[Any]:
        """A context in which the calling thread's work on the stream's device is enqueued on
        ``stream``; leaving it restores the previous current stream."""

    def new_event(self, device: torch.device) -> Any:
        """A new event on ``device``, not yet recorded."""

    def record_event(self, event: Any, stream: Any) -> None:
        """Record ``event`` on ``stream``: it completes once all work enqueued on ``stream``
        so far has completed. Returns at once."""

    def wait_event(self, stream: Any, event: Any) -> None:
        """Make all work enqueued on ``stream`` from now on wait until ``event`` completed.
        Returns at once; the host does not wait."""

    def is_pinned(self, tensor: torch.Tensor) -> bool:
        """Whether ``tensor`` lies in page-locked host memory, from which a non-blocking copy
        to the device really is asynchronous."""

    def pin_buffer(self, nbytes: int) -> torch.Tensor:
        """A new page-locked, 1-D ``uint8`` host tensor of at least ``nbytes`` bytes (whole
        pages), kept until :meth:`unpin_buffer`."""

    def unpin_buffer(self, buffer: torch.Tensor) -> None:
        """Give back a buffer from :meth:`pin_buffer`. The caller guarantees that no copy
        enqueued on any stream may still read it."""

    def event_done(self, event: Any) -> bool:
        """Whether all work recorded before ``event`` has completed; never waits."""

    def copy(
        self,
        tensor: torch.Tensor,
        device: torch.device,
        *,
        non_blocking: bool,
        memory_format: torch.memory_format,
    ) -> torch.Tensor:
        """``tensor`` copied to ``device`` in ``memory_format``, enqueued on the calling
        thread's current stream of that device. With ``non_blocking`` and pinned memory the
        copy may still run when this returns: the source must not change before it ends."""

    def is_on(self, tensor: torch.Tensor, device: torch.device) -> bool:
        """Whether ``tensor``'s memory belongs to ``device``'s caching allocator."""

    def record_stream(self, tensor: torch.Tensor, stream: Any) -> None:
        """Tell ``tensor``'s caching allocator that ``stream`` uses its memory: the memory is
        not reused, once freed, before the work enqueued on ``stream`` by then completed."""


class TorchAccelerator:
    """:class:`DeviceAPI` on ``torch.accelerator``, ``torch.Stream`` and ``torch.Event``; pins
    with ``cudaHostRegister`` where CUDA is present, else PyTorch's pinned-memory allocator."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        #: Buffers handed out: their size, and whether cudaHostRegister locked them.
        self._held: dict[int, tuple[int, bool]] = {}
        self.pinned_bytes = 0  #: bytes page-locked through :meth:`pin_buffer` now
        self.peak_pinned_bytes = 0  #: the most page-locked at once

    def accelerator_type(self) -> str | None:
        accelerator = torch.accelerator.current_accelerator(check_available=True)
        return None if accelerator is None else accelerator.type

    def device_count(self) -> int:
        return torch.accelerator.device_count()

    def current_device_index(self) -> int:
        return torch.accelerator.current_device_index()

    def set_device(self, device: torch.device) -> None:
        torch.accelerator.set_device_index(device)

    def new_stream(self, device: torch.device) -> torch.Stream:
        return torch.Stream(device=device)

    def current_stream(self, device: torch.device) -> torch.Stream:
        return torch.accelerator.current_stream(device)

    def use_stream(self, stream: torch.Stream) -> AbstractContextManager[Any]:
        return stream  # ``with stream:`` makes it the thread's current stream

    def new_event(self, device: torch.device) -> torch.Event:
        return torch.Event(device=device)

    def record_event(self, event: torch.Event, stream: torch.Stream) -> None:
        event.record(stream)

    def wait_event(self, stream: torch.Stream, event: torch.Event) -> None:
        stream.wait_event(event)

    def is_pinned(self, tensor: torch.Tensor) -> bool:
        return tensor.is_pinned()

    def pin_buffer(self, nbytes: int) -> torch.Tensor:
        size = max(_PAGE, -(-nbytes // _PAGE) * _PAGE)
        registered = False
        if torch.cuda.is_available():
            # Exactly ``size`` bytes, freed by unpin_buffer: PyTorch's pinned-memory cache
            # would round it up to a power of two and keep it for the life of the process.
            buffer = torch.empty(size, dtype=torch.uint8)
            registered = int(_cudart().cudaHostRegister(buffer.data_ptr(), size, 0)) == 0
        if not registered:
            buffer = torch.empty(size, dtype=torch.uint8, pin_memory=True)
        with self._lock:
            self._held[buffer.data_ptr()] = (size, registered)
            self.pinned_bytes += size
            self.peak_pinned_bytes = max(self.peak_pinned_bytes, self.pinned_bytes)
        return buffer

    def unpin_buffer(self, buffer: torch.Tensor) -> None:
        pointer = buffer.data_ptr()
        with self._lock:
            size, registered = self._held.pop(pointer, (0, False))
            self.pinned_bytes -= size
        if registered:
            _cudart().cudaHostUnregister(pointer)

    def event_done(self, event: torch.Event) -> bool:
        return event.query()

    def copy(
        self,
        tensor: torch.Tensor,
        device: torch.device,
        *,
        non_blocking: bool,
        memory_format: torch.memory_format,
    ) -> torch.Tensor:
        return tensor.to(device, non_blocking=non_blocking, memory_format=memory_format)

    def is_on(self, tensor: torch.Tensor, device: torch.device) -> bool:
        return tensor.device == device

    def record_stream(self, tensor: torch.Tensor, stream: torch.Stream) -> None:
        tensor.record_stream(stream)
