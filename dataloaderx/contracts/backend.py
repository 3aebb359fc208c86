"""The interface every prefetch backend implements, and the stream it opens per epoch."""

from __future__ import annotations

import abc
from collections.abc import Callable, Iterator
from typing import Any, ClassVar, NamedTuple, Protocol, TypeVar, runtime_checkable

from dataloaderx.contracts.policy import ModePolicy

__all__ = ["Backend", "BatchStream", "InlineMode"]

T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)


@runtime_checkable
class BatchStream(Protocol[T_co]):
    """One epoch of batches, as a backend hands them to the training loop.

    ``__next__`` runs in the consumer's thread. ``close()`` stops any work the stream
    started, must be safe to call twice and from a finaliser, and must return promptly.
    A generator object satisfies this protocol.
    """

    def __next__(self) -> T_co: ...

    def close(self) -> None: ...


class InlineMode(NamedTuple):
    """How a backend makes batches in the training thread when its producer does not pay."""

    #: Picks the mode, cycle by cycle (``None``: every batch is made inline).
    policy: ModePolicy | None
    #: Applied to each batch made inline (``None``: hand it out as it is).
    prepare: Callable[[Any], Any] | None = None


class Backend(abc.ABC):
    """A prefetch strategy, configured once per loader and opened once per epoch.

    Options are keyword-only, typed ``__init__`` parameters with defaults; unknown names are
    rejected before ``__init__`` validates the values. Construction must not start threads or
    touch a device (:meth:`open` does). Register with :func:`dataloaderx.register_backend`.
    """

    #: Canonical registry name, set when the backend is registered.
    name: ClassVar[str] = ""

    @classmethod
    def unavailable_reason(cls) -> str | None:
        """Why this backend cannot run on this machine, or ``None`` if it can; the text should
        say what is missing and what to use or install instead."""
        return None

    def pins_host_memory(self) -> bool:
        """Whether :meth:`open` pins host batches itself (for example to copy them to a device);
        then ``pin_memory=True`` does not start DataLoader's pin-memory thread (a wasted copy)."""
        return False

    def close(self) -> None:
        """Give back what the backend keeps between epochs (``cuda``: its pinned staging memory;
        the default: nothing); the next epoch makes it again. Safe to call twice."""
        return

    @abc.abstractmethod
    def open(self, source: Iterator[T]) -> BatchStream[T]:
        """Start prefetching from ``source`` and return the stream of its batches.

        ``source`` is safe to call from any one thread at a time, and may end before the epoch
        does (the loop then asks for the rest through a new ``open``). The caller closes
        ``source`` after closing the returned stream; the stream need not.
        """

    def inline_mode(self) -> InlineMode | None:
        """How batches are made in the training thread while prefetching does not pay.

        ``None`` (the default): every batch comes from :meth:`open`'s stream. Otherwise the
        epoch asks the policy, cycle by cycle, and makes batches inline while it says so;
        create the policy once per instance, so its decision carries over between epochs.
        """
        return None

    def describe(self) -> dict[str, Any]:
        """Return this backend's options (its public attributes), for logs and ``repr``."""
        return {key: value for key, value in vars(self).items() if not key.startswith("_")}

    def __repr__(self) -> str:
        options = ", ".join(f"{key}={value!r}" for key, value in self.describe().items())
        return f"{type(self).__name__}({options})"
