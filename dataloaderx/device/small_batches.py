"""When the ``cuda`` backend may make batches inline: only while all have been small. Timed on
the CPU, which runs ahead of the device either way, the adaptive decision cannot see that an
inline copy no longer overlaps the step (``docs/design.md``, *Inline batches on a device*)."""

from __future__ import annotations

import math
import threading
from typing import Final

from dataloaderx.contracts.policy import PREFETCH, Cycles, ModePolicy, Verdict

#: Largest inline batch (tensor bytes): ~5 us to copy at ~50 GB/s, less than a thread hand-off.
INLINE_MAX_BYTES: Final = 256 * 1024
#: Once a batch was large: prefetch, and nothing more to decide.
_ALWAYS_PREFETCH: Final = Verdict(PREFETCH, 1 << 62, math.inf, measure=False)


class SmallBatchesOnly:
    """Follows ``decision`` until a batch exceeds ``limit``, then always prefetches;
    thread-safe. Batches are reported one by one, never in a run: any may be the large one."""

    def __init__(self, decision: ModePolicy, limit: int = INLINE_MAX_BYTES) -> None:
        self._decision = decision
        self._limit = limit
        self._lock = threading.Lock()
        self._large: int | None = None

    @property
    def large(self) -> int | None:
        """Bytes of the first batch that exceeded the limit, else ``None``."""
        with self._lock:
            return self._large

    def note(self, nbytes: int) -> None:
        """Account for the size of one batch about to be copied (in either thread)."""
        with self._lock:
            if self._large is None and nbytes > self._limit:
                self._large = nbytes

    @property
    def reason(self) -> str:
        large = self.large
        if large is None:
            return self._decision.reason
        return (
            f"batches of {large / 2**20:.3g} MiB: only on a side stream does their "
            "copy overlap the step"
        )

    def start_epoch(self, *, helper_processes: bool) -> Verdict:
        if self.large is not None:
            return _ALWAYS_PREFETCH
        return self._one_by_one(self._decision.start_epoch(helper_processes=helper_processes))

    def observe(self, cycles: Cycles) -> Verdict:
        if self.large is not None:
            return _ALWAYS_PREFETCH
        return self._one_by_one(self._decision.observe(cycles))

    def _one_by_one(self, verdict: Verdict) -> Verdict:
        return verdict._replace(cycles=1, seconds=math.inf)
