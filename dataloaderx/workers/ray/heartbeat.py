"""``Heartbeat``: whether the Ray cluster is still there while the loop waits for its actors,
asked of the cluster's GCS after a silence of :data:`PING_SECONDS`, never of the actors'
Python (a batch may hold its actor's GIL for minutes); ``docs/ray-workers.md``, "Fault
tolerance".
"""

from __future__ import annotations

import time
from typing import Final

from dataloaderx.workers.ray.cluster import answers
from dataloaderx.workers.ray.group import ActorGroup

__all__ = ["PING_SECONDS", "SILENCE_SECONDS", "Heartbeat"]

#: Silence after which the cluster is asked whether it is still there, and how often.
PING_SECONDS: Final = 1.0
#: The longest the cluster may be asked in vain before it is taken for gone.
SILENCE_SECONDS: Final = 30.0


class Heartbeat:
    """The cluster's last sign of life."""

    def __init__(self, placement_timeout_s: float) -> None:
        self._option = placement_timeout_s
        self._limit = min(placement_timeout_s, SILENCE_SECONDS)
        self._heard = self._asked = time.monotonic()

    def heard(self) -> None:
        """Note a sign of life."""
        self._heard = time.monotonic()

    def check(self, group: ActorGroup) -> None:
        """Ask the cluster for a sign of life after a silence; once it was asked in vain for
        the limit, leave ``group``'s reservation to the cluster gone and raise
        ``RuntimeError``. (Call it outside locks: an unanswered question takes a second.)"""
        now = time.monotonic()
        if min(now - self._heard, now - self._asked) < PING_SECONDS:
            return
        self._asked = now
        if answers(timeout=PING_SECONDS):
            self.heard()
            return
        if time.monotonic() - self._heard >= self._limit:
            group.forget_reservation()
            raise RuntimeError(
                "the Ray cluster went away: its GCS did not answer for "
                f"{self._limit:g} s (worker_options['placement_timeout_s']={self._option!r}, "
                f"at most {SILENCE_SECONDS:g} s) while DataLoader workers "
                "(worker_method='ray') had batches to make (the cluster's head, or the "
                "network to it, is gone); check the cluster (`ray status`), then resume "
                "from a checkpoint (state_dict()), or raise placement_timeout_s to wait "
                "longer for a slow network"
            )
