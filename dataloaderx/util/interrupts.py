"""Holding a Ctrl-C back while a block that must not be cut short runs."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator

__all__ = ["interrupts_held"]


@contextlib.contextmanager
def interrupts_held() -> Iterator[None]:
    """Raise a ``KeyboardInterrupt`` that comes during the block once the block is done.
    Only in the main thread under Python's own handler, where a Ctrl-C is raised; a
    handler of the program's own is left alone."""
    if (
        threading.current_thread() is not threading.main_thread()
        or signal.getsignal(signal.SIGINT) is not signal.default_int_handler
    ):
        yield
        return
    caught: list[int] = []
    signal.signal(signal.SIGINT, lambda number, frame: caught.append(number))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
        if caught:
            raise KeyboardInterrupt
