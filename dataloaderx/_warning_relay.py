"""Move warnings raised in a producer thread to the consumer's thread.

``warnings.catch_warnings`` swaps process-global state, so a producer thread cannot use
it. Instead one hook is installed, once, on ``warnings._showwarnmsg`` (the function both
the C and the Python warning machinery call to display a warning). In a thread that has
called :func:`start_capture`, the hook stores the warning in a thread-local list instead
of displaying it; every other thread is untouched. The consumer re-issues the stored
warnings with :func:`reemit` when it hands out the batch, so its own filters,
``pytest.warns`` and ``catch_warnings(record=True)`` see them as with ``DataLoader``.
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["reemit", "start_capture", "take_captured"]

_local = threading.local()
_install_lock = threading.Lock()
_installed = False


def _install() -> None:
    global _installed
    with _install_lock:
        if _installed:
            return
        original: Callable[[Any], None] | None = getattr(warnings, "_showwarnmsg", None)
        if original is None:  # pragma: no cover - every supported CPython has the hook
            _installed = True
            return

        def relay(message: warnings.WarningMessage) -> None:
            sink: list[warnings.WarningMessage] | None = getattr(_local, "sink", None)
            if sink is None:
                original(message)
            else:
                sink.append(message)

        warnings._showwarnmsg = relay  # type: ignore[attr-defined]
        _installed = True


def start_capture() -> None:
    """Capture the warnings raised from now on in the calling thread."""
    _install()
    _local.sink = []


def take_captured() -> tuple[warnings.WarningMessage, ...] | None:
    """Return and forget the warnings captured in this thread since the last call."""
    sink: list[warnings.WarningMessage] | None = getattr(_local, "sink", None)
    if not sink:
        return None
    _local.sink = []
    return tuple(sink)


def reemit(caught: Sequence[warnings.WarningMessage]) -> None:
    """Issue captured warnings again, in the calling thread, under its filters."""
    for item in caught:
        warnings.warn_explicit(
            item.message, item.category, item.filename, item.lineno, source=item.source
        )
