"""``DataLoaderX.state_dict()`` and ``load_state_dict()``: resume an epoch where the loop left it
(``docs/design.md``, *Resume state*)."""

from __future__ import annotations

import copy
import warnings
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from itertools import chain, islice
from typing import Any, Final

import torch
from torch.utils.data import DataLoader, IterableDataset

from dataloaderx.epoch.position import Position, Tracking
from dataloaderx.resume.state import (
    GLOBAL_RNG,
    STATE_FORMAT,
    STATE_VERSION,
    Plan,
    fingerprint,
    parse_state,
    sampling_generators,
)

_END: Final = object()


def _advanced_by_one_draw(state: torch.Tensor) -> torch.Tensor:
    """The generator state after ``DataLoader``'s iterator draws its base seed from ``state``."""
    generator = torch.Generator()
    generator.set_state(state)
    torch.empty((), dtype=torch.int64).random_(generator=generator)
    return generator.get_state()


@contextmanager
def _global_rng(state: torch.Tensor | None) -> Iterator[None]:
    """Run a block on torch's global CPU generator set to ``state``, then put it back."""
    if state is None:
        yield
        return
    with torch.random.fork_rng(devices=[]):
        torch.set_rng_state(state)
        yield


class ResumedIndices:
    """The index sampler of a resumed map-style epoch (``len()``: the batches left). At its first
    index it sets the sampling generators to their states at the saved sampler start (torch's
    global one only for that step), then draws and drops the ``skip`` consumed batches' indices:
    the dataset is not read for them, and the generators advance as in the uninterrupted epoch."""

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
        # A generator: DataLoader calls iter() before it draws its base seed; restore after that.
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
        self._pending: Plan | None = None
        self._indices: ResumedIndices | None = None
        self._making_iterator = False
        self._warned = False

    def index_sampler(self, sampler: Any) -> Any:
        """What ``DataLoader`` iterates for indices: ``sampler``, or, while a resumed
        epoch's iterator is being made, the :class:`ResumedIndices` around it."""
        if self._making_iterator and self._indices is not None:
            return self._indices
        return sampler

    @contextmanager
    def epoch(self, loader: DataLoader[Any]) -> Iterator[Tracking]:
        """Around ``DataLoader.__iter__``: start an epoch, or resume the loaded one; yield what
        the epoch's iterator records for resuming it."""
        plan, self._pending = self._pending, None
        previous = self._epoch
        reuses = self._reuses_iterator(loader)
        generators = sampling_generators(loader)
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
        tracked = self._track(loader, plan, epoch.position)
        try:
            with _global_rng(None if plan is None else plan.rng.get(GLOBAL_RNG)):
                self._making_iterator = True
                iterator = loader._iterator
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

    def origin(self) -> tuple[int, int]:
        """The epoch under way (or starting): its index, and the batches it had handed out
        before it was resumed (0 for an epoch that was not)."""
        epoch = self._epoch
        return (0, 0) if epoch is None else (epoch.index, epoch.position.start)

    def _reuses_iterator(self, loader: DataLoader[Any]) -> bool:
        persistent = loader.persistent_workers and loader.num_workers > 0
        return persistent and loader._iterator is not None

    def _track(self, loader: DataLoader[Any], plan: Plan | None, position: Position) -> Tracking:
        dataset: Any = loader.dataset
        keeps_state = loader.num_workers == 0 and all(
            callable(getattr(dataset, name, None)) for name in ("state_dict", "load_state_dict")
        )
        snapshot = (lambda: copy.deepcopy(dataset.state_dict())) if keeps_state else None
        if plan is None:
            return Tracking(position, snapshot)
        if not isinstance(loader.dataset, IterableDataset):
            self._indices = self._resumed_indices(loader, plan)
        elif plan.dataset_state is not None and keeps_state:
            dataset.load_state_dict(plan.dataset_state)
            position.state = plan.dataset_state
        elif plan.consumed:
            self._warn_skipping(loader, plan.consumed, keeps_state)
            return Tracking(position, snapshot, skip=plan.consumed)
        return Tracking(position, snapshot)

    def _resumed_indices(self, loader: DataLoader[Any], plan: Plan) -> ResumedIndices:
        generators = sampling_generators(loader)
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

    def pending_workers(self) -> int | None:
        """The count of workers the loaded state's epoch ran with, where its batches
        depend on it (see :class:`Plan`), until the next epoch starts; else ``None``."""
        return None if self._pending is None else self._pending.workers

    def state_dict(self, loader: DataLoader[Any], workers: int | None = None) -> dict[str, Any]:
        """The position after the last batch handed to the training loop; ``workers``: the
        count the epoch under way runs with, where its batches depend on it."""
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
            "workers": plan.workers if self._pending else (workers if plan.consumed else None),
        }

    def _next_epoch_plan(self, loader: DataLoader[Any]) -> Plan:
        epoch = self._epoch
        if epoch is not None and not epoch.position.finished:
            position = epoch.position
            return Plan(
                epoch.index, position.consumed, epoch.rng, epoch.new_iterator, position.state
            )
        # Between epochs: the next one starts from the generators as they are now; the
        # global generator is the process's own until that epoch starts.
        generators = sampling_generators(loader)
        states = {key: generator.get_state() for key, generator in generators.items()}
        index = 0 if epoch is None else epoch.index + 1
        return Plan(index, 0, states, not self._reuses_iterator(loader), None)

    def load_state_dict(self, loader: DataLoader[Any], state: object) -> None:
        """Check ``state`` against ``loader``; the next ``iter(loader)`` resumes from it."""
        self._pending = parse_state(loader, state)
