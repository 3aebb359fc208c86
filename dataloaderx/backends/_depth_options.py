"""Validation of the buffer options every prefetching backend takes.

``depth`` (an ``int >= 1`` or ``"auto"``), ``max_depth`` (the ceiling of ``"auto"``) and
``max_bytes`` (a cap on the bytes of tensors held in the buffer: an ``int`` or a string
such as ``"2GiB"``). ``thread``, ``background``, ``cuda`` and ``auto`` all call
:func:`check_depth_options`.
"""

from __future__ import annotations

import re
from typing import Final, Literal, NamedTuple

from dataloaderx.backends.base import check_positive_int

__all__ = [
    "AUTO",
    "DEFAULT_MAX_DEPTH",
    "DepthOptions",
    "DepthSpec",
    "check_depth",
    "check_depth_options",
    "check_max_bytes",
    "format_bytes",
]

#: The ``depth`` value that lets the buffer size itself.
AUTO: Final = "auto"
#: The ceiling of ``depth="auto"`` when ``max_depth`` is not given.
DEFAULT_MAX_DEPTH: Final = 16
#: What the ``depth`` option accepts.
DepthSpec = int | Literal["auto"]

_UNITS: Final[dict[str, int]] = {
    "b": 1,
    "kb": 1000,
    "mb": 1000**2,
    "gb": 1000**3,
    "tb": 1000**4,
    "kib": 1024,
    "mib": 1024**2,
    "gib": 1024**3,
    "tib": 1024**4,
}
_SIZE: Final = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([a-z]*)\s*", re.IGNORECASE)
_EXAMPLES: Final = "an int number of bytes or a string such as '512MiB', '2GiB' or '1.5GB'"


class DepthOptions(NamedTuple):
    """The validated buffer options of a prefetching backend."""

    depth: DepthSpec
    #: The ceiling of ``depth="auto"`` (unused, and possibly ``None``, with a fixed depth).
    max_depth: int | None
    max_bytes: int | None


def check_depth(backend: str, option: str, value: object) -> DepthSpec:
    """Return ``value`` if it is an ``int >= 1`` or ``"auto"``, else raise."""
    if value == AUTO and isinstance(value, str):
        return AUTO
    if isinstance(value, str):
        raise TypeError(
            f"backend {backend!r} option {option!r} must be an int >= 1 or 'auto', "
            f"got {value!r} (str); write {option}='auto' or a number of batches such as "
            f"{option}=4"
        )
    return check_positive_int(backend, option, value)


def check_max_bytes(backend: str, option: str, value: object) -> int | None:
    """Return ``value`` as a number of bytes (``None``: no cap), else raise.

    Accepts an ``int >= 1`` or a string: a number and an optional unit, ``B``, ``KB``,
    ``MB``, ``GB``, ``TB`` (powers of 1000) or ``KiB``, ``MiB``, ``GiB``, ``TiB`` (powers
    of 1024), in any case.
    """
    if value is None:
        return None
    if isinstance(value, str):
        match = _SIZE.fullmatch(value)
        unit = match.group(2).lower() if match else ""
        if match is None or unit not in ("", *_UNITS):
            raise ValueError(
                f"backend {backend!r} option {option!r} got {value!r}, which is not a size; "
                f"use {_EXAMPLES} (units: B, KB, MB, GB, TB, KiB, MiB, GiB, TiB)"
            )
        size = int(float(match.group(1)) * _UNITS[unit or "b"])
        if size < 1:
            raise ValueError(
                f"backend {backend!r} option {option!r} must be at least 1 byte, got {value!r}"
            )
        return size
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(
            f"backend {backend!r} option {option!r} must be None (no cap) or {_EXAMPLES}, "
            f"got {value!r} ({type(value).__name__})"
        )
    if value < 1:
        raise ValueError(
            f"backend {backend!r} option {option!r} must be at least 1 byte, got {value!r}; "
            "use None for no cap"
        )
    return value


def check_depth_options(
    backend: str, *, depth: object, max_depth: object, max_bytes: object
) -> DepthOptions:
    """Validate ``depth``, ``max_depth`` and ``max_bytes`` together; raise on the first bad one.

    ``max_depth=None`` means :data:`DEFAULT_MAX_DEPTH` with ``depth="auto"``. With a fixed
    depth, ``max_depth`` may be given only if it is at least ``depth``.
    """
    checked_depth = check_depth(backend, "depth", depth)
    ceiling = None if max_depth is None else check_positive_int(backend, "max_depth", max_depth)
    if checked_depth == AUTO:
        ceiling = DEFAULT_MAX_DEPTH if ceiling is None else ceiling
    elif ceiling is not None and ceiling < checked_depth:
        raise ValueError(
            f"backend {backend!r} got depth={checked_depth!r} above max_depth={ceiling!r}; "
            "raise max_depth, lower depth, or use depth='auto' to size the buffer itself"
        )
    return DepthOptions(checked_depth, ceiling, check_max_bytes(backend, "max_bytes", max_bytes))


def format_bytes(size: float) -> str:
    """``size`` in the largest binary unit that keeps it at least 1, e.g. ``'1.5GiB'``."""
    for unit in ("TiB", "GiB", "MiB", "KiB"):
        scale = _UNITS[unit.lower()]
        if size >= scale:
            return f"{size / scale:.3g}{unit}"
    return f"{int(size)}B"
