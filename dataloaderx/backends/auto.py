"""``auto``: the ``cuda`` backend where an accelerator is present, else ``thread``."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any, TypeVar

import torch

from dataloaderx._tree import map_tensors
from dataloaderx.backends._device_options import (
    DeviceSpec,
    check_bool,
    check_device,
    check_memory_format,
    check_transform,
    format_for,
)
from dataloaderx.backends._engine import start_thread_stream
from dataloaderx.backends.base import Backend, BatchStream, check_positive_int
from dataloaderx.backends.cuda import CudaBackend
from dataloaderx.registry import register_backend

__all__ = ["AutoBackend"]

T = TypeVar("T")


def _on_host(
    transform: Callable[[Any], Any] | None, memory_format: torch.memory_format | None, batch: Any
) -> Any:
    """Apply ``memory_format`` and ``transform`` to a batch that stays on the CPU."""
    if memory_format is not None:
        batch = map_tensors(lambda t: t.to(memory_format=format_for(t, memory_format)), batch)
    return batch if transform is None else transform(batch)


@register_backend("auto")
class AutoBackend(Backend):
    """``cuda`` when an accelerator is present, else ``thread``: one config for both.

    Takes the ``cuda`` options and validates all of them on every machine. Without an
    accelerator, batches stay on the CPU: ``depth``, ``transform`` and ``memory_format``
    still apply (in the producer thread), while ``device`` and ``non_blocking`` have no
    effect, and setting them to anything but their defaults warns once, at construction.
    """

    def __init__(
        self,
        *,
        device: DeviceSpec = None,
        depth: int = 2,
        non_blocking: bool = True,
        transform: Callable[[Any], Any] | None = None,
        memory_format: torch.memory_format | str | None = None,
    ) -> None:
        has_accelerator = CudaBackend.unavailable_reason() is None
        api = CudaBackend.device_api
        self.device = check_device(
            self.name,
            "device",
            device,
            accelerator=api.accelerator_type() if has_accelerator else None,
            device_count=api.device_count,
        )
        self.depth = check_positive_int(self.name, "depth", depth)
        self.non_blocking = check_bool(self.name, "non_blocking", non_blocking)
        self.transform = check_transform(self.name, "transform", transform)
        self.memory_format = check_memory_format(self.name, "memory_format", memory_format)
        self.resolved = "cuda" if has_accelerator else "thread"
        self._cuda: CudaBackend | None = None
        if has_accelerator:
            self._cuda = CudaBackend(**self._options())
        elif device is not None or not non_blocking:
            warnings.warn(
                f"backend 'auto' found no accelerator and runs as 'thread': batches stay on "
                f"the CPU, so device={device!r} and non_blocking={non_blocking!r} have no "
                "effect (depth, transform and memory_format still apply)",
                UserWarning,
                stacklevel=2,
            )

    def _options(self) -> dict[str, Any]:
        return {
            "device": self.device,
            "depth": self.depth,
            "non_blocking": self.non_blocking,
            "transform": self.transform,
            "memory_format": self.memory_format,
        }

    def open(self, source: Iterator[T]) -> BatchStream[T]:
        if self._cuda is not None:
            return self._cuda.open(source)
        prepare = None
        if self.transform is not None or self.memory_format is not None:
            prepare = partial(_on_host, self.transform, self.memory_format)
        return start_thread_stream(source, backend=self.name, depth=self.depth, prepare=prepare)

    def describe(self) -> dict[str, Any]:
        return {**self._options(), "resolved": self.resolved}
