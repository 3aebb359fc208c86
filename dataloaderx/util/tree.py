"""Apply a function to every tensor inside a nested batch, keeping its structure and types.
Containers: ``dict`` (subclasses too), other mappings, ``list``, ``tuple``, named tuples and
dataclass instances; anything else (strings, numbers, ``None``, numpy arrays, ...) is a leaf,
left as is. A container holding no tensor is returned unchanged, as the same object."""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch

TensorFn = Callable[[torch.Tensor], torch.Tensor]


def _children(value: object) -> list[Any] | None:
    """The parts of a container in a fixed order, or ``None`` if ``value`` is a leaf."""
    if isinstance(value, Mapping):
        return list(value.values())
    if isinstance(value, (list, tuple)):
        return list(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return [getattr(value, field.name) for field in dataclasses.fields(value)]
    return None


def _rebuild(value: Any, parts: list[Any]) -> Any:
    """A copy of container ``value`` of the same type whose children are ``parts``."""
    if isinstance(value, dict):
        if type(value) is dict:
            return dict(zip(value, parts, strict=True))
        copied = copy.copy(value)  # keeps the subclass and its state (a defaultdict's factory)
        for key, part in zip(value, parts, strict=True):
            copied[key] = part
        return copied
    if isinstance(value, Mapping):
        mapped = dict(zip(value, parts, strict=True))
        try:
            return type(value)(mapped)  # type: ignore[call-arg]
        except TypeError:  # a mapping type that cannot be built from a dict
            return mapped
    if isinstance(value, tuple):
        if hasattr(value, "_fields"):  # a named tuple
            return type(value)(*parts)
        return tuple(parts) if type(value) is tuple else type(value)(parts)
    if isinstance(value, list):
        if type(value) is list:
            return parts
        same_type = copy.copy(value)
        same_type[:] = parts
        return same_type
    out = copy.copy(value)  # a dataclass instance, frozen or not
    for field, part in zip(dataclasses.fields(value), parts, strict=True):
        object.__setattr__(out, field.name, part)
    return out


def map_tensors(fn: TensorFn, batch: Any) -> Any:
    """Return ``batch`` with every tensor ``t`` inside it replaced by ``fn(t)``."""
    if isinstance(batch, torch.Tensor):
        return fn(batch)
    parts = _children(batch)
    if parts is None:
        return batch
    mapped = [map_tensors(fn, part) for part in parts]
    if all(new is old for new, old in zip(mapped, parts, strict=True)):
        return batch
    return _rebuild(batch, mapped)


def iter_tensors(batch: Any) -> Iterator[torch.Tensor]:
    """Yield every tensor inside ``batch``, depth first, in container order."""
    if isinstance(batch, torch.Tensor):
        yield batch
        return
    for part in _children(batch) or ():
        yield from iter_tensors(part)
