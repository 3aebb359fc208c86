"""Checks of ``worker_options``, for every worker method that takes options: errors that
name the key, the value, and what it must be."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from dataloaderx.util.suggest import did_you_mean, quoted

__all__ = ["bad", "check_keys", "choice", "count", "flag", "number"]


def bad(key: str, value: object, wanted: str) -> ValueError:
    """The error for ``worker_options[key]`` = ``value``, which must be ``wanted``."""
    return ValueError(f"worker_options[{key!r}] must be {wanted}, got {value!r}")


def number(key: str, value: object, *, positive: bool = False) -> float:
    """``value`` if it is a finite number >= 0 (> 0 where ``positive``), as a float."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise bad(key, value, "a finite number")
    if value < 0 or (positive and value == 0):
        raise bad(key, value, "a number > 0" if positive else "a number >= 0")
    return float(value)


def count(key: str, value: object, *, least: int = 0) -> int:
    """``value`` if it is an int >= ``least``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise bad(key, value, f"an int >= {least}")
    return value


def flag(key: str, value: object) -> bool:
    """``value`` if it is ``True`` or ``False``."""
    if not isinstance(value, bool):
        raise bad(key, value, "True or False")
    return value


def choice(key: str, value: object, choices: Sequence[str]) -> str:
    """``value`` if it is one of ``choices``."""
    if not isinstance(value, str) or value not in choices:
        name = value if isinstance(value, str) else ""
        raise bad(key, value, f"one of {quoted(choices)}{did_you_mean(name, choices)}")
    return value


def check_keys(
    method: str, options: Mapping[str, Any], parsers: Mapping[str, Callable[[Any], Any]]
) -> dict[str, Any]:
    """Each option of ``options`` parsed by its parser in ``parsers``; ``ValueError`` names
    a key that has none, with the valid keys."""
    for key in options:
        if key not in parsers:
            name = key if isinstance(key, str) else repr(key)
            raise ValueError(
                f"unknown worker_options key {key!r} (value {options[key]!r}) for "
                f"worker_method={method!r}; valid keys: {quoted(parsers)}"
                f"{did_you_mean(name, list(parsers))}"
            )
    return {key: parsers[key](value) for key, value in options.items()}
