"""``auto``: the ``cuda`` backend where an accelerator is present, else ``thread``."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any, TypeVar

import torch

from dataloaderx.backends.cuda import CudaBackend
from dataloaderx.contracts.backend import BatchStream, InlineMode
from dataloaderx.contracts.policy import ModePolicy
from dataloaderx.device.options import format_for
from dataloaderx.engine import decision
from dataloaderx.engine.producer import Hooks, start_producer
from dataloaderx.util.tree import map_tensors

__all__ = ["AutoBackend"]

T = TypeVar("T")


def _on_host(
    transform: Callable[[Any], Any] | None, memory_format: torch.memory_format | None, batch: Any
) -> Any:
    if memory_format is not None:
        batch = map_tensors(lambda t: t.to(memory_format=format_for(t, memory_format)), batch)
    return batch if transform is None else transform(batch)


class AutoBackend(CudaBackend):
    """``cuda`` when an accelerator is present, else ``thread``: one config for both.

    Takes the ``cuda`` options and validates all of them on every machine. Without an
    accelerator batches stay on the CPU: ``depth``, ``max_depth``, ``max_bytes`` (of host
    memory), ``transform`` and ``memory_format`` apply in the producer thread; ``device``,
    ``non_blocking`` and ``pin_threads`` have no effect, and non-default values warn once, at
    construction. ``adaptive`` works as in ``cuda``, or without an accelerator as in ``thread``.
    """

    @classmethod
    def unavailable_reason(cls) -> str | None:
        return None

    def machine_accelerator(self) -> str | None:
        if CudaBackend.unavailable_reason() is not None:
            return None
        return type(self).device_api.accelerator_type()

    @property
    def resolved(self) -> str:
        """Which backend this one runs as on this machine."""
        return "thread" if self.machine_accelerator() is None else "cuda"

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "resolved": self.resolved}

    def _validated(self) -> None:
        on_cpu = self.machine_accelerator() is None
        if on_cpu and (self.device is not None or not self.non_blocking or self.pin_threads):
            warnings.warn(
                f"backend 'auto' found no accelerator and runs as 'thread': batches stay on "
                f"the CPU, so device={self.device!r}, non_blocking={self.non_blocking!r} and "
                f"pin_threads={self.pin_threads!r} have no effect (depth, transform and "
                "memory_format still apply)",
                UserWarning,
                stacklevel=4,
            )

    def _init_runtime_state(self) -> None:
        on_cpu = self.resolved == "thread"
        self._host_policy = decision.new_policy() if self.adaptive and on_cpu else None
        super()._init_runtime_state()

    def _device_policy(self) -> ModePolicy | None:
        return super()._device_policy() if self.resolved == "cuda" else None

    def _on_host(self) -> Callable[[Any], Any] | None:
        if self.transform is None and self.memory_format is None:
            return None
        return partial(_on_host, self.transform, self.memory_format)

    def pins_host_memory(self) -> bool:
        return self.resolved == "cuda"

    def inline_mode(self) -> InlineMode | None:
        if self.resolved == "cuda":
            return super().inline_mode()
        policy = self._host_policy
        return None if policy is None else InlineMode(policy, self._on_host())

    def open(self, source: Iterator[T]) -> BatchStream[T]:
        if self.resolved == "cuda":
            return super().open(source)
        return start_producer(source, self, Hooks(prepare=self._on_host()))
