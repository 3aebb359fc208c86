"""Reading a plugin entry-point group without letting broken metadata break a lookup."""

from __future__ import annotations

import importlib.metadata
import warnings
from typing import Any

__all__ = ["entry_points", "subclass_or_none"]


def entry_points(group: str) -> list[importlib.metadata.EntryPoint]:
    """The entry points declared in ``group``; none, with a warning, where the installed
    distributions' metadata cannot be read."""
    try:
        return list(importlib.metadata.entry_points(group=group))
    except Exception as exc:  # noqa: BLE001 - broken metadata must not break lookups
        warnings.warn(
            f"dataloaderx: could not read the {group!r} entry points: {exc!r}",
            RuntimeWarning,
            stacklevel=4,
        )
        return []


def subclass_or_none(loaded: Any, base: type[Any]) -> Any:
    """``loaded`` (an entry point's object) if it is a subclass of ``base`` (abstract ones
    included), else ``None``."""
    return loaded if isinstance(loaded, type) and issubclass(loaded, base) else None
