"""``cuda``: copy batches to the accelerator on a side stream while the model computes."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, ClassVar, Literal, TypeVar

import torch

from dataloaderx.contracts.backend import Backend, BatchStream, InlineMode
from dataloaderx.contracts.checks import check_bool
from dataloaderx.contracts.policy import ModePolicy
from dataloaderx.device.api import DeviceAPI, TorchAccelerator
from dataloaderx.device.copier import DeviceCopy, StreamCopier
from dataloaderx.device.host_copy import CopyThreads
from dataloaderx.device.inline_copy import InlineCopy
from dataloaderx.device.options import (
    DeviceSpec,
    auto_pin_threads,
    check_device,
    check_memory_format,
    check_pin_threads,
    check_transform,
)
from dataloaderx.device.resources import DeviceResources
from dataloaderx.engine import decision
from dataloaderx.engine.buffer_options import DEFAULT_MAX_DEPTH, check_depth_options
from dataloaderx.engine.byte_budget import batch_bytes
from dataloaderx.engine.producer import Hooks, start_producer

__all__ = ["CudaBackend"]

T = TypeVar("T")


def _device_bytes(ready: Any) -> int:
    return batch_bytes(ready.batch, device_only=True)


class CudaBackend(Backend):
    """Pin and copy batches to the device on a side stream, ``depth`` batches ahead.

    Options: ``device`` (default: the current device at epoch start), ``depth``, ``max_depth``
    (ceiling of ``depth="auto"``), ``max_bytes`` (cap on the device bytes buffered),
    ``non_blocking``, ``transform`` (called with the device batch, on the side stream),
    ``memory_format`` (e.g. ``torch.channels_last``, for tensors of matching rank),
    ``pin_threads`` (threads filling pinned staging memory for a producer thread; ``None``: half
    the cores, at most 8) and ``adaptive`` (make and copy batches in the training thread while
    prefetching does not pay). It pins batches itself (``pin_memory=True`` starts no pin-memory
    thread) into staging memory of at most ``depth + 1`` batches per device, kept until
    :meth:`close` or garbage collection. See ``docs/cuda.md``.
    """

    #: The accelerator operations the backend uses; tests substitute a recording fake.
    device_api: ClassVar[DeviceAPI] = TorchAccelerator()

    def __init__(
        self,
        *,
        device: DeviceSpec = None,
        depth: int | Literal["auto"] = 2,
        non_blocking: bool = True,
        transform: Callable[[Any], Any] | None = None,
        memory_format: torch.memory_format | str | None = None,
        pin_threads: int | None = None,
        max_depth: int | None = None,
        max_bytes: int | str | None = None,
        adaptive: bool = True,
    ) -> None:
        name = self.name
        buffer = check_depth_options(name, depth=depth, max_depth=max_depth, max_bytes=max_bytes)
        api = type(self).device_api
        accelerator = self.machine_accelerator()
        self.device = check_device(
            name, "device", device, accelerator=accelerator, device_count=api.device_count
        )
        self.depth = buffer.depth
        self.non_blocking = check_bool(name, "non_blocking", non_blocking)
        self.transform = check_transform(name, "transform", transform)
        self.memory_format = check_memory_format(name, "memory_format", memory_format)
        self.pin_threads = check_pin_threads(name, "pin_threads", pin_threads)
        self.max_depth, self.max_bytes = buffer.max_depth, buffer.max_bytes
        self.adaptive = check_bool(name, "adaptive", adaptive)
        self._validated()
        self._init_runtime_state()

    def machine_accelerator(self) -> str | None:
        """The accelerator the options are checked against (``None``: form only)."""
        return type(self).device_api.accelerator_type()

    def _validated(self) -> None:
        """Called once the options are checked, at construction only."""

    def _init_runtime_state(self) -> None:
        self._device = DeviceResources(type(self).device_api, slots=self._deepest() + 1)
        self._policy = self._device_policy()

    def _device_policy(self) -> ModePolicy | None:
        """The loader's mode policy on the device (``None``: always prefetch)."""
        return decision.new_policy() if self.adaptive else None

    @classmethod
    def unavailable_reason(cls) -> str | None:
        if cls.device_api.accelerator_type() is None:
            return (
                "backend 'cuda' needs a CUDA device; torch.cuda.is_available() is False; "
                "use backend='thread' or backend='auto'"
            )
        return None

    def target_device(self) -> torch.device:
        """The device batches go to, resolved in the calling thread."""
        api = self._device.api
        kind = api.accelerator_type() or "cuda"
        spec = self.device
        if isinstance(spec, int):
            return torch.device(kind, spec)
        parsed = torch.device(kind) if spec is None else torch.device(spec)
        if parsed.index is None:
            return torch.device(parsed.type, api.current_device_index())
        return parsed

    def close(self) -> None:
        """Give back the pinned staging memory kept across epochs; safe to call twice. Call it
        between epochs (a running one fails on its next batch); the next one pins anew."""
        self._device.close()

    def pins_host_memory(self) -> bool:
        return True

    def _deepest(self) -> int:
        """The most batches the buffer may hold: ``depth``, or the ceiling of ``"auto"``."""
        return self.depth if isinstance(self.depth, int) else self.max_depth or DEFAULT_MAX_DEPTH

    def _device_copy(self) -> DeviceCopy:
        """This epoch's copy to the device, resolved in the loop's thread."""
        api, device = self._device.api, self.target_device()
        return DeviceCopy(api, device, self.non_blocking, self.transform, self.memory_format)

    def inline_mode(self) -> InlineMode | None:
        policy = self._policy
        if policy is None:
            return None
        return InlineMode(policy, InlineCopy(self._device_copy(), self._device))

    def open(self, source: Iterator[T]) -> BatchStream[T]:
        copy = self._device_copy()
        threads = CopyThreads(
            self.pin_threads or auto_pin_threads(), name=f"dataloaderx-{self.name}-pin"
        )
        copier = StreamCopier(
            copy,
            self._device.side_stream,
            staging=self._device.staging_pool(copy.device),
            host_copy=threads.copy,
        )

        def after_close() -> None:
            copier.close()
            threads.close()

        hooks = Hooks(
            on_start=copier.start,
            prepare=copier.prepare,
            handout=copier.handout,
            measure=_device_bytes,
            after_close=after_close,
        )
        return start_producer(source, self, hooks)

    def __getstate__(self) -> dict[str, Any]:
        return self.describe()  # streams and locks belong to this process

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._init_runtime_state()
