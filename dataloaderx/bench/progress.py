"""A progress bar: ``tqdm`` when installed, else one plain line per run on stderr."""

from __future__ import annotations

import sys
from typing import Any

from dataloaderx.util.wrapping import ClosesOnExit

__all__ = ["Progress"]


class Progress(ClosesOnExit):
    """Count batches (or seconds, with ``unit="s"``) across every run; ``enabled=False``
    shows nothing."""

    def __init__(self, total: float, *, enabled: bool = True, unit: str = "batch") -> None:
        self._bar: Any = None
        self._enabled = enabled
        if not enabled:
            return
        try:
            from tqdm import tqdm
        except ImportError:
            return
        self._bar = tqdm(total=total, unit=unit, file=sys.stderr, leave=False)

    def start_run(self, label: str) -> None:
        """Announce the run about to start."""
        if self._bar is not None:
            self._bar.set_description(label)
        elif self._enabled:
            print(f"running {label} ...", file=sys.stderr, flush=True)

    def advance(self, amount: float = 1) -> None:
        """Count ``amount`` more batches (or seconds)."""
        if self._bar is not None:
            self._bar.update(amount)

    def close(self) -> None:
        """Close the progress bar, if there is one."""
        if self._bar is not None:
            self._bar.close()
