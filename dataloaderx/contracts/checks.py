"""Checks of backend options: errors that name the backend, the option, the value and the fix."""

from __future__ import annotations

__all__ = ["check_bool", "check_count", "check_positive_int"]


def check_positive_int(backend: str, option: str, value: object) -> int:
    """Return ``value`` if it is an ``int`` >= 1, else raise a message naming the option."""
    fix = f"an unbounded queue is not allowed, use {option}=1 or more"
    return check_count(backend, option, value, "an int >= 1", "an int >= 1", fix)


def check_count(backend: str, option: str, value: object, kind: str, least: str, fix: str) -> int:
    """Return ``value`` if it is an ``int`` >= 1; else raise, naming the option, what it
    must be (``kind``, or ``least`` when the int is too small) and the ``fix``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(
            f"backend {backend!r} option {option!r} must be {kind}, "
            f"got {value!r} ({type(value).__name__})"
        )
    if value < 1:
        raise ValueError(
            f"backend {backend!r} option {option!r} must be {least}, got {value!r}; {fix}"
        )
    return value


def check_bool(backend: str, option: str, value: object) -> bool:
    """Return ``value`` if it is ``True`` or ``False``, else raise a message naming the option."""
    if not isinstance(value, bool):
        raise TypeError(
            f"backend {backend!r} option {option!r} must be True or False, "
            f"got {value!r} ({type(value).__name__})"
        )
    return value
