"""A batch that the ``cuda`` backend makes inline, in the loop's thread (``docs/design.md``,
*Inline batches on a device*): a small one copied on the loop's stream, a larger one staged
and copied on the side stream, so that its copy overlaps the step as a prefetched one does."""

from __future__ import annotations

from typing import Any, Final

from dataloaderx.device.copier import DeviceCopy, StreamCopier
from dataloaderx.device.host_copy import copy_with_own_pool
from dataloaderx.device.resources import DeviceResources
from dataloaderx.engine.byte_budget import batch_bytes

#: Largest batch (tensor bytes) copied on the loop's stream: ~5 us at ~50 GB/s, less than the
#: side stream's event and stream calls cost.
SMALL_BATCH_BYTES: Final = 256 * 1024


class InlineCopy:
    """Copies each batch made inline; called in the loop's thread only."""

    def __init__(self, copy: DeviceCopy, resources: DeviceResources) -> None:
        self._copy = copy
        self._resources = resources
        self._staged: StreamCopier | None = None  #: made at the first large batch

    def __call__(self, batch: Any) -> Any:
        if batch_bytes(batch) <= SMALL_BATCH_BYTES:
            return self._copy(batch)
        staged = self._staged
        if staged is None:
            device = self._copy.device
            staged = self._staged = StreamCopier(
                self._copy,
                self._resources.side_stream,
                staging=self._resources.staging_pool(device),
                host_copy=copy_with_own_pool,
            )
        return staged.handout(staged.prepare(batch))
