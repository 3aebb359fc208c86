"""``auto``: the ``cuda`` backend where an accelerator is present, else ``thread``."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any, Literal, TypeVar

import torch

from dataloaderx._tree import map_tensors
from dataloaderx.backends import _adaptive
from dataloaderx.backends._depth_options import check_depth_options
from dataloaderx.backends._device_options import (
    CopyOptionAttributes,
    DeviceSpec,
    check_copy_options,
    format_for,
)
from dataloaderx.backends._engine import start_thread_stream
from dataloaderx.backends.base import Backend, BatchStream, check_bool
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
class AutoBackend(CopyOptionAttributes, Backend):
    """``cuda`` when an accelerator is present, else ``thread``: one config for both.

    Takes the ``cuda`` options and validates all of them on every machine. Without an
    accelerator, batches stay on the CPU: ``depth``, ``max_depth``, ``max_bytes`` (then
    counting host bytes), ``transform`` and ``memory_format`` still apply (in the
    producer thread), while ``device`` and ``non_blocking`` have no effect, and setting
    them to anything but their defaults warns once, at construction. ``adaptive`` is
    passed on: on the accelerator to ``cuda``, and without one it prefetches only while
    that pays, as ``thread`` does, unless ``adaptive=False``.
    """

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
        limits = check_depth_options(
            self.name, depth=depth, max_depth=max_depth, max_bytes=max_bytes
        )
        self.max_depth, self.max_bytes = limits.max_depth, limits.max_bytes
        self.adaptive = check_bool(self.name, "adaptive", adaptive)
        has_accelerator = CudaBackend.unavailable_reason() is None
        api = CudaBackend.device_api
        self._options = check_copy_options(
            self.name,
            accelerator=api.accelerator_type() if has_accelerator else None,
            device_count=api.device_count,
            device=device,
            depth=depth,
            non_blocking=non_blocking,
            transform=transform,
            memory_format=memory_format,
            pin_threads=pin_threads,
        )
        self._set_copy_options(self._options)
        self.resolved = "cuda" if has_accelerator else "thread"
        self._policy = _adaptive.new_policy() if adaptive and not has_accelerator else None
        self._cuda: CudaBackend | None = None
        if has_accelerator:
            self._cuda = CudaBackend(
                **self._options._asdict(),
                max_depth=max_depth,
                max_bytes=max_bytes,
                adaptive=adaptive,
            )
        elif device is not None or not non_blocking or pin_threads is not None:
            warnings.warn(
                f"backend 'auto' found no accelerator and runs as 'thread': batches stay on "
                f"the CPU, so device={device!r}, non_blocking={non_blocking!r} and "
                f"pin_threads={pin_threads!r} have no effect (depth, transform and "
                "memory_format still apply)",
                UserWarning,
                stacklevel=2,
            )

    def pins_host_memory(self) -> bool:
        return self._cuda is not None

    def close(self) -> None:
        if self._cuda is not None:
            self._cuda.close()

    def open(self, source: Iterator[T]) -> BatchStream[T]:
        if self._cuda is not None:
            return self._cuda.open(source)
        prepare = None
        if self.transform is not None or self.memory_format is not None:
            prepare = partial(_on_host, self.transform, self.memory_format)
        limits: dict[str, Any] = {"max_depth": self.max_depth, "max_bytes": self.max_bytes}
        if self._policy is None:
            return start_thread_stream(
                source, backend=self.name, depth=self.depth, prepare=prepare, **limits
            )
        return _adaptive.start_adaptive_stream(
            source,
            backend=self.name,
            depth=self.depth,
            prepare=prepare,
            policy=self._policy,
            **limits,
        )

    def describe(self) -> dict[str, Any]:
        return {
            **self._options._asdict(),
            "max_depth": self.max_depth,
            "max_bytes": self.max_bytes,
            "adaptive": self.adaptive,
            "resolved": self.resolved,
        }
