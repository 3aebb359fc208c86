"""The ``cuda`` backend's per-batch stream protocol (``docs/cuda.md``, *The stream protocol*):
:class:`StreamCopier` as a producer's hooks, or in the loop's thread alone for a large batch made
inline; a small batch made inline needs only :class:`DeviceCopy`, on the loop's stream."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch

from dataloaderx.device.api import DeviceAPI
from dataloaderx.device.host_copy import Segment
from dataloaderx.device.options import format_for
from dataloaderx.device.staging import StagingPool
from dataloaderx.util.tree import iter_tensors, map_tensors


@dataclass(frozen=True)
class _Ready:
    """A batch whose copies are enqueued, with the event that marks their end."""

    batch: Any
    event: Any
    device_tensors: tuple[torch.Tensor, ...]


class DeviceCopy(NamedTuple):
    """Copy to ``device`` on the current stream, then transform; used inline and by StreamCopier."""

    api: DeviceAPI
    device: torch.device
    non_blocking: bool
    transform: Callable[[Any], Any] | None
    memory_format: torch.memory_format | None

    def __call__(self, batch: Any, staged: dict[int, torch.Tensor] | None = None) -> Any:
        """``batch`` on the device, each tensor read from its ``staged`` view if it has one."""

        def move(tensor: torch.Tensor) -> torch.Tensor:
            source = tensor if staged is None else staged.get(id(tensor), tensor)
            return self.api.copy(
                source,
                self.device,
                non_blocking=self.non_blocking,
                memory_format=format_for(tensor, self.memory_format),
            )

        moved = map_tensors(move, batch)
        return moved if self.transform is None else self.transform(moved)


class StreamCopier:
    """Copies batches on the side stream from ``side_stream``, pageable tensors staged in
    ``staging`` by ``host_copy``: :meth:`prepare` in the thread that makes the batches (the
    stream is resolved there, first), :meth:`handout` in the loop's thread."""

    def __init__(
        self,
        copy: DeviceCopy,
        side_stream: Callable[[torch.device], Any],
        *,
        staging: StagingPool,
        host_copy: Callable[[Sequence[Segment]], None],
    ) -> None:
        self._copy = copy
        self._side_stream = side_stream
        self._stream: Any = None
        self._staging = staging
        self._host_copy = host_copy
        self._closed = threading.Event()

    def start(self) -> None:
        """Producer thread, first: the device is per thread and starts as device 0."""
        self._copy.api.set_device(self._copy.device)
        self._stream = self._side_stream(self._copy.device)

    def _pageable(self, batch: Any) -> list[torch.Tensor]:
        """The distinct non-empty host tensors of ``batch`` that are not pinned."""
        if not self._copy.non_blocking:
            return []  # blocking copies read pageable memory directly
        api = self._copy.api
        found: dict[int, torch.Tensor] = {}
        for t in iter_tensors(batch):
            if t.device.type == "cpu" and t.numel() and id(t) not in found and not api.is_pinned(t):
                found[id(t)] = t
        return list(found.values())

    def prepare(self, batch: Any) -> _Ready:
        """Stage, enqueue the batch's copies and transform, then its event."""
        if self._stream is None:  # made inline: no start()
            self._stream = self._side_stream(self._copy.device)
        pageable = self._pageable(batch)
        if not pageable:
            return self._enqueue(batch, {})
        slot, views, segments = self._staging.stage(pageable, stop=self._closed.is_set)
        try:
            self._host_copy(segments)
            ready = self._enqueue(batch, {id(t): v for t, v in zip(pageable, views, strict=True)})
        except BaseException:
            self._release_after_failure(slot)
            raise
        self._staging.release_after(slot, ready.event)
        return ready

    def _release_after_failure(self, slot: Any) -> None:
        """Free ``slot`` once whatever was enqueued before a failure has run."""
        api = self._copy.api
        try:
            event = api.new_event(self._copy.device)
            api.record_event(event, self._stream)
        except Exception:  # noqa: BLE001 - the slot then stays reserved until close()
            return
        self._staging.release_after(slot, event)

    def _enqueue(self, batch: Any, staged: dict[int, torch.Tensor]) -> _Ready:
        api, device = self._copy.api, self._copy.device
        with api.use_stream(self._stream):
            moved = self._copy(batch, staged)
            event = api.new_event(device)
            api.record_event(event, self._stream)
        device_tensors = tuple(t for t in iter_tensors(moved) if api.is_on(t, device))
        return _Ready(moved, event, device_tensors)

    def handout(self, ready: _Ready) -> Any:
        """Consumer thread: order the consumer's stream after this batch's copies."""
        api = self._copy.api
        consumer = api.current_stream(self._copy.device)
        api.wait_event(consumer, ready.event)
        for tensor in ready.device_tensors:
            api.record_stream(tensor, consumer)
        return ready.batch

    def close(self) -> None:
        """End any wait for a staging slot, now and later; safe to call twice."""
        self._closed.set()
