"""``num_workers="auto"`` and its bounds: the ``min_workers`` and ``max_workers`` keys of
``worker_options``, checked once, when the loader is built."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final, NamedTuple

from dataloaderx.util.cores import usable_cores

__all__ = ["AUTO", "BOUND_KEYS", "AutoWorkers", "Bounds", "elastic_bounds"]

#: The ``num_workers`` that asks for an elastic pool.
AUTO: Final = "auto"
#: The ``worker_options`` keys that bound it.
BOUND_KEYS: Final = ("min_workers", "max_workers")


class Bounds(NamedTuple):
    """Where an elastic pool's worker count stays, and where it starts."""

    min_workers: int
    max_workers: int
    start: int


class AutoWorkers(int):
    """``num_workers`` of a loader built with ``num_workers="auto"``: the most workers, as
    the ``int`` that ``DataLoader``'s own checks read. A loader built again from it (as
    frameworks rebuild a loader from its attributes) is elastic too."""

    __slots__ = ()


def elastic_bounds(options: Mapping[str, Any], *, most: int, method: str) -> Bounds:
    """The bounds in ``options`` (``most`` where ``max_workers`` is not given); raise
    ``ValueError`` naming a bad bound. The pool starts at the cores this process may use,
    within the bounds."""
    low = _bound(options, "min_workers", 1)
    high = _bound(options, "max_workers", max(low, most))
    if low > high:
        raise ValueError(
            f"worker_options min_workers={low!r} is above max_workers={high!r} for "
            f"worker_method={method!r} with num_workers='auto'; give min_workers <= max_workers"
        )
    return Bounds(low, high, min(high, max(low, usable_cores())))


def _bound(options: Mapping[str, Any], key: str, default: int) -> int:
    value = options.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(
            f"worker_options {key} must be an int >= 1 with num_workers='auto', got {value!r}"
        )
    return value
