"""Ray Train: a loader built in a training worker of several, without a
``DistributedSampler``.

Ray Train's ``ray.train.torch.prepare_data_loader`` replaces such a loader with a plain
``torch.utils.data.DataLoader`` built from its attributes (worker processes, no prefetch
backend, none of this package's options), and without it each rank reads the whole
dataset; :func:`warn_if_replaced` says so when the loader is built. Ray is not imported:
a training worker has imported ``ray.train`` already.
"""

from __future__ import annotations

import sys
import warnings
from typing import Any

from torch.utils.data import DistributedSampler, IterableDataset

__all__ = ["warn_if_replaced"]


def _world_size() -> int:
    """The world size of the Ray Train run this process works in; 0 outside one."""
    train = sys.modules.get("ray.train")
    if train is None:
        return 0
    try:
        return int(train.get_context().get_world_size())
    except Exception:  # noqa: BLE001 - not in a training function
        return 0


def warn_if_replaced(loader: Any) -> None:
    """Warn where ``loader`` is built in a Ray Train worker of several without a
    ``DistributedSampler`` (see the module's notes)."""
    if isinstance(loader.sampler, DistributedSampler) or isinstance(
        loader.dataset, IterableDataset
    ):
        return
    world_size = _world_size()
    if world_size > 1:
        warnings.warn(
            f"DataLoaderX is built in a Ray Train worker (world size {world_size}) without a "
            "DistributedSampler: each rank reads the whole dataset, and "
            "ray.train.torch.prepare_data_loader(loader) would replace it with a plain "
            "torch DataLoader (worker processes, no prefetch backend). Pass "
            "sampler=DistributedSampler(dataset) to DataLoaderX, and call "
            "prepare_data_loader(loader, add_dist_sampler=False) if at all",
            UserWarning,
            stacklevel=3,
        )
