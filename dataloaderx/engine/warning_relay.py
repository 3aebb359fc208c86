"""Move warnings raised in a producer thread to the loop's thread (``docs/design.md``,
*Warnings*): a hook on ``warnings._showwarnmsg`` keeps them in a thread-local list in a
thread that called :func:`start_capture`, and :func:`reemit` issues them again."""

from __future__ import annotations

import threading
import warnings
from collections.abc import Callable, Sequence
from typing import Any


class _Captured(threading.local):
    """Warnings captured in this thread since last taken (``None``: not capturing here)."""

    messages: list[warnings.WarningMessage] | None = None


_captured = _Captured()
_install_lock = threading.Lock()
_installed = False


def start_capture() -> None:
    """Capture the warnings raised from now on in the calling thread (installs the hook once)."""
    global _installed
    with _install_lock:
        if not _installed:
            original: Callable[[Any], None] = warnings._showwarnmsg  # type: ignore[attr-defined]

            def relay(message: warnings.WarningMessage) -> None:
                sink = _captured.messages
                if sink is None:
                    original(message)
                else:
                    sink.append(message)

            warnings._showwarnmsg = relay  # type: ignore[attr-defined]
            _installed = True
    _captured.messages = []


def take_captured() -> tuple[warnings.WarningMessage, ...] | None:
    """Return and forget the warnings captured in this thread since the last call."""
    sink = _captured.messages
    if not sink:
        return None
    _captured.messages = []
    return tuple(sink)


def reemit(caught: Sequence[warnings.WarningMessage]) -> None:
    """Issue captured warnings again, in the calling thread, under its filters."""
    for item in caught:
        warnings.warn_explicit(
            item.message, item.category, item.filename, item.lineno, source=item.source
        )
