"""``cuda``: copy batches to the accelerator on a side stream while the model computes."""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Callable, Iterator
from typing import Any, ClassVar, Literal, TypeVar

import torch

from dataloaderx.backends import _adaptive
from dataloaderx.backends._byte_budget import batch_bytes
from dataloaderx.backends._closing import ClosingStream
from dataloaderx.backends._copy_policy import SmallBatchesOnly
from dataloaderx.backends._depth_options import DEFAULT_MAX_DEPTH, check_depth_options
from dataloaderx.backends._device_api import DeviceAPI, TorchAccelerator
from dataloaderx.backends._device_options import (
    CopyOptionAttributes,
    DeviceSpec,
    auto_pin_threads,
    check_copy_options,
)
from dataloaderx.backends._engine import start_thread_stream
from dataloaderx.backends._staging import StagingPool
from dataloaderx.backends._stream_copy import StreamCopier
from dataloaderx.backends.base import Backend, BatchStream, check_bool
from dataloaderx.registry import register_backend

__all__ = ["CudaBackend"]

T = TypeVar("T")
R = TypeVar("R")


def _device_bytes(ready: Any) -> int:
    """The bytes a prepared batch holds on the device."""
    return batch_bytes(ready.batch, device_only=True)


def _noting_size(policy: SmallBatchesOnly, prepare: Callable[[Any], R]) -> Callable[[Any], R]:
    """``prepare``, telling ``policy`` each host batch's size first."""

    def noted(batch: Any) -> R:
        if policy.large is None:  # once a batch was large, sizes no longer matter
            policy.note(batch_bytes(batch))
        return prepare(batch)

    return noted


def _close_pool(pool: StagingPool, owner_pid: int) -> None:
    """Give ``pool``'s memory back, in the process that page-locked it only."""
    if os.getpid() == owner_pid:  # a forked worker must not touch the device
        pool.close()


@register_backend("cuda", aliases=("cuda_stream",))
class CudaBackend(CopyOptionAttributes, Backend):
    """Pin and copy batches to the device on a side stream, ``depth`` batches ahead.

    Options: ``device`` (default: the current accelerator device when the epoch starts),
    ``depth``, ``non_blocking``, ``transform`` (called with the device batch, on the
    side stream), ``memory_format`` (for example ``torch.channels_last``, applied to
    tensors of the matching rank during the copy), ``pin_threads`` (threads that copy
    pageable batches into pinned staging memory; ``None``: half the cores, at most 8),
    ``max_depth`` (the ceiling of ``depth="auto"``), ``max_bytes`` (a cap on the device
    bytes buffered) and ``adaptive`` (``True``: while batches stay under 256 KiB and the
    producer thread does not pay, each batch is fetched and copied in the training
    thread instead, on its current stream). The backend pins batches itself, so a loader's
    ``pin_memory=True`` does not start DataLoader's own pin-memory thread. See
    ``docs/cuda.md``.

    The pinned staging memory (at most ``depth + 1`` batches per device) is kept from one
    epoch to the next and given back by :meth:`close` or when the backend (its loader)
    is garbage collected.
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
        limits = check_depth_options(
            self.name, depth=depth, max_depth=max_depth, max_bytes=max_bytes
        )
        api = type(self).device_api
        options = check_copy_options(
            self.name,
            accelerator=api.accelerator_type(),
            device_count=api.device_count,
            device=device,
            depth=depth,
            non_blocking=non_blocking,
            transform=transform,
            memory_format=memory_format,
            pin_threads=pin_threads,
        )
        self._set_copy_options(options)
        self.max_depth, self.max_bytes = limits.max_depth, limits.max_bytes
        self.adaptive = check_bool(self.name, "adaptive", adaptive)
        self._init_runtime_state()

    def _init_runtime_state(self) -> None:
        self._api = type(self).device_api
        self._streams: dict[torch.device, Any] = {}
        #: Per device: the staging pool, and the finaliser that closes it with the backend.
        self._staging: dict[torch.device, tuple[StagingPool, weakref.finalize[Any, Any]]] = {}
        self._lock = threading.Lock()
        self._policy = SmallBatchesOnly(_adaptive.new_policy()) if self.adaptive else None

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
        api = self._api
        kind = api.accelerator_type() or "cuda"
        spec = self.device
        if isinstance(spec, int):
            return torch.device(kind, spec)
        parsed = torch.device(kind) if spec is None else torch.device(spec)
        if parsed.index is None:
            return torch.device(parsed.type, api.current_device_index())
        return parsed

    def side_stream(self, device: torch.device) -> Any:
        """The loader's copy stream on ``device``, created on first use and then reused."""
        with self._lock:
            stream = self._streams.get(device)
            if stream is None:
                stream = self._streams[device] = self._api.new_stream(device)
            return stream

    def staging_pool(self, device: torch.device) -> StagingPool:
        """The loader's pinned staging memory for ``device``, kept across epochs."""
        with self._lock:
            held = self._staging.get(device)
            if held is None:
                pool = StagingPool(self._api, slots=self._deepest() + 1)
                held = self._staging[device] = (
                    pool,
                    weakref.finalize(self, _close_pool, pool, os.getpid()),
                )
            return held[0]

    def close(self) -> None:
        """Give back the pinned staging memory kept between epochs; safe to call twice.

        Call it between epochs (an epoch still running fails on its next batch). The next
        epoch page-locks new memory.
        """
        with self._lock:
            held, self._staging = list(self._staging.values()), {}
        for _pool, release in held:
            release()

    def pins_host_memory(self) -> bool:
        return True

    def _deepest(self) -> int:
        """The most batches the buffer may hold: ``depth``, or the ceiling of ``"auto"``."""
        if isinstance(self.depth, int):
            return self.depth
        return self.max_depth or DEFAULT_MAX_DEPTH

    def open(self, source: Iterator[T]) -> BatchStream[T]:
        device = self.target_device()
        copier = StreamCopier(
            self._api,
            device,
            self.side_stream,
            non_blocking=self.non_blocking,
            transform=self.transform,
            memory_format=self.memory_format,
            pin_threads=self.pin_threads or auto_pin_threads(),
            staging=self.staging_pool(device),
            thread_name=f"dataloaderx-{self.name}-pin",
        )
        options: dict[str, Any] = {
            "backend": self.name,
            "depth": self.depth,
            "on_start": copier.start,
            "prepare": copier.prepare,
            "handout": copier.handout,
            "max_depth": self.max_depth,
            "max_bytes": self.max_bytes,
            "measure": _device_bytes,
        }
        stream: BatchStream[T]
        if self._policy is None:
            stream = start_thread_stream(source, **options)
        else:
            policy = self._policy
            options["prepare"] = _noting_size(policy, copier.prepare)
            stream = _adaptive.start_adaptive_stream(
                source,
                inline_prepare=_noting_size(policy, copier.prepare_inline),
                policy=policy,
                **options,
            )
        return ClosingStream(stream, copier.close)

    def __getstate__(self) -> dict[str, Any]:
        return self.describe()  # streams and locks belong to this process

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._init_runtime_state()
