"""The interface every prefetch backend implements."""

from __future__ import annotations

import abc
from collections.abc import Iterator
from typing import Any, ClassVar, Protocol, TypeVar, runtime_checkable

__all__ = [
    "OPTIONAL_STREAM_ATTRIBUTES",
    "Backend",
    "BatchStream",
    "check_bool",
    "check_positive_int",
    "pass_on",
]

#: What a stream may offer besides ``__next__`` and ``close`` (see :class:`BatchStream`):
#: a wrapper around a stream passes these on with :func:`pass_on`.
OPTIONAL_STREAM_ATTRIBUTES = ("buffered", "buffer_usage", "mode_log")

T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)


@runtime_checkable
class BatchStream(Protocol[T_co]):
    """One epoch of batches, as a backend hands them to the training loop.

    ``__next__`` runs in the consumer's thread. ``close()`` stops any work the stream
    started, must be safe to call twice and from a finaliser, and must return promptly.
    A generator object satisfies this protocol. A stream may also offer
    ``buffered() -> int``, the number of batches ready to hand out; stall statistics
    (``loader.stats``) then report how full the buffer was at each ``next()``; and
    ``mode_log`` (which mode ran and why, for streams that switch). It may
    offer ``buffer_usage()`` too, returning the depths used and the peak bytes held, which
    the statistics then report as ``depth_min``/``depth_median``/``depth_max`` and
    ``peak_bytes``.
    """

    def __next__(self) -> T_co: ...

    def close(self) -> None: ...


def pass_on(stream: object, wrapper: object) -> None:
    """Give ``wrapper`` the optional attributes ``stream`` has (buffer and mode reports)."""
    for name in OPTIONAL_STREAM_ATTRIBUTES:
        value = getattr(stream, name, None)
        if value is not None:
            setattr(wrapper, name, value)


class Backend(abc.ABC):
    """A prefetch strategy, configured once per loader and opened once per epoch.

    Subclasses take their options as keyword-only ``__init__`` parameters with type hints
    and defaults; unknown option names are rejected before ``__init__`` runs, and
    ``__init__`` validates values. Constructing a backend must not start threads or touch
    a device: that happens in :meth:`open`. Register a subclass with
    :func:`dataloaderx.register_backend`.
    """

    #: Canonical registry name, set by :func:`dataloaderx.register_backend`.
    name: ClassVar[str] = ""

    @classmethod
    def unavailable_reason(cls) -> str | None:
        """Return why this backend cannot run on this machine, or ``None`` if it can.

        The text should say what is missing and what to use or install instead.
        """
        return None

    def pins_host_memory(self) -> bool:
        """Whether :meth:`open` pins host batches itself (for example to copy them to a device).

        ``DataLoaderX`` then leaves ``pin_memory=True`` to the backend: DataLoader's own
        pin-memory thread is not started, since it would only copy each batch once more.
        """
        return False

    def close(self) -> None:
        """Give back what the backend keeps from one epoch to the next; safe to call twice.

        For example the ``cuda`` backend's pinned staging memory. The next epoch makes
        it again. The default keeps nothing.
        """
        return

    @abc.abstractmethod
    def open(self, source: Iterator[T]) -> BatchStream[T]:
        """Start prefetching from ``source`` and return the epoch's stream.

        ``source`` is safe to call from any one thread at a time. The caller closes
        ``source`` after closing the returned stream; the stream need not do it.
        """

    def describe(self) -> dict[str, Any]:
        """Return this backend's options (its public attributes), for logs and ``repr``."""
        return {key: value for key, value in vars(self).items() if not key.startswith("_")}

    def __repr__(self) -> str:
        options = ", ".join(f"{key}={value!r}" for key, value in self.describe().items())
        return f"{type(self).__name__}({options})"


def check_positive_int(backend: str, option: str, value: object) -> int:
    """Return ``value`` if it is an ``int`` >= 1, else raise a message naming the option."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(
            f"backend {backend!r} option {option!r} must be an int >= 1, "
            f"got {value!r} ({type(value).__name__})"
        )
    if value < 1:
        raise ValueError(
            f"backend {backend!r} option {option!r} must be an int >= 1, got {value!r}; "
            f"an unbounded queue is not allowed, use {option}=1 or more"
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
