"""``DataLoaderX.state_dict()`` and ``load_state_dict()``: resume an epoch where the loop left it.

Per epoch, :class:`ResumeTracker` keeps what reproduces the epoch's order (the states of
the generators the sampler and ``DataLoader`` draw from, taken as the epoch starts) and a
:class:`~dataloaderx._consumed.Position` counting the batches handed to the training
loop. A resumed map-style epoch reads its indices through :class:`ResumedIndices`, which
restores those states and drops the indices of the consumed batches without loading them.
"""

from __future__ import annotations

import copy
import warnings
from collections import deque
from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field
from itertools import chain, islice
from typing import Any, Final

import torch
from torch.utils.data import DataLoader, IterableDataset

from dataloaderx._consumed import Position, TrackedBackend
from dataloaderx.backends.base import Backend
from dataloaderx.errors import ResumeStateError

__all__ = ["STATE_FORMAT", "STATE_VERSION", "ResumeTracker", "ResumedIndices"]

#: The ``"format"`` entry of every state ``DataLoaderX.state_dict()`` returns.
STATE_FORMAT: Final = "dataloaderx.DataLoaderX"
#: The newest state layout this version reads and the one it writes.
STATE_VERSION: Final = 1
#: The key of torch's global CPU generator in a state's ``"rng"`` mapping.
GLOBAL_RNG: Final = "global"

_END: Final = object()


def _generators(loader: DataLoader[Any]) -> dict[str, torch.Generator]:
    """The distinct generators the loader's sampling draws from, by where they were found."""
    batch_sampler_sampler = getattr(loader.batch_sampler, "sampler", None)
    candidates = (
        ("loader", loader.generator),
        ("sampler", getattr(loader.sampler, "generator", None)),
        ("batch_sampler.sampler", getattr(batch_sampler_sampler, "generator", None)),
    )
    found: dict[str, torch.Generator] = {}
    for key, generator in candidates:
        if isinstance(generator, torch.Generator) and all(
            generator is not seen for seen in found.values()
        ):
            found[key] = generator
    return found


def _advanced_by_one_draw(state: torch.Tensor) -> torch.Tensor:
    """The generator state after ``DataLoader``'s iterator draws its base seed from ``state``."""
    generator = torch.Generator()
    generator.set_state(state)
    torch.empty((), dtype=torch.int64).random_(generator=generator)
    return generator.get_state()


def _global_rng(state: torch.Tensor | None) -> AbstractContextManager[Any]:
    """Run a block on torch's global CPU generator set to ``state``, then put it back."""
    if state is None:
        return nullcontext()
    return _forked_global_rng(state)


@contextmanager
def _forked_global_rng(state: torch.Tensor) -> Iterator[None]:
    with torch.random.fork_rng(devices=[]):
        torch.set_rng_state(state)
        yield


def _length(sized: Any) -> int | None:
    try:
        return len(sized)
    except TypeError:
        return None


def _kind(obj: object) -> str | None:
    return None if obj is None else f"{type(obj).__module__}.{type(obj).__qualname__}"


def fingerprint(loader: DataLoader[Any]) -> dict[str, Any]:
    """The loader arguments a state only makes sense with."""
    iterable = isinstance(loader.dataset, IterableDataset)
    found: dict[str, Any] = {
        "dataset": "iterable" if iterable else "map",
        "batch_size": loader.batch_size,
        "drop_last": loader.drop_last,
        "sampler": _kind(loader.sampler),
        "batch_sampler": _kind(loader.batch_sampler),
    }
    if iterable:
        found["num_workers"] = loader.num_workers
    else:
        found["dataset_length"] = _length(loader.dataset)
        found["batches_per_epoch"] = _length(loader)
    return found


def _dataset_keeps_state(loader: DataLoader[Any]) -> bool:
    dataset = loader.dataset
    return (
        loader.num_workers == 0
        and callable(getattr(dataset, "state_dict", None))
        and callable(getattr(dataset, "load_state_dict", None))
    )


