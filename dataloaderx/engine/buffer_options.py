"""Validation of ``depth``, ``max_depth`` and ``max_bytes``: every prefetching backend's options."""

from __future__ import annotations

import re
from typing import Final, Literal, NamedTuple

from dataloaderx.contracts.checks import check_count, check_positive_int

#: The ``depth`` value that lets the buffer size itself.
AUTO: Final = "auto"
#: The ceiling of ``depth="auto"`` when ``max_depth`` is not given.
DEFAULT_MAX_DEPTH: Final = 16
#: What the ``depth`` option accepts.
DepthSpec = int | Literal["auto"]

_UNITS: Final[dict[str, int]] = {
    **{unit: 1000**power for power, unit in enumerate(("b", "kb", "mb", "gb", "tb"))},
    **{unit: 1024**power for power, unit in enumerate(("kib", "mib", "gib", "tib"), 1)},
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
    """Return ``value`` in bytes (``None``: no cap), else raise: an ``int >= 1``, or a number
    and an optional unit in any case, B, KB, MB, GB, TB (powers of 1000) or KiB to TiB (1024)."""
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
    kind = f"None (no cap) or {_EXAMPLES}"
    return check_count(backend, option, value, kind, "at least 1 byte", "use None for no cap")


def check_depth_options(
    backend: str, *, depth: object, max_depth: object, max_bytes: object
) -> DepthOptions:
    """Validate the three options; raise on the first bad one. ``max_depth=None`` means
    :data:`DEFAULT_MAX_DEPTH` with ``depth="auto"``; with a fixed depth it must be >= ``depth``."""
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
