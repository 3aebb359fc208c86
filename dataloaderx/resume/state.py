"""The layout and validation of a ``DataLoaderX`` resume state: plain data (ints, strings, bools,
dicts, generator states as ``uint8`` tensors) that ``torch.load(weights_only=True)`` reads."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

import torch
from torch.utils.data import DataLoader, IterableDataset

from dataloaderx.errors import ResumeStateError
from dataloaderx.workers.elastic.bounds import AUTO, AutoWorkers

#: The ``"format"`` entry of every state ``DataLoaderX.state_dict()`` returns.
STATE_FORMAT: Final = "dataloaderx.DataLoaderX"
#: The newest state layout this version reads and the one it writes.
STATE_VERSION: Final = 1
#: The key of torch's global CPU generator in a state's ``"rng"`` mapping.
GLOBAL_RNG: Final = "global"


def sampling_generators(loader: DataLoader[Any]) -> dict[str, torch.Generator]:
    """The distinct generators the loader's sampling draws from, by where they were found."""
    batch_sampler_sampler = getattr(loader.batch_sampler, "sampler", None)
    candidates = (
        ("loader", loader.generator),
        ("sampler", getattr(loader.sampler, "generator", None)),
        ("batch_sampler.sampler", getattr(batch_sampler_sampler, "generator", None)),
    )
    found: dict[str, torch.Generator] = {}
    for key, generator in candidates:
        if isinstance(generator, torch.Generator) and id(generator) not in map(id, found.values()):
            found[key] = generator
    return found


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
    if iterable:  # its shards follow the count ("auto": the count each epoch ran with)
        found["num_workers"] = (
            AUTO if isinstance(loader.num_workers, AutoWorkers) else int(loader.num_workers)
        )
    else:
        found["dataset_length"] = _length(loader.dataset)
        found["batches_per_epoch"] = _length(loader)
    return found


@dataclass
class Plan:
    """A validated state, applied by the next ``iter(loader)``."""

    epoch: int
    consumed: int
    rng: dict[str, torch.Tensor]
    new_iterator: bool
    dataset_state: Any
    #: The count of workers the epoch ran with, where its batches depend on it (an
    #: iterable dataset's shards, with ``num_workers="auto"``); else ``None``.
    workers: int | None = None


def _corrupt(key: str, expected: str, value: object) -> ResumeStateError:
    return ResumeStateError(
        f"the state's {key!r} must be {expected}, got {value!r} ({type(value).__name__}); "
        "the state is corrupt: load the mapping DataLoaderX.state_dict() returned"
    )


def _int_at_least(state: Mapping[str, Any], key: str, least: int) -> int:
    value = state.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise _corrupt(key, f"an int >= {least}", value)
    return value


def _rng_states(value: object) -> dict[str, torch.Tensor]:
    if not isinstance(value, Mapping):
        raise _corrupt("rng", "a mapping of generator states", value)
    for key, state in value.items():
        if not isinstance(state, torch.Tensor) or state.dtype != torch.uint8:
            raise _corrupt(f"rng.{key}", "a uint8 tensor (a generator state)", state)
    return dict(value)


def _check_version(state: Mapping[str, Any]) -> None:
    version = _int_at_least(state, "version", 1)
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
    expected = set(sampling_generators(loader))
    saved = set(rng) - {GLOBAL_RNG}
    if saved != expected or (GLOBAL_RNG in rng and loader.generator is not None):
        raise ResumeStateError(
            f"the state holds generator states for {sorted(rng)!r}, but this loader draws "
            f"from {sorted(expected) or ['the global generator']!r}; pass generator= (or "
            "none) to the loader and its sampler as in the loader that saved the state"
        )


def parse_state(loader: DataLoader[Any], state: object) -> Plan:
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
    epoch = _int_at_least(state, "epoch", 0)
    consumed = _int_at_least(state, "consumed", 0)
    batches = state["loader"].get("batches_per_epoch")
    if isinstance(batches, int) and consumed > batches:
        raise _corrupt("consumed", f"at most the {batches} batches of an epoch", consumed)
    rng = _rng_states(state.get("rng"))
    _check_generators(loader, rng)
    new_iterator = state.get("new_iterator")
    if not isinstance(new_iterator, bool):
        raise _corrupt("new_iterator", "a bool", new_iterator)
    workers = state.get("workers")
    if workers is not None:
        workers = _int_at_least(state, "workers", 1)
    return Plan(epoch, consumed, rng, new_iterator, state.get("dataset_state"), workers)