class ResumedIndices:
    """The index sampler of a resumed map-style epoch.

    At its first index it sets the sampling generators to the states they had when the
    saved epoch's sampler started (torch's global generator only for that step, and
    put back afterwards), then draws and drops the indices of the ``skip`` consumed
    batches: the dataset is not read for them, and the generators advance exactly as in
    the uninterrupted epoch. ``len()`` is the number of batches left in the epoch.
    """

    def __init__(
        self,
        sampler: Any,
        skip: int,
        states: list[tuple[torch.Generator, torch.Tensor]],
        global_state: torch.Tensor | None,
    ) -> None:
        self.sampler = sampler
        self.skip = skip
        self._states = states
        self._global_state = global_state
        self._indices: Iterator[Any] | None = None

    def __len__(self) -> int:
        return max(0, len(self.sampler) - self.skip)

    def __iter__(self) -> Iterator[Any]:
        # A generator function: DataLoader calls iter() before it draws its base seed,
        # and the states must be restored after that draw.
        yield from self.start()

    def start(self) -> Iterator[Any]:
        """Restore the states and skip, once; return the iterator of the remaining indices."""
        if self._indices is None:
            with _global_rng(self._global_state):
                for generator, state in self._states:
                    generator.set_state(state)
                indices = iter(self.sampler)
                deque(islice(indices, self.skip), maxlen=0)
                first = next(indices, _END)
            self._indices = iter(()) if first is _END else chain((first,), indices)
        return self._indices


@dataclass
class _Plan:
    """A validated state, applied by the next ``iter(loader)``."""

    epoch: int
    consumed: int
    rng: dict[str, torch.Tensor]
    new_iterator: bool
    dataset_state: Any


@dataclass
class _Epoch:
    """The epoch in progress (or the latest one)."""

    index: int
    rng: dict[str, torch.Tensor]
    new_iterator: bool
    position: Position = field(default_factory=Position)


