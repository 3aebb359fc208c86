"""When the ``cuda`` backend may make batches inline: only while they are small.

The adaptive decision (:mod:`~dataloaderx.backends._mode_decision`) compares the
training loop's time per batch in both modes, as the CPU sees it. On an accelerator
that misses what matters most: an inline batch is copied on the loop's own stream, so
its copy no longer overlaps the step; the CPU-side loop runs ahead of the device either
way, and both modes can look alike to it. A copy costs little only when the batch is
small, so :class:`SmallBatchesOnly` lets the decision choose inline only while every
batch of the loader has stayed under :data:`INLINE_MAX_BYTES`; from the first larger
batch on, the loader always prefetches on the side stream.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from dataloaderx.backends._mode_decision import PREFETCH, Cycle, Mode, ModePolicy

__all__ = ["INLINE_MAX_BYTES", "SmallBatchesOnly"]

#: Largest batch (bytes of its tensors) the ``cuda`` backend may make inline. At the
#: host link's ~50 GB/s its copy takes about 5 us, less than a hand-off between threads.
INLINE_MAX_BYTES: Final = 256 * 1024


class SmallBatchesOnly:
    """A :class:`ModePolicy` that follows ``decision`` until a batch is large."""

    def __init__(self, decision: ModePolicy, limit: int = INLINE_MAX_BYTES) -> None:
        self._decision = decision
        self._limit = limit
        #: Bytes of the largest batch seen once it exceeded the limit, else ``None``.
        self.large: int | None = None

    def note(self, nbytes: int) -> None:
        """Account for the size of one batch about to be copied."""
        if self.large is None and nbytes > self._limit:
            self.large = nbytes

    @property
    def wanted(self) -> Mode:
        return PREFETCH if self.large is not None else self._decision.wanted

    @property
    def probing(self) -> bool:
        return self.large is None and self._decision.probing

    @property
    def reason(self) -> str:
        if self.large is None:
            return self._decision.reason
        return (
            f"batches of {self.large / 2**20:.3g} MiB: only on a side stream does their "
            "copy overlap the step"
        )

    def start_epoch(self, *, helper_processes: bool = True) -> None:
        self._decision.start_epoch(helper_processes=helper_processes)

    def observe(self, cycle: Cycle) -> None:
        if self.large is None:
            self._decision.observe(cycle)

    def steady_cycles(self) -> int:
        # Never in bulk: any batch may be the large one that must switch to prefetching.
        return 0

    def observe_steady(self, count: int, latest: Sequence[float]) -> None:
        if self.large is None:
            self._decision.observe_steady(count, latest)

    def steady_seconds(self, cycles: int) -> float:
        return self._decision.steady_seconds(cycles)

    def steady_overran(self) -> None:
        if self.large is None:
            self._decision.steady_overran()
