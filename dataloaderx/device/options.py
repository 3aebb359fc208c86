"""Validation of the copy options of the ``cuda`` backend (which ``auto`` inherits)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

import torch

from dataloaderx.util.cores import usable_cores

MAX_AUTO_PIN_THREADS: Final = 8  #: pin_threads=None's cap: host memory bandwidth is shared
DeviceSpec = str | torch.device | int | None  #: None (current device), name, torch.device, index
#: ``memory_format`` values by name (for config files) and the rank each applies to (``None``: any).
MEMORY_FORMATS: Final[dict[str, tuple[torch.memory_format, int | None]]] = {
    "channels_last": (torch.channels_last, 4),
    "channels_last_3d": (torch.channels_last_3d, 5),
    "contiguous_format": (torch.contiguous_format, None),
    "preserve_format": (torch.preserve_format, None),
}
_RANKS: Final = dict(MEMORY_FORMATS.values())


def check_transform(backend: str, option: str, value: object) -> Callable[[Any], Any] | None:
    """Return ``value`` if it is callable or ``None``, else raise."""
    if value is not None and not callable(value):
        raise TypeError(
            f"backend {backend!r} option {option!r} must be a callable taking and returning "
            f"a batch, or None; got {value!r} ({type(value).__name__})"
        )
    return value


def check_memory_format(backend: str, option: str, value: object) -> torch.memory_format | None:
    """Return the ``torch.memory_format`` that ``value`` (a format or its name) stands for."""
    if value is None or isinstance(value, torch.memory_format):
        return value
    if isinstance(value, str):
        name = value.removeprefix("torch.")
        if name in MEMORY_FORMATS:
            return MEMORY_FORMATS[name][0]
    choices = ", ".join(f"torch.{name}" for name in MEMORY_FORMATS)
    raise ValueError(
        f"backend {backend!r} option {option!r} must be None or one of {choices} "
        f"(or its name as a string), got {value!r}"
    )


def format_for(
    tensor: torch.Tensor, memory_format: torch.memory_format | None
) -> torch.memory_format:
    """The layout to give ``tensor``: ``memory_format`` if it applies to its rank."""
    if memory_format is None:
        return torch.preserve_format
    rank = _RANKS[memory_format]
    return memory_format if rank is None or tensor.dim() == rank else torch.preserve_format


def check_device(
    backend: str,
    option: str,
    value: object,
    *,
    accelerator: str | None,
    device_count: Callable[[], int],
) -> DeviceSpec:
    """Return ``value`` if it names a device of ``accelerator`` (or any accelerator), else raise."""
    if value is None:
        return None
    example = "'cuda', 'cuda:1', torch.device('cuda', 1) or 1"
    if isinstance(value, bool) or not isinstance(value, (str, torch.device, int)):
        raise TypeError(
            f"backend {backend!r} option {option!r} must be a device such as {example}, "
            f"or None for the current device; got {value!r} ({type(value).__name__})"
        )
    if isinstance(value, int):
        index: int | None = value
        kind = accelerator
    else:
        try:
            parsed = torch.device(value)
        except (RuntimeError, ValueError) as exc:
            raise ValueError(
                f"backend {backend!r} option {option!r} got {value!r}, which is not a device "
                f"name ({exc}); use a device such as {example}"
            ) from None
        index, kind = parsed.index, parsed.type
    if index is not None and index < 0:
        raise ValueError(
            f"backend {backend!r} option {option!r} must be a device index >= 0, got {value!r}"
        )
    if kind in ("cpu", "meta"):
        raise ValueError(
            f"backend {backend!r} option {option!r} must be an accelerator device such as "
            f"{example}, got {value!r}; use backend='thread' to keep batches on the CPU"
        )
    if accelerator is None:
        return value
    if kind != accelerator:
        raise ValueError(
            f"backend {backend!r} option {option!r} is {value!r}, but this machine's "
            f"accelerator is {accelerator!r}; use a {accelerator!r} device"
        )
    count = device_count()
    if index is not None and index >= count:
        raise ValueError(
            f"backend {backend!r} option {option!r} is {value!r}, but this machine has "
            f"{count} {accelerator} device(s) (indices 0 to {count - 1})"
        )
    return value


def check_pin_threads(backend: str, option: str, value: object) -> int | None:
    """Return ``value`` if it is ``None`` (automatic) or an ``int`` >= 1, else raise."""
    if value is None:
        return None
    expected = (
        f"backend {backend!r} option {option!r} must be an int >= 1 (the threads that copy "
        f"batches into pinned memory) or None for half this machine's cores, at most "
        f"{MAX_AUTO_PIN_THREADS}"
    )
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{expected}; got {value!r} ({type(value).__name__})")
    if value < 1:
        raise ValueError(f"{expected}; got {value!r}")
    return value


def auto_pin_threads() -> int:
    """``pin_threads=None``: half the cores this process may run on, 1 to 8."""
    return max(1, min(MAX_AUTO_PIN_THREADS, usable_cores() // 2))