class ResumeTracker:
    """Everything ``DataLoaderX`` knows about its position; one per loader."""

    def __init__(self) -> None:
        self._epoch: _Epoch | None = None
        self._pending: _Plan | None = None
        self._indices: ResumedIndices | None = None
        self._making_iterator = False
        self._warned = False

    # -- iter(loader) ---------------------------------------------------------------

    def index_sampler(self, sampler: Any) -> Any:
        """What ``DataLoader`` iterates for indices: ``sampler``, or, while a resumed
        epoch's iterator is being made, the :class:`ResumedIndices` around it."""
        if self._making_iterator and self._indices is not None:
            return self._indices
        return sampler

    @contextmanager
    def epoch(self, loader: DataLoader[Any], backend: Backend) -> Iterator[Backend]:
        """Around ``DataLoader.__iter__``: start an epoch, or resume the loaded one.

        Yields ``backend`` wrapped to count the batches handed out.
        """
        plan, self._pending = self._pending, None
        previous = self._epoch
        reuses = self._reuses_iterator(loader)
        generators = _generators(loader)
        if plan is None:
            index = 0 if previous is None else previous.index + 1
            states = {key: generator.get_state() for key, generator in generators.items()}
            if loader.generator is None:
                states[GLOBAL_RNG] = torch.get_rng_state()
            epoch = _Epoch(index, states, new_iterator=not reuses)
        else:
            for key, generator in generators.items():
                generator.set_state(plan.rng[key])
            epoch = _Epoch(plan.epoch, plan.rng, plan.new_iterator, Position(plan.consumed))
        self._epoch = epoch
        tracked = self._track(loader, backend, plan, epoch.position)
        try:
            with _global_rng(None if plan is None else plan.rng.get(GLOBAL_RNG)):
                self._making_iterator = True
                iterator = getattr(loader, "_iterator", None)
                if reuses and iterator is not None:
                    # Persistent workers: DataLoader resets the iterator it keeps, which
                    # reads the index sampler it was made with; give it this epoch's.
                    iterator._index_sampler = loader._index_sampler
                yield tracked
                if self._indices is not None:
                    self._indices.start()  # here, in the loop's thread, after the base seed
        except BaseException:
            self._epoch, self._pending = previous, plan
            raise
        finally:
            self._making_iterator = False
            self._indices = None

    def _reuses_iterator(self, loader: DataLoader[Any]) -> bool:
        persistent = loader.persistent_workers and loader.num_workers > 0
        return persistent and getattr(loader, "_iterator", None) is not None

    def _track(
        self, loader: DataLoader[Any], backend: Backend, plan: _Plan | None, position: Position
    ) -> Backend:
        keeps_state = _dataset_keeps_state(loader)
        dataset: Any = loader.dataset
        snapshot = (lambda: copy.deepcopy(dataset.state_dict())) if keeps_state else None
        if plan is None:
            return TrackedBackend(backend, position, snapshot)
        if not isinstance(loader.dataset, IterableDataset):
            self._indices = self._resumed_indices(loader, plan)
            return TrackedBackend(backend, position, snapshot)
        if plan.dataset_state is not None and keeps_state:
            dataset.load_state_dict(plan.dataset_state)
            position.state = plan.dataset_state
            return TrackedBackend(backend, position, snapshot)
        if plan.consumed:
            self._warn_skipping(loader, plan.consumed, keeps_state)
        return TrackedBackend(backend, position, snapshot, skip=plan.consumed)

    def _resumed_indices(self, loader: DataLoader[Any], plan: _Plan) -> ResumedIndices:
        generators = _generators(loader)
        at_sampler_start = dict(plan.rng)
        # A new iterator draws its base seed from the loader's generator (or the global
        # one) before the sampler starts; an iterator of persistent workers does not.
        base_key = "loader" if loader.generator is not None else GLOBAL_RNG
        if plan.new_iterator and base_key in at_sampler_start:
            at_sampler_start[base_key] = _advanced_by_one_draw(at_sampler_start[base_key])
        states = [(generator, at_sampler_start[key]) for key, generator in generators.items()]
        sampler = DataLoader._index_sampler.fget(loader)  # type: ignore[attr-defined]
        return ResumedIndices(sampler, plan.consumed, states, at_sampler_start.get(GLOBAL_RNG))

    def _warn_skipping(self, loader: DataLoader[Any], consumed: int, keeps_state: bool) -> None:
        if self._warned:
            return
        self._warned = True
        name = type(loader.dataset).__name__
        why = (
            "it has state_dict()/load_state_dict() but num_workers > 0"
            if keeps_state or callable(getattr(loader.dataset, "state_dict", None))
            else "it has no state_dict()/load_state_dict()"
        )
        warnings.warn(
            f"resuming the IterableDataset {name} makes the {consumed} batches already "
            f"consumed again and discards them ({why}): resuming costs as long as loading "
            "them took. To resume without loading them, give the dataset state_dict() and "
            "load_state_dict() and use num_workers=0.",
            UserWarning,
            stacklevel=6,
        )

    # -- state_dict / load_state_dict ------------------------------------------------

    def state_dict(self, loader: DataLoader[Any]) -> dict[str, Any]:
        """The position after the last batch handed to the training loop."""
        if loader.num_workers > 0 and not loader.in_order:
            raise ValueError(
                "state_dict() needs in_order=True when num_workers > 0: with "
                "in_order=False batches reach the loop out of sampler order, so the count "
                "of consumed batches does not say which ones were consumed; build the "
                "loader with in_order=True (the default) to save and resume positions"
            )
        plan = self._pending or self._next_epoch_plan(loader)
        return {
            "format": STATE_FORMAT,
            "version": STATE_VERSION,
            "loader": fingerprint(loader),
            "epoch": plan.epoch,
            "consumed": plan.consumed,
            "rng": dict(plan.rng),
            "new_iterator": plan.new_iterator,
            "dataset_state": plan.dataset_state,
        }

    def _next_epoch_plan(self, loader: DataLoader[Any]) -> _Plan:
        epoch = self._epoch
        if epoch is not None and not epoch.position.finished:
            position = epoch.position
            return _Plan(
                epoch.index, position.consumed, epoch.rng, epoch.new_iterator, position.state
            )
        # Between epochs: the next one starts from the generators as they are now; the
        # global generator is the process's own until that epoch starts.
        states = {key: generator.get_state() for key, generator in _generators(loader).items()}
        index = 0 if epoch is None else epoch.index + 1
        return _Plan(index, 0, states, not self._reuses_iterator(loader), None)

    def load_state_dict(self, loader: DataLoader[Any], state: object) -> None:
        """Check ``state`` against ``loader``; the next ``iter(loader)`` resumes from it."""
        self._pending = parse_state(loader, state)


