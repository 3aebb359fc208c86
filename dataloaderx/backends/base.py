"""The interface every prefetch backend implements, and what a mode policy answers."""

from __future__ import annotations

import abc
from collections.abc import Callable, Iterator, Sequence
from typing import Any, ClassVar, Final, Literal, NamedTuple, Protocol, TypeVar, runtime_checkable

__all__ = [
    "INLINE",
    "PREFETCH",
    "Backend",
    "BatchStream",
    "Cycles",
    "InlineMode",
    "Mode",
    "ModePolicy",
    "Verdict",
    "check_bool",
    "check_count",
    "check_positive_int",
]

T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)

#: How a batch is made: by a producer thread ahead of the loop, or by the loop's own
#: thread inside ``next()``, as ``DataLoader`` does.
Mode = Literal["prefetch", "inline"]
PREFETCH: Final = "prefetch"
INLINE: Final = "inline"


@runtime_checkable
class BatchStream(Protocol[T_co]):
    """One epoch of batches, as a backend hands them to the training loop.

    ``__next__`` runs in the consumer's thread. ``close()`` stops any work the stream
    started, must be safe to call twice and from a finaliser, and must return promptly.
    A generator object satisfies this protocol.
    """

    def __next__(self) -> T_co: ...

    def close(self) -> None: ...


class Verdict(NamedTuple):
    """What a :class:`ModePolicy` asks for until it is told of the cycles it asked for."""

    mode: Mode
    #: Cycles to make in ``mode`` before the next report; none but the last of them can
    #: change the verdict, so they may be reported together.
    cycles: int
    #: The most seconds those cycles should take; a run that takes longer is reported
    #: at once, with ``overran`` set (the cost per batch went up meanwhile).
    seconds: float
    #: Whether the report needs the CPU and producer times of each cycle.
    measure: bool


class Cycles(NamedTuple):
    """Cycles of the loop made in a verdict's mode; seconds.

    A cycle runs from one ``next()`` return to the next. ``seconds`` holds the latest, in
    order: all, or at least the last 32. ``number`` may be 0 (the epoch's first batch, or a
    batch after a failed one, ends no cycle).
    """

    mode: Mode
    number: int
    seconds: Sequence[float] = ()
    #: For a measured cycle (``number`` 1): the loop's wait in ``next()``, its thread's CPU
    #: time, and the wall and CPU time of each batch a producer thread finished meanwhile.
    wait: float = 0.0
    cpu: float = 0.0
    produced: Sequence[tuple[float, float]] = ()
    overran: bool = False


class ModePolicy(Protocol):
    """Decides, cycle by cycle, whether a producer thread pays; kept for a loader's life."""

    @property
    def reason(self) -> str:
        """Why the current mode was chosen, in a few words."""

    def start_epoch(self, *, helper_processes: bool) -> Verdict:
        """A new epoch starts; ``helper_processes``: whether other processes (DataLoader
        workers) may be making batches while the loop steps, in either mode."""

    def observe(self, cycles: Cycles) -> Verdict:
        """Account for cycles made as the latest verdict asked (at most its ``cycles``)."""


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
