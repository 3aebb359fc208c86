"""The few accelerator operations the ``cuda`` backend uses, behind one small interface.

The backend is written against :class:`DeviceAPI` only. :class:`TorchAccelerator`
implements it with the device-generic ``torch.accelerator``, ``torch.Stream`` and
``torch.Event`` (CUDA, XPU and other accelerators alike); tests substitute a recording
fake to check the stream protocol on machines without an accelerator.

Stream and event handles are opaque to the backend (typed ``Any``).
"""

from __future__ import annotations

import threading
from contextlib import AbstractContextManager
from typing import Any, Final, Protocol

import torch

__all__ = ["DeviceAPI", "TorchAccelerator"]

#: Pinned buffers are whole pages.
_PAGE: Final = 4096


def _cudart() -> Any:
    """PyTorch's bindings of the CUDA runtime (``cudaHostRegister`` and friends)."""
    return torch.cuda.cudart()  # type: ignore[no-untyped-call]


class DeviceAPI(Protocol):
    """Accelerator operations used by the ``cuda`` backend."""

    def accelerator_type(self) -> str | None:
        """The accelerator's device type (``"cuda"``, ``"xpu"``, ...), or ``None``."""
        ...

    def device_count(self) -> int:
        """How many accelerator devices this process sees."""
        ...

    def current_device_index(self) -> int:
        """The calling thread's current accelerator device index."""
        ...

    def set_device(self, device: torch.device) -> None:
        """Make ``device`` the calling thread's current device."""
        ...

    def new_stream(self, device: torch.device) -> Any:
        """Create a stream on ``device``."""
        ...

    def current_stream(self, device: torch.device) -> Any:
        """The calling thread's current stream on ``device``."""
        ...

    def use_stream(self, stream: Any) -> AbstractContextManager[Any]:
        """A context in which the calling thread's work is enqueued on ``stream``."""
        ...

    def new_event(self, device: torch.device) -> Any:
        """Create an event on ``device``."""
        ...

    def record_event(self, event: Any, stream: Any) -> None:
        """Record ``event`` on ``stream`` (it completes when the work enqueued so far does)."""
        ...

    def wait_event(self, stream: Any, event: Any) -> None:
        """Make future work on ``stream`` wait until ``event`` has completed."""
        ...

    def is_pinned(self, tensor: torch.Tensor) -> bool:
        """Whether ``tensor`` is in page-locked host memory."""
        ...

    def pin_buffer(self, nbytes: int) -> torch.Tensor:
        """A new 1-D ``uint8`` host tensor of at least ``nbytes`` bytes, page-locked."""
        ...

    def unpin_buffer(self, buffer: torch.Tensor) -> None:
        """Give back a buffer from :meth:`pin_buffer`; no copy may still read it."""
        ...

    def event_done(self, event: Any) -> bool:
        """Whether all work recorded before ``event`` has completed."""
        ...

    def copy(
        self,
        tensor: torch.Tensor,
        device: torch.device,
        *,
        non_blocking: bool,
        memory_format: torch.memory_format,
    ) -> torch.Tensor:
        """Copy ``tensor`` to ``device`` on the calling thread's current stream."""
        ...

    def is_on(self, tensor: torch.Tensor, device: torch.device) -> bool:
        """Whether ``tensor``'s memory belongs to ``device``'s caching allocator."""
        ...

    def record_stream(self, tensor: torch.Tensor, stream: Any) -> None:
        """Tell the caching allocator that ``stream`` uses ``tensor``'s memory."""
        ...


class TorchAccelerator:
    """:class:`DeviceAPI` on ``torch.accelerator``, ``torch.Stream`` and ``torch.Event``.

    Pinned buffers are page-locked with ``cudaHostRegister`` where CUDA is present, and
    come from PyTorch's pinned-memory allocator otherwise.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        #: Buffers handed out: their size, and whether cudaHostRegister locked them.
        self._held: dict[int, tuple[int, bool]] = {}
        #: Bytes page-locked through :meth:`pin_buffer` now, and at most.
        self.pinned_bytes = 0
        self.peak_pinned_bytes = 0

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
            # Page-lock plain host memory: exactly ``size`` bytes, given back to the system
            # by unpin_buffer. PyTorch's pinned-memory cache would round every buffer up
            # to a power of two and keep it for the life of the process.
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
