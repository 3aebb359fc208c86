"""``prefetch()``: apply a backend to any iterable of batches, for example where a framework
replaces the loader class (``accelerate.Accelerator.prepare``: prepare first, then prefetch).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping, Sized
from typing import Any, Final, Generic, TypeVar, overload

from torch.utils.data import DataLoader

from dataloaderx.contracts.backend import Backend
from dataloaderx.epoch.iterator import PrefetchIterator
from dataloaderx.epoch.position import Position, Tracking
from dataloaderx.epoch.stats import EpochStats, LoaderStats
from dataloaderx.options import BackendSpec, make_backend, resolve_backend
from dataloaderx.util.wrapping import ClosesOnExit, delegate

__all__ = ["Prefetched", "SizedPrefetched", "prefetch"]

T = TypeVar("T")


def _release_for(iterable: Iterable[Any], inner: Iterator[Any]) -> Callable[[], None] | None:
    """What frees the resources of one epoch's ``inner``, if anything: a PyTorch loader
    iterator's worker shutdown (unless the loader keeps its workers for the next epoch), else
    ``close()`` (a generator's, as accelerate's loaders return, runs its ``finally`` blocks)."""
    shutdown = getattr(inner, "_shutdown_workers", None)
    if isinstance(iterable, DataLoader) and callable(shutdown):
        return None if iterable.persistent_workers and iterable.num_workers > 0 else shutdown
    close = getattr(inner, "close", None)
    return close if callable(close) else None


def _view_with_prefetched_base(iterable: Iterable[Any], backend: Backend, stats: EpochStats) -> Any:
    """For a loader that wraps a ``base_dataloader`` and updates shared per-batch state as it
    yields (accelerate's ``gradient_state``: end of loader, remainder, accumulation), return a
    copy (the original is not modified) whose base loader is prefetched instead; else ``None``.
    Prefetching the loader itself would update that state up to ``depth`` batches early; the
    copy iterates in the loop's thread, so the state follows the batches the loop sees."""
    attributes = getattr(iterable, "__dict__", None) or {}
    base = attributes.get("base_dataloader")
    if "gradient_state" not in attributes or not isinstance(base, Iterable):
        return None
    view = object.__new__(type(iterable))
    vars(view).update(attributes, base_dataloader=_wrap(base, backend, stats))
    update = getattr(view, "_update_state_dict", None)
    if callable(update):
        # With use_stateful_dataloader, accelerate snapshots the base loader's state per batch;
        # keep the prepared loader's copy (read by Accelerator.save_state()) equal to the view's.
        def update_both() -> None:
            update()
            attributes["dl_state_dict"] = vars(view).get("dl_state_dict")

        vars(view)["_update_state_dict"] = update_both
    return view


def _both(first: Callable[[], None] | None, then: Callable[[], None]) -> Callable[[], None]:
    def release() -> None:
        try:
            if first is not None:
                first()
        finally:
            then()

    return release


_OWN_ATTRIBUTES: Final = frozenset(
    {
        "_iterable",
        "_backend",
        "_one_shot",
        "_epochs_started",
        "_current",
        "_read",
        "_runner",
        "_base",
        "_stats",
        "_position",
        "_loaded_state",
    }
)
#: Methods offered when the wrapped iterable has them, answering for the consumed batches.
_STATE_METHODS: Final = frozenset({"state_dict", "load_state_dict"})


class Prefetched(ClosesOnExit, Generic[T]):
    """An iterable that prefetches the batches of ``iterable`` through a backend.

    Each ``iter()`` closes the previous epoch, waits until it no longer reads the source, and
    starts a new one: a :class:`~dataloaderx.PrefetchIterator` (``next``, ``close``, ``with``;
    closed when the epoch ends or is garbage collected). A one-shot source (a generator, an
    iterator) gives one epoch, a re-iterable one (a loader) one per ``iter()``. Other
    attributes, such as ``set_epoch`` or ``dataset``, are the iterable's.

    If the iterable has ``state_dict()`` and ``load_state_dict()`` (torchdata's
    ``StatefulDataLoader``, a ``DataLoaderX``), so does this object; ``state_dict()`` returns
    the iterable's state right after the last batch handed to the loop was made (not after the
    batches prefetched beyond it).
    """

    def __init__(self, iterable: Iterable[T], backend: Backend, stats: EpochStats) -> None:
        self._iterable = iterable
        self._backend = backend
        self._stats = stats
        self._one_shot = isinstance(iterable, Iterator)
        self._epochs_started = 0
        self._current: weakref.ref[PrefetchIterator[T]] | None = None
        view = _view_with_prefetched_base(iterable, backend, stats)
        #: What each epoch iterates and runs through, and the prefetched base loader in it.
        self._read: Iterable[T] = iterable if view is None else view
        self._runner = backend if view is None else make_backend("sync", None)
        self._base: Prefetched[Any] | None = None if view is None else view.base_dataloader
        self._position: Position | None = None
        self._loaded_state: Any = None

    @property
    def iterable(self) -> Iterable[T]:
        """The wrapped iterable."""
        return self._iterable

    @property
    def prefetch_backend(self) -> Backend:
        """The configured backend instance (resolved name and validated options)."""
        return self._backend

    @property
    def stats(self) -> LoaderStats | None:
        """Stall statistics of the latest (or current) epoch, as ``DataLoaderX.stats``."""
        return self._stats.latest() if self._base is None else self._base.stats

    def __iter__(self) -> PrefetchIterator[T]:
        if self._one_shot and self._epochs_started:
            raise RuntimeError(
                f"prefetch() was given a one-shot iterator ({type(self._iterable).__name__}), "
                "which has been iterated already; pass a re-iterable source such as a "
                "DataLoader, or call prefetch() again with a new iterator for each epoch"
            )
        self._finish_epoch(wait=True)
        inner = iter(self._read)
        release = _release_for(self._read, inner)
        if self._base is not None:
            release = _both(release, self._base.close)
        num_workers = getattr(self._read, "num_workers", 0)
        iterator = PrefetchIterator(
            inner,
            self._runner,
            release,
            stats=self._stats if self._base is None else None,
            tracking=self._tracking(),
            num_workers=num_workers if isinstance(num_workers, int) else 0,
        )
        self._epochs_started += 1
        self._current = weakref.ref(iterator)
        return iterator

    def _tracking(self) -> Tracking | None:
        """What this epoch records: with a stateful source (and no accelerate view, which
        reports the state itself), each batch carries the source's state with it."""
        self._loaded_state = None
        state_dict = getattr(self._read, "state_dict", None)
        stateful = callable(state_dict) and callable(getattr(self._read, "load_state_dict", None))
        if self._base is not None or not stateful or state_dict is None:
            return None
        self._position = Position(state=state_dict())
        return Tracking(self._position, state_dict)

    def _consumed_state_dict(self) -> Any:
        """The source's ``state_dict()`` as of the last batch handed to the loop."""
        if self._loaded_state is not None:
            return self._loaded_state
        position = self._position
        if position is None or position.finished:
            return self._read.state_dict()  # type: ignore[attr-defined]
        return position.state

    def _load_state_dict(self, state_dict: Any) -> None:
        """Load ``state_dict`` into the source; the next ``iter()`` continues from it."""
        self._finish_epoch(wait=True)
        self._read.load_state_dict(state_dict)  # type: ignore[attr-defined]
        self._position = None
        self._loaded_state = state_dict

    def close(self) -> None:
        """Stop the running epoch, if any, as its iterator's ``close()`` does; safe to repeat."""
        self._finish_epoch(wait=False)

    def _finish_epoch(self, *, wait: bool) -> None:
        current = None if self._current is None else self._current()
        self._current = None
        if current is not None:
            current.close()
            if wait:
                current.source.close(timeout=None)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._iterable!r}, backend={self._backend!r})"

    def __getattr__(self, name: str) -> Any:
        found = delegate(self._read, name, _OWN_ATTRIBUTES)
        if name in _STATE_METHODS and self._base is None:
            return self._consumed_state_dict if name == "state_dict" else self._load_state_dict
        return found


