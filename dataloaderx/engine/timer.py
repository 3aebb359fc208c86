"""``OneTimer``: at most one delayed action pending, run in a daemon thread of its own; the
owner calls every method under its own lock, which the action takes too."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from dataloaderx.engine.producer import thread_name

__all__ = ["OneTimer"]


class OneTimer:
    """One pending ``threading.Timer`` at most, its threads named after ``role``."""

    def __init__(self, role: str) -> None:
        self._role = role
        self._timer: threading.Timer | None = None

    def start(self, after: float, action: Callable[..., None], *args: Any) -> None:
        """Cancel the action pending, and run ``action(*args)`` ``after`` seconds from now."""
        self.cancel()
        timer = threading.Timer(after, action, args)
        timer.name, timer.daemon = thread_name(self._role), True
        self._timer = timer
        timer.start()

    def cancel(self) -> None:
        """Drop the action pending, if any: its thread ends without running it."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def claim(self) -> bool:
        """In the action's thread: whether it is still the one pending (not cancelled, no
        other started since); from then on none is."""
        if self._timer is not threading.current_thread():
            return False
        self._timer = None
        return True