def _corrupt(key: str, expected: str, value: object) -> ResumeStateError:
    return ResumeStateError(
        f"the state's {key!r} must be {expected}, got {value!r} ({type(value).__name__}); "
        "the state is corrupt: load the mapping DataLoaderX.state_dict() returned"
    )


def _non_negative_int(state: Mapping[str, Any], key: str) -> int:
    value = state.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise _corrupt(key, "an int >= 0", value)
    return value


def _rng_states(value: object) -> dict[str, torch.Tensor]:
    if not isinstance(value, Mapping):
        raise _corrupt("rng", "a mapping of generator states", value)
    for key, state in value.items():
        if not isinstance(state, torch.Tensor) or state.dtype != torch.uint8:
            raise _corrupt(f"rng.{key}", "a uint8 tensor (a generator state)", state)
    return dict(value)


def _check_version(state: Mapping[str, Any]) -> None:
    version = state.get("version")
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise _corrupt("version", "an int >= 1", version)
    if version > STATE_VERSION:
        raise ResumeStateError(
            f"the state has format version {version}, newer than version {STATE_VERSION}, "
            "the newest this dataloaderx reads; upgrade dataloaderx to load it"
        )


def _check_fingerprint(loader: DataLoader[Any], saved: object) -> None:
    if not isinstance(saved, Mapping):
        raise _corrupt("loader", "a mapping of loader arguments", saved)
    current = fingerprint(loader)
    differences = [
        f"{key} (state: {saved.get(key)!r}, this loader: {current.get(key)!r})"
        for key in sorted(set(current) | set(saved))
        if saved.get(key) != current.get(key)
    ]
    if differences:
        raise ResumeStateError(
            "the state was saved by a loader with other arguments: "
            + "; ".join(differences)
            + ". Build the loader with the same dataset, batch_size, drop_last, sampler "
            "and batch_sampler as the one that saved the state"
        )


def _check_generators(loader: DataLoader[Any], rng: Mapping[str, torch.Tensor]) -> None:
    expected = set(_generators(loader))
    saved = set(rng) - {GLOBAL_RNG}
    if saved != expected or (GLOBAL_RNG in rng and loader.generator is not None):
        raise ResumeStateError(
            f"the state holds generator states for {sorted(rng)!r}, but this loader draws "
            f"from {sorted(expected) or ['the global generator']!r}; pass generator= (or "
            "none) to the loader and its sampler as in the loader that saved the state"
        )


def parse_state(loader: DataLoader[Any], state: object) -> _Plan:
    """Validate a state for ``loader``; raise :class:`ResumeStateError` naming the problem."""
    if not isinstance(state, Mapping):
        raise ResumeStateError(
            "load_state_dict() expects the mapping DataLoaderX.state_dict() returns, got "
            f"{type(state).__name__}"
        )
    if state.get("format") != STATE_FORMAT:
        raise ResumeStateError(
            f"not a DataLoaderX state: its 'format' is {state.get('format')!r}, expected "
            f"{STATE_FORMAT!r}; load the mapping DataLoaderX.state_dict() returned"
        )
    _check_version(state)
    _check_fingerprint(loader, state.get("loader"))
    epoch = _non_negative_int(state, "epoch")
    consumed = _non_negative_int(state, "consumed")
    batches = state["loader"].get("batches_per_epoch")
    if isinstance(batches, int) and consumed > batches:
        raise _corrupt("consumed", f"at most the {batches} batches of an epoch", consumed)
    rng = _rng_states(state.get("rng"))
    _check_generators(loader, rng)
    new_iterator = state.get("new_iterator")
    if not isinstance(new_iterator, bool):
        raise _corrupt("new_iterator", "a bool", new_iterator)
    return _Plan(epoch, consumed, rng, new_iterator, state.get("dataset_state"))
