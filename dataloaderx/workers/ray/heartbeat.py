"""``Heartbeat``: whether a loader's Ray actors still answer while the loop waits for them.

A batch may take long to make, so silence alone says nothing. Once the loop has heard
nothing from its actors for :data:`PING_SECONDS`, each ready actor gets a call that changes
nothing and runs beside the task under way (``skip_through(0)``, in the actor's control
group), again every :data:`PING_SECONDS` while none answers; an answer, a result or an
actor started is a sign of life, a call that fails (the actor unreachable) is not. Asked
for ``placement_timeout_s`` seconds without a sign of life, or :data:`SILENCE_SECONDS` if
that is shorter (Ray ends a driver 60 s after it lost the cluster's GCS), the cluster went
away (its nodes, or the network to them): the calls already sent then never end, and
:meth:`Heartbeat.check` raises.
"""

from __future__ import annotations

import time
from typing import Any, Final

import ray
from ray import exceptions as ray_errors

from dataloaderx.workers.ray.group import ActorGroup, SlotState

__all__ = ["PING_SECONDS", "SILENCE_SECONDS", "Heartbeat"]

#: Silence after which the actors are asked whether they still answer, and how often.
PING_SECONDS: Final = 1.0
#: The longest the actors may be asked in vain before the cluster is taken for gone.
SILENCE_SECONDS: Final = 30.0


class Heartbeat:
    """The actors' last sign of life, and the calls asking for the next one."""

    def __init__(self, placement_timeout_s: float) -> None:
        self._option = placement_timeout_s
        self._limit = min(placement_timeout_s, SILENCE_SECONDS)
        self._heard = time.monotonic()
        #: When the actors were first asked since the last sign of life (``None``: not
        #: asked), and when last.
        self._asked: float | None = None
        self._sent = 0.0
        #: The calls sent and not yet ended.
        self.pings: list[Any] = []

    def heard(self) -> None:
        """Note a sign of life."""
        self._heard = time.monotonic()
        self._asked = None
        self.pings = []

    def answered(self, ref: Any) -> bool:
        """Whether ``ref`` (ready) is one of the calls; note its answer if it is."""
        if ref not in self.pings:
            return False
        self.pings.remove(ref)
        try:
            ray.get(ref, timeout=0)
        except ray_errors.RayError:
            return True  # unreachable: no sign of life
        self.heard()
        return True

    def check(self, group: ActorGroup) -> None:
        """Ask the ready actors of ``group`` for a sign of life after a silence; once they
        were asked in vain for the limit, leave the group's reservation to the cluster
        gone and raise ``RuntimeError``. (No actor ready: the actors' start deadline rules.)"""
        handles = [slot.handle for slot in group.slots if slot.state is SlotState.READY]
        now = time.monotonic()
        if not handles:
            self._asked = None
            return
        if self._asked is not None and now - self._asked >= self._limit:
            group.forget_reservation()
            raise RuntimeError(
                "the Ray cluster went away: no DataLoader worker (worker_method='ray') "
                f"answered for {self._limit:g} s (worker_options['placement_timeout_s']="
                f"{self._option!r}, at most {SILENCE_SECONDS:g} s) while "
                "batches were due (the cluster's nodes, or the network to them, are gone); "
                "check the cluster (`ray status`), then resume from a checkpoint "
                "(state_dict()), or raise placement_timeout_s to wait longer for a slow network"
            )
        if min(now - self._heard, now - self._sent) >= PING_SECONDS:
            self.pings += [handle.skip_through.remote(0) for handle in handles]
            self._sent = now
            if self._asked is None:
                self._asked = now
