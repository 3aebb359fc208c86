"""What a ``cuda`` loader keeps from one epoch to the next, per device."""

from __future__ import annotations

import os
import threading
import weakref
from typing import Any

import torch

from dataloaderx.device.api import DeviceAPI
from dataloaderx.device.staging import StagingPool


def _close_pool(pool: StagingPool, owner_pid: int) -> None:
    """Give ``pool``'s memory back, in the process that page-locked it only."""
    if os.getpid() == owner_pid:  # a forked worker must not touch the device
        pool.close()


class DeviceResources:
    """A loader's copy stream and pinned staging memory per device; thread-safe. Made on first
    use and kept across epochs (new streams grow reserved memory; pinning takes milliseconds)
    until :meth:`close` or garbage collection with the loader's backend."""

    def __init__(self, api: DeviceAPI, slots: int) -> None:
        self.api = api
        self._slots = slots
        self._lock = threading.Lock()
        self._streams: dict[torch.device, Any] = {}
        #: Per device: the staging pool, and the finaliser that closes it with this object.
        self._staging: dict[torch.device, tuple[StagingPool, weakref.finalize[Any, Any]]] = {}

    def side_stream(self, device: torch.device) -> Any:
        with self._lock:
            stream = self._streams.get(device)
            if stream is None:
                stream = self._streams[device] = self.api.new_stream(device)
            return stream

    def staging_pool(self, device: torch.device) -> StagingPool:
        with self._lock:
            held = self._staging.get(device)
            if held is None:
                pool = StagingPool(self.api, slots=self._slots)
                finalizer = weakref.finalize(self, _close_pool, pool, os.getpid())
                held = self._staging[device] = (pool, finalizer)
            return held[0]

    def close(self) -> None:
        """Give back the staging memory; safe to call twice (the next epoch makes more)."""
        with self._lock:
            held, self._staging = list(self._staging.values()), {}
        for _pool, release in held:
            release()