class SizedPrefetched(Prefetched[T]):
    """A :class:`Prefetched` over a source with ``len()``; its ``len()`` is the source's."""

    def __len__(self) -> int:
        return len(self._read)  # type: ignore[arg-type]


@overload
def prefetch(
    iterable: DataLoader[T],
    *,
    backend: BackendSpec = ...,
    backend_options: Mapping[str, Any] | None = ...,
) -> SizedPrefetched[T]: ...


@overload
def prefetch(
    iterable: Iterable[T],
    *,
    backend: BackendSpec = ...,
    backend_options: Mapping[str, Any] | None = ...,
) -> Prefetched[T]: ...


def prefetch(
    iterable: Iterable[T],
    *,
    backend: BackendSpec = None,
    backend_options: Mapping[str, Any] | None = None,
) -> Prefetched[T]:
    """Prefetch the batches of any iterable through a backend.

    Works on an accelerate-prepared loader, a plain ``DataLoader``, a generator or any other
    iterable of batches, with :class:`~dataloaderx.DataLoaderX`'s guarantees: the same batches
    in the same order, the source's exceptions re-raised unchanged, nothing left running after
    the epoch ends, ``break`` or ``close()``. Both arguments are validated here; no thread
    starts until the first ``iter()``.

    Args:
        iterable: the batches; re-iterated once per epoch if it is re-iterable.
        backend: as for :class:`~dataloaderx.DataLoaderX`: a name, a mapping with a ``"name"``
            key plus options, or ``None`` for ``DATALOADERX_BACKEND``, else ``"thread"``.
        backend_options: options merged over those in a ``backend`` mapping.

    Returns:
        A :class:`SizedPrefetched` (with ``len()``) if ``iterable`` has a length, else a
        :class:`Prefetched`.
    """
    if not isinstance(iterable, Iterable):
        raise TypeError(
            "prefetch() needs an iterable of batches (a loader, a generator, ...), "
            f"got {iterable!r} ({type(iterable).__name__})"
        )
    resolved, common = resolve_backend(backend, backend_options)
    return _wrap(iterable, resolved, EpochStats(common.stats))


def _wrap(iterable: Iterable[T], backend: Backend, stats: EpochStats) -> Prefetched[T]:
    if isinstance(iterable, Sized):
        return SizedPrefetched(iterable, backend, stats)
    return Prefetched(iterable, backend, stats)
